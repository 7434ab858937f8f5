package auth

import (
	"crypto/rand"
	"errors"
	"fmt"
	"math/big"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	jwt "github.com/golang-jwt/jwt/v5"
)

// SimpleTokenTTL is etcd's default --auth-token-ttl.
const SimpleTokenTTL = 300 * time.Second

// TokenProvider issues and checks tokens.
//
// Concurrency: every method is safe from any goroutine.
type TokenProvider interface {
	// NewSimpleToken returns a random token for an Authenticate request to
	// carry through raft, or "" if the provider does not use one.
	NewSimpleToken() (string, error)
	// Assign returns the token for info once its Authenticate request is
	// applied; simple is what NewSimpleToken returned on the proposer.
	Assign(simple string, info Info) (string, error)
	// Info returns who a token identifies, if it is valid. Its Revision is
	// the auth revision the token speaks for: the one it was issued at for
	// a token that carries it (JWT), 0 for one that speaks for the current
	// revision whenever it is used (simple, as in etcd).
	Info(token string) (Info, bool)
	// Revoke forgets the tokens of user ("" for every user).
	Revoke(user string)
	// Reset forgets every token (the state was replaced).
	Reset()
}

// SimpleTokens are etcd's "simple" tokens: random strings that every member
// learns when the Authenticate request is applied, valid for TTL after
// their last use. They live in memory only: a restarted member forgets them
// and clients authenticate again. A simple token speaks for the auth
// revision current when it is used, as etcd's does: an auth change that
// is not its user's leaves it valid (its requests are checked against the
// permissions as they stand then, and again when applied).
type SimpleTokens struct {
	ttl time.Duration
	now func() time.Time

	mu     sync.Mutex
	tokens map[string]simpleToken // guarded by mu
	// swept is len(tokens) after the last sweep of expired tokens; the
	// next sweep runs when the map has doubled, so a token that is never
	// used again costs amortized O(1) to drop. Guarded by mu.
	swept int
}

type simpleToken struct {
	info     Info
	deadline time.Time
}

// NewSimpleTokens returns a simple-token provider; now is the clock (nil:
// time.Now).
func NewSimpleTokens(ttl time.Duration, now func() time.Time) *SimpleTokens {
	if now == nil {
		now = time.Now
	}
	return &SimpleTokens{ttl: ttl, now: now, tokens: map[string]simpleToken{}}
}

const tokenLetters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

// NewSimpleToken implements TokenProvider: 16 random letters, the token's
// prefix; the applier completes it with the Authenticate entry's index
// (SimpleToken), in etcd's shape.
func (t *SimpleTokens) NewSimpleToken() (string, error) {
	var b strings.Builder
	for range 16 {
		n, err := rand.Int(rand.Reader, big.NewInt(int64(len(tokenLetters))))
		if err != nil {
			return "", fmt.Errorf("generate token: %w", err)
		}
		b.WriteByte(tokenLetters[n.Int64()])
	}
	return b.String(), nil
}

// SimpleToken is the simple token an Authenticate request issues: its
// prefix (NewSimpleToken), a dot and the raft index of its entry, as etcd
// shapes it. A member that does not know a token whose index it has not
// applied yet waits for that index before it refuses the token (the client
// logged in through a member ahead of it).
func SimpleToken(prefix string, index uint64) string {
	return prefix + "." + strconv.FormatUint(index, 10)
}

// SimpleTokenIndex returns the raft index a simple token ends with.
func SimpleTokenIndex(token string) (uint64, bool) {
	i := strings.LastIndexByte(token, '.')
	if i < 0 || strings.Count(token, ".") != 1 {
		return 0, false // a JWT has two dots; not a simple token
	}
	index, err := strconv.ParseUint(token[i+1:], 10, 64)
	return index, err == nil
}

// Assign implements TokenProvider.
func (t *SimpleTokens) Assign(simple string, info Info) (string, error) {
	if simple == "" {
		return "", errors.New("simple token missing from the Authenticate request")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if len(t.tokens) >= 2*max(t.swept, 64) {
		for k, tok := range t.tokens {
			if !now.Before(tok.deadline) {
				delete(t.tokens, k)
			}
		}
		t.swept = len(t.tokens)
	}
	t.tokens[simple] = simpleToken{info: Info{Username: info.Username}, deadline: now.Add(t.ttl)}
	return simple, nil
}

// Info implements TokenProvider; a use extends the token's life by TTL, as
// in etcd.
func (t *SimpleTokens) Info(token string) (Info, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tok, ok := t.tokens[token]
	if !ok {
		return Info{}, false
	}
	now := t.now()
	if !now.Before(tok.deadline) {
		delete(t.tokens, token)
		return Info{}, false
	}
	tok.deadline = now.Add(t.ttl)
	t.tokens[token] = tok
	return tok.info, true
}

// Revoke implements TokenProvider.
func (t *SimpleTokens) Revoke(user string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, tok := range t.tokens {
		if user == "" || tok.info.Username == user {
			delete(t.tokens, k)
		}
	}
}

// Reset implements TokenProvider.
func (t *SimpleTokens) Reset() { t.Revoke("") }

// JWTTokens are signed JSON web tokens carrying the user name and auth
// revision (claims "username" and "revision", as etcd's), valid until
// their "exp". Any member holding the public key can check them.
type JWTTokens struct {
	method  jwt.SigningMethod
	signKey any // nil: this member only verifies
	verKey  any
	ttl     time.Duration
	now     func() time.Time
}

// ParseTokenOptions builds the provider named by etcd's --auth-token value
// ("simple", or "jwt,pub-key=PATH,priv-key=PATH,sign-method=RS256,ttl=5m")
// and --auth-token-ttl (seconds, for simple tokens).
func ParseTokenOptions(spec string, simpleTTL time.Duration) (TokenProvider, error) {
	parts := strings.Split(spec, ",")
	switch parts[0] {
	case "", "simple":
		if simpleTTL <= 0 {
			simpleTTL = SimpleTokenTTL
		}
		return NewSimpleTokens(simpleTTL, nil), nil
	case "jwt":
	default:
		return nil, fmt.Errorf("--auth-token: unknown token type %q (want simple or jwt)", parts[0])
	}
	opts := map[string]string{}
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return nil, fmt.Errorf("--auth-token: option %q is not key=value", p)
		}
		switch k {
		case "pub-key", "priv-key", "sign-method", "ttl":
		default:
			return nil, fmt.Errorf("--auth-token: unknown option %q", k)
		}
		opts[k] = v
	}
	ttl := 5 * time.Minute
	if v := opts["ttl"]; v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return nil, fmt.Errorf("--auth-token: ttl: %w", err)
		}
		ttl = d
	}
	return NewJWTTokens(opts["sign-method"], opts["pub-key"], opts["priv-key"], ttl, nil)
}

// NewJWTTokens returns a JWT provider that signs with method (RS*, PS*,
// ES*, EdDSA with PEM key files; HS* with the private-key file's bytes as
// the secret). pubKey is required (except for HS*); privKey is optional,
// a member without it only verifies.
func NewJWTTokens(method, pubKeyPath, privKeyPath string, ttl time.Duration, now func() time.Time) (*JWTTokens, error) {
	m := jwt.GetSigningMethod(method)
	if m == nil {
		return nil, fmt.Errorf("--auth-token: unknown sign-method %q", method)
	}
	if now == nil {
		now = time.Now
	}
	t := &JWTTokens{method: m, ttl: ttl, now: now}
	read := func(path string) ([]byte, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("--auth-token: read key: %w", err)
		}
		return b, nil
	}
	if strings.HasPrefix(method, "HS") {
		if privKeyPath == "" {
			return nil, errors.New("--auth-token: HS sign methods need priv-key (the shared secret)")
		}
		secret, err := read(privKeyPath)
		if err != nil {
			return nil, err
		}
		t.signKey, t.verKey = secret, secret
		return t, nil
	}
	if pubKeyPath == "" {
		return nil, errors.New("--auth-token: jwt needs pub-key")
	}
	pub, err := read(pubKeyPath)
	if err != nil {
		return nil, err
	}
	var priv []byte
	if privKeyPath != "" {
		if priv, err = read(privKeyPath); err != nil {
			return nil, err
		}
	}
	switch {
	case strings.HasPrefix(method, "RS"), strings.HasPrefix(method, "PS"):
		if t.verKey, err = jwt.ParseRSAPublicKeyFromPEM(pub); err == nil && priv != nil {
			t.signKey, err = jwt.ParseRSAPrivateKeyFromPEM(priv)
		}
	case strings.HasPrefix(method, "ES"):
		if t.verKey, err = jwt.ParseECPublicKeyFromPEM(pub); err == nil && priv != nil {
			t.signKey, err = jwt.ParseECPrivateKeyFromPEM(priv)
		}
	case method == "EdDSA":
		if t.verKey, err = jwt.ParseEdPublicKeyFromPEM(pub); err == nil && priv != nil {
			t.signKey, err = jwt.ParseEdPrivateKeyFromPEM(priv)
		}
	default:
		err = fmt.Errorf("unsupported sign-method %q", method)
	}
	if err != nil {
		return nil, fmt.Errorf("--auth-token: %w", err)
	}
	return t, nil
}

// NewSimpleToken implements TokenProvider: JWTs need none.
func (t *JWTTokens) NewSimpleToken() (string, error) { return "", nil }

// Assign implements TokenProvider.
func (t *JWTTokens) Assign(_ string, info Info) (string, error) {
	if t.signKey == nil {
		return "", errors.New("this member has no JWT private key (priv-key) to sign tokens with")
	}
	tok := jwt.NewWithClaims(t.method, jwt.MapClaims{
		"username": info.Username,
		"revision": info.Revision,
		"exp":      t.now().Add(t.ttl).Unix(),
	})
	s, err := tok.SignedString(t.signKey)
	if err != nil {
		return "", fmt.Errorf("sign token: %w", err)
	}
	return s, nil
}

// Info implements TokenProvider.
func (t *JWTTokens) Info(token string) (Info, bool) {
	claims := jwt.MapClaims{}
	_, err := jwt.ParseWithClaims(token, claims, func(*jwt.Token) (any, error) { return t.verKey, nil },
		jwt.WithValidMethods([]string{t.method.Alg()}), jwt.WithTimeFunc(t.now), jwt.WithExpirationRequired())
	if err != nil {
		return Info{}, false
	}
	user, ok1 := claims["username"].(string)
	rev, ok2 := claims["revision"].(float64)
	if !ok1 || !ok2 || user == "" {
		return Info{}, false
	}
	return Info{Username: user, Revision: uint64(rev)}, true
}

// Revoke implements TokenProvider: a JWT stays valid until it expires, but
// every change that would revoke one also raises the auth revision, which
// voids it.
func (t *JWTTokens) Revoke(string) {}

// Reset implements TokenProvider.
func (t *JWTTokens) Reset() {}
