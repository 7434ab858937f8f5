package auth

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"go.etcd.io/etcd/api/v3/authpb"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/engine"
)

// Errors with etcd's meanings; server/ maps them to etcd's gRPC errors.
var (
	ErrRootUserNotExist     = errors.New("auth: root user does not exist")
	ErrRootRoleNotExist     = errors.New("auth: root user does not have root role")
	ErrUserAlreadyExist     = errors.New("auth: user already exists")
	ErrUserEmpty            = errors.New("auth: user name is empty")
	ErrUserNotFound         = errors.New("auth: user not found")
	ErrRoleAlreadyExist     = errors.New("auth: role already exists")
	ErrRoleNotFound         = errors.New("auth: role not found")
	ErrRoleEmpty            = errors.New("auth: role name is empty")
	ErrPermissionNotGiven   = errors.New("auth: permission not given")
	ErrAuthFailed           = errors.New("auth: authentication failed, invalid user ID or password")
	ErrNoPasswordUser       = errors.New("auth: authentication failed, password was given for no password user")
	ErrPermissionDenied     = errors.New("auth: permission denied")
	ErrRoleNotGranted       = errors.New("auth: role is not granted to the user")
	ErrPermissionNotGranted = errors.New("auth: permission is not granted to the role")
	ErrAuthNotEnabled       = errors.New("auth: authentication is not enabled")
	ErrAuthOldRevision      = errors.New("auth: revision in header is old")
	ErrInvalidAuthToken     = errors.New("auth: invalid auth token")
	ErrInvalidAuthMgmt      = errors.New("auth: invalid auth management")
)

// RootUser and RootRole are the names with etcd's special meaning.
const (
	RootUser = "root"
	RootRole = "root"
)

// Engine keys; see the package comment. These are on-disk format.
const (
	keyEnabled = "ae"
	prefixUser = "au"
	prefixRole = "ar"
)

// MaxNameSize returns the longest user or role name an engine whose keys
// are at most maxKeySize bytes can hold (engine.Engine.MaxKeySize; 0 means
// no limit, and so does the 0 returned for it). A name is a key suffix of
// the layout above.
func MaxNameSize(maxKeySize int) int {
	if maxKeySize <= 0 {
		return 0
	}
	return maxKeySize - max(len(prefixUser), len(prefixRole))
}

// Info identifies who makes a request: the user and the auth revision at
// which that was established (token issue, or certificate check).
type Info struct {
	Username string
	Revision uint64
}

// Options configure a Store.
type Options struct {
	// BcryptCost is the cost of password hashes (--bcrypt-cost); 0 means
	// bcrypt.DefaultCost.
	BcryptCost int
	// Tokens issues and checks tokens; nil means simple tokens with a
	// five-minute TTL.
	Tokens TokenProvider
	Logger *zap.Logger
}

// Store holds the auth state. See the package comment.
//
// Invariants: users and roles hold only what applied entries wrote; every
// change to them increases revision.
type Store struct {
	cost   int
	tokens TokenProvider
	logger *zap.Logger

	mu       sync.RWMutex
	enabled  bool                    // guarded by mu
	revision uint64                  // guarded by mu
	users    map[string]*authpb.User // guarded by mu
	roles    map[string]*authpb.Role // guarded by mu
}

// New returns an empty store; call Load to read the persisted state.
func New(opts Options) *Store {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.BcryptCost == 0 {
		opts.BcryptCost = bcrypt.DefaultCost
	}
	if opts.Tokens == nil {
		opts.Tokens = NewSimpleTokens(SimpleTokenTTL, nil)
	}
	return &Store{
		cost: opts.BcryptCost, tokens: opts.Tokens, logger: opts.Logger,
		users: map[string]*authpb.User{}, roles: map[string]*authpb.Role{},
		revision: initialRevision,
	}
}

// initialRevision is the auth revision of a store that has applied no auth
// change, as etcd's new auth store commits it: every revision etcd reports
// (auth status, a JWT's) is then the same number in strata.
const initialRevision = 1

// ValidateBcryptCost checks a --bcrypt-cost value as etcd does.
func ValidateBcryptCost(cost int) error {
	if cost < bcrypt.MinCost || cost > bcrypt.MaxCost {
		return fmt.Errorf("invalid bcrypt-cost %d: want %d..%d", cost, bcrypt.MinCost, bcrypt.MaxCost)
	}
	return nil
}

// State is the persistent auth state: what the engine holds, and what
// etcd's snapshot file holds in its auth buckets.
type State struct {
	Enabled  bool
	Revision uint64
	// Users and Roles are in name order.
	Users []*authpb.User
	Roles []*authpb.Role
}

// ReadState reads the auth state r holds.
func ReadState(r engine.Reader) (State, error) {
	st := State{Revision: initialRevision}
	raw, err := r.Get([]byte(keyEnabled))
	switch {
	case errors.Is(err, engine.ErrNotFound):
	case err != nil:
		return State{}, fmt.Errorf("read auth state: %w", err)
	case len(raw) != 9:
		return State{}, fmt.Errorf("read auth state: corrupt record of %d bytes", len(raw))
	default:
		st.Enabled, st.Revision = raw[0] == 1, binary.BigEndian.Uint64(raw[1:])
	}
	if err := scan(r, prefixUser, func(v []byte) error {
		u := &authpb.User{}
		if err := proto.Unmarshal(v, u); err != nil {
			return err
		}
		st.Users = append(st.Users, u)
		return nil
	}); err != nil {
		return State{}, fmt.Errorf("read auth users: %w", err)
	}
	if err := scan(r, prefixRole, func(v []byte) error {
		ro := &authpb.Role{}
		if err := proto.Unmarshal(v, ro); err != nil {
			return err
		}
		st.Roles = append(st.Roles, ro)
		return nil
	}); err != nil {
		return State{}, fmt.Errorf("read auth roles: %w", err)
	}
	return st, nil
}

// WriteState writes st into b, as the records a store that had applied
// the requests behind it would hold: how an etcd snapshot's auth state
// enters a new data directory. b must hold no auth records yet.
func WriteState(b engine.Batch, st State) error {
	c := &change{s: &Store{users: map[string]*authpb.User{}, roles: map[string]*authpb.Role{}}, b: b}
	for _, u := range st.Users {
		c.putUser(u)
	}
	for _, ro := range st.Roles {
		c.putRole(ro)
	}
	c.s.enabled, c.s.revision = st.Enabled, st.Revision
	c.writeState()
	return c.writeErr
}

// Load replaces the in-memory state with what r holds. Outstanding tokens
// are forgotten (their users may no longer exist).
func (s *Store) Load(r engine.Reader) error {
	st, err := ReadState(r)
	if err != nil {
		return err
	}
	users := map[string]*authpb.User{}
	for _, u := range st.Users {
		users[string(u.Name)] = u
	}
	roles := map[string]*authpb.Role{}
	for _, ro := range st.Roles {
		roles[string(ro.Name)] = ro
	}
	s.mu.Lock()
	s.enabled, s.revision, s.users, s.roles = st.Enabled, st.Revision, users, roles
	s.mu.Unlock()
	s.tokens.Reset()
	return nil
}

func scan(r engine.Reader, prefix string, f func(v []byte) error) error {
	upper := []byte(prefix)
	upper[len(upper)-1]++
	it := r.NewIter([]byte(prefix), upper)
	for ok := it.First(); ok; ok = it.Next() {
		if err := f(it.Value()); err != nil {
			it.Close()
			return fmt.Errorf("key %q: %w", it.Key(), err)
		}
	}
	return it.Close()
}

// Enabled reports whether authentication is on.
func (s *Store) Enabled() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.enabled
}

// Revision returns the auth revision.
func (s *Store) Revision() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.revision
}

// HashPassword hashes a password for a UserAdd or UserChangePassword
// request before it is proposed, in the form of etcd's hashedPassword
// field: the bcrypt hash, base64-encoded (a client may send one itself).
func (s *Store) HashPassword(password string) (string, error) {
	h, err := bcrypt.GenerateFromPassword([]byte(password), s.cost)
	if err != nil {
		return "", fmt.Errorf("hash password: %w", err)
	}
	return base64.StdEncoding.EncodeToString(h), nil
}

// decodeHash turns a request's hashedPassword into the stored bcrypt hash;
// etcd refuses a malformed one as a user without a password.
func decodeHash(hashed string) ([]byte, error) {
	h, err := base64.StdEncoding.DecodeString(hashed)
	if err != nil || len(h) == 0 {
		return nil, ErrNoPasswordUser
	}
	return h, nil
}

// CheckPassword verifies a user's password against the stored hash, before
// an Authenticate request is proposed (bcrypt is slow: not in the applier).
func (s *Store) CheckPassword(name, password string) error {
	s.mu.RLock()
	u := s.users[name]
	s.mu.RUnlock()
	if u == nil {
		return ErrAuthFailed
	}
	if u.Options != nil && u.Options.NoPassword {
		return ErrNoPasswordUser
	}
	if bcrypt.CompareHashAndPassword(u.Password, []byte(password)) != nil {
		return ErrAuthFailed
	}
	return nil
}

// NewSimpleToken returns a fresh token for an Authenticate request to carry
// through raft; empty unless the provider uses simple tokens.
func (s *Store) NewSimpleToken() (string, error) { return s.tokens.NewSimpleToken() }

// TokenInfo returns who a token belongs to. It fails with
// ErrInvalidAuthToken for an unknown, expired or forged token.
func (s *Store) TokenInfo(token string) (Info, error) {
	info, ok := s.tokens.Info(token)
	if !ok {
		return Info{}, ErrInvalidAuthToken
	}
	if info.Revision == 0 {
		info.Revision = s.Revision() // a simple token: the current revision
	}
	return info, nil
}

// CertInfo returns the identity of a client that presented a verified
// certificate with common name cn (--client-cert-auth).
func (s *Store) CertInfo(cn string) Info {
	return Info{Username: cn, Revision: s.Revision()}
}

// Apply applies one replicated auth request into b (the entry's engine
// batch). It reports whether r was an auth request at all; a refusal (an
// etcd error) is the returned error, decided identically on every member.
// A failure to write b is returned as writeErr and is fatal.
func (s *Store) Apply(b engine.Batch, r *pb.InternalRaftRequest) (resp proto.Message, handled bool, err, writeErr error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tx := &change{s: s, b: b}
	resp, err = tx.apply(r)
	if resp == nil && err == nil {
		return nil, false, nil, nil
	}
	if err != nil {
		return nil, true, err, nil
	}
	if tx.changed {
		s.revision++
	}
	if tx.changed || tx.flagOnly {
		tx.writeState()
	}
	if tx.writeErr != nil {
		return nil, true, nil, tx.writeErr
	}
	if tx.authenticated != "" {
		tok, err := s.tokens.Assign(tx.simpleToken, Info{Username: tx.authenticated, Revision: s.revision})
		if err != nil {
			// Only this member's client sees it; the state is unchanged.
			return nil, true, fmt.Errorf("assign token: %w", err), nil
		}
		resp.(*pb.AuthenticateResponse).Token = tok
	}
	for _, u := range tx.revokeTokens {
		s.tokens.Revoke(u)
	}
	return resp, true, nil, nil
}

// change is one Apply in progress. REQUIRES: s.mu held for writing.
type change struct {
	s             *Store
	b             engine.Batch
	changed       bool
	flagOnly      bool // only the enabled flag changed: no new revision
	writeErr      error
	authenticated string
	simpleToken   string
	revokeTokens  []string // users whose tokens are void
}

func (c *change) putUser(u *authpb.User) {
	c.s.users[string(u.Name)] = u
	c.changed = true
	raw, err := proto.Marshal(u)
	if err == nil {
		err = c.b.Set([]byte(prefixUser+string(u.Name)), raw)
	}
	if err != nil && c.writeErr == nil {
		c.writeErr = fmt.Errorf("write user %q: %w", u.Name, err)
	}
}

func (c *change) delUser(name string) {
	delete(c.s.users, name)
	c.changed = true
	if err := c.b.Delete([]byte(prefixUser + name)); err != nil && c.writeErr == nil {
		c.writeErr = fmt.Errorf("delete user %q: %w", name, err)
	}
}

func (c *change) putRole(ro *authpb.Role) {
	c.s.roles[string(ro.Name)] = ro
	c.changed = true
	raw, err := proto.Marshal(ro)
	if err == nil {
		err = c.b.Set([]byte(prefixRole+string(ro.Name)), raw)
	}
	if err != nil && c.writeErr == nil {
		c.writeErr = fmt.Errorf("write role %q: %w", ro.Name, err)
	}
}

func (c *change) delRole(name string) {
	delete(c.s.roles, name)
	c.changed = true
	if err := c.b.Delete([]byte(prefixRole + name)); err != nil && c.writeErr == nil {
		c.writeErr = fmt.Errorf("delete role %q: %w", name, err)
	}
}

// writeState records the enabled flag and the revision after a change.
func (c *change) writeState() {
	v := make([]byte, 9)
	if c.s.enabled {
		v[0] = 1
	}
	binary.BigEndian.PutUint64(v[1:], c.s.revision)
	if err := c.b.Set([]byte(keyEnabled), v); err != nil && c.writeErr == nil {
		c.writeErr = fmt.Errorf("write auth state: %w", err)
	}
}

func (c *change) apply(r *pb.InternalRaftRequest) (proto.Message, error) {
	s := c.s
	switch {
	case r.AuthEnable != nil:
		if s.enabled {
			return &pb.AuthEnableResponse{}, nil
		}
		root := s.users[RootUser]
		if root == nil {
			return nil, ErrRootUserNotExist
		}
		if !slices.Contains(root.Roles, RootRole) {
			return nil, ErrRootRoleNotExist
		}
		s.enabled = true
		// etcd writes the flag without a new auth revision (its
		// AuthDisable does count one).
		c.flagOnly = true
		return &pb.AuthEnableResponse{}, nil
	case r.AuthDisable != nil:
		if s.enabled {
			s.enabled = false
			c.changed = true
			c.revokeTokens = append(c.revokeTokens, "")
		}
		return &pb.AuthDisableResponse{}, nil
	case r.AuthStatus != nil:
		return &pb.AuthStatusResponse{Enabled: s.enabled, AuthRevision: s.revision}, nil
	case r.Authenticate != nil:
		u := s.users[r.Authenticate.Name]
		if u == nil || !s.enabled {
			return nil, ErrAuthFailed
		}
		if u.Options != nil && u.Options.NoPassword {
			return nil, ErrAuthFailed
		}
		c.authenticated, c.simpleToken = r.Authenticate.Name, r.Authenticate.SimpleToken
		return &pb.AuthenticateResponse{}, nil
	case r.AuthUserAdd != nil:
		q := r.AuthUserAdd
		if q.Name == "" {
			return nil, ErrUserEmpty
		}
		if s.users[q.Name] != nil {
			return nil, ErrUserAlreadyExist
		}
		u := &authpb.User{Name: []byte(q.Name), Options: q.Options}
		if q.Options == nil || !q.Options.NoPassword {
			h, err := decodeHash(q.HashedPassword)
			if err != nil {
				return nil, err
			}
			u.Password = h
		}
		c.putUser(u)
		return &pb.AuthUserAddResponse{}, nil
	case r.AuthUserDelete != nil:
		q := r.AuthUserDelete
		if s.enabled && q.Name == RootUser {
			return nil, ErrInvalidAuthMgmt
		}
		if s.users[q.Name] == nil {
			return nil, ErrUserNotFound
		}
		c.delUser(q.Name)
		c.revokeTokens = append(c.revokeTokens, q.Name)
		return &pb.AuthUserDeleteResponse{}, nil
	case r.AuthUserChangePassword != nil:
		q := r.AuthUserChangePassword
		old := s.users[q.Name]
		if old == nil {
			return nil, ErrUserNotFound
		}
		u := proto.CloneOf(old)
		if u.Options == nil || !u.Options.NoPassword {
			// A no-password user stays one, as in etcd: the new
			// password is ignored.
			h, err := decodeHash(q.HashedPassword)
			if err != nil {
				return nil, err
			}
			u.Password = h
		}
		c.putUser(u)
		c.revokeTokens = append(c.revokeTokens, q.Name)
		return &pb.AuthUserChangePasswordResponse{}, nil
	case r.AuthUserGrantRole != nil:
		q := r.AuthUserGrantRole
		old := s.users[q.User]
		if old == nil {
			return nil, ErrUserNotFound
		}
		if q.Role != RootRole && s.roles[q.Role] == nil {
			return nil, ErrRoleNotFound
		}
		if slices.Contains(old.Roles, q.Role) {
			return &pb.AuthUserGrantRoleResponse{}, nil
		}
		u := proto.CloneOf(old)
		u.Roles = append(u.Roles, q.Role)
		sort.Strings(u.Roles)
		c.putUser(u)
		return &pb.AuthUserGrantRoleResponse{}, nil
	case r.AuthUserGet != nil:
		u := s.users[r.AuthUserGet.Name]
		if u == nil {
			return nil, ErrUserNotFound
		}
		return &pb.AuthUserGetResponse{Roles: slices.Clone(u.Roles)}, nil
	case r.AuthUserList != nil:
		return &pb.AuthUserListResponse{Users: sortedKeys(s.users)}, nil
	case r.AuthUserRevokeRole != nil:
		q := r.AuthUserRevokeRole
		if s.enabled && q.Name == RootUser && q.Role == RootRole {
			return nil, ErrInvalidAuthMgmt
		}
		old := s.users[q.Name]
		if old == nil {
			return nil, ErrUserNotFound
		}
		i := slices.Index(old.Roles, q.Role)
		if i < 0 {
			return nil, ErrRoleNotGranted
		}
		u := proto.CloneOf(old)
		u.Roles = slices.Delete(u.Roles, i, i+1)
		c.putUser(u)
		return &pb.AuthUserRevokeRoleResponse{}, nil
	case r.AuthRoleAdd != nil:
		q := r.AuthRoleAdd
		if q.Name == "" {
			return nil, ErrRoleEmpty
		}
		if s.roles[q.Name] != nil {
			return nil, ErrRoleAlreadyExist
		}
		c.putRole(&authpb.Role{Name: []byte(q.Name)})
		return &pb.AuthRoleAddResponse{}, nil
	case r.AuthRoleGet != nil:
		ro := s.roles[r.AuthRoleGet.Role]
		if ro == nil {
			return nil, ErrRoleNotFound
		}
		if r.AuthRoleGet.Role == RootRole {
			// etcd shows root's implicit permission: read-write on all keys.
			return &pb.AuthRoleGetResponse{Perm: []*authpb.Permission{{
				PermType: authpb.Permission_READWRITE, Key: []byte{}, RangeEnd: []byte{0},
			}}}, nil
		}
		perms := make([]*authpb.Permission, len(ro.KeyPermission))
		for i, p := range ro.KeyPermission {
			perms[i] = proto.CloneOf(p)
		}
		return &pb.AuthRoleGetResponse{Perm: perms}, nil
	case r.AuthRoleList != nil:
		return &pb.AuthRoleListResponse{Roles: sortedKeys(s.roles)}, nil
	case r.AuthRoleDelete != nil:
		q := r.AuthRoleDelete
		if s.enabled && q.Role == RootRole {
			return nil, ErrInvalidAuthMgmt
		}
		if s.roles[q.Role] == nil {
			return nil, ErrRoleNotFound
		}
		c.delRole(q.Role)
		for _, name := range sortedKeys(s.users) {
			old := s.users[name]
			if i := slices.Index(old.Roles, q.Role); i >= 0 {
				u := proto.CloneOf(old)
				u.Roles = slices.Delete(u.Roles, i, i+1)
				c.putUser(u)
			}
		}
		return &pb.AuthRoleDeleteResponse{}, nil
	case r.AuthRoleGrantPermission != nil:
		q := r.AuthRoleGrantPermission
		// etcd's order: a missing permission, then an empty range, then the role.
		if q.Perm == nil {
			return nil, ErrPermissionNotGiven
		}
		if !validPermRange(q.Perm.Key, q.Perm.RangeEnd) {
			return nil, ErrInvalidAuthMgmt
		}
		old := s.roles[q.Name]
		if old == nil {
			return nil, ErrRoleNotFound
		}
		ro := proto.CloneOf(old)
		i, found := slices.BinarySearchFunc(ro.KeyPermission, q.Perm, comparePerm)
		if found {
			ro.KeyPermission[i].PermType = q.Perm.PermType
		} else {
			ro.KeyPermission = slices.Insert(ro.KeyPermission, i, proto.CloneOf(q.Perm))
		}
		c.putRole(ro)
		return &pb.AuthRoleGrantPermissionResponse{}, nil
	case r.AuthRoleRevokePermission != nil:
		q := r.AuthRoleRevokePermission
		old := s.roles[q.Role]
		if old == nil {
			return nil, ErrRoleNotFound
		}
		i, found := slices.BinarySearchFunc(old.KeyPermission, &authpb.Permission{Key: q.Key, RangeEnd: q.RangeEnd}, comparePerm)
		if !found {
			return nil, ErrPermissionNotGranted
		}
		ro := proto.CloneOf(old)
		ro.KeyPermission = slices.Delete(ro.KeyPermission, i, i+1)
		c.putRole(ro)
		return &pb.AuthRoleRevokePermissionResponse{}, nil
	}
	return nil, nil
}

// validPermRange reports whether a permission names at least one key: a
// non-empty key, and a range end that is absent (the key alone), "\x00" (every
// key from key on) or after the key. etcd refuses the others with
// ErrInvalidAuthMgmt; a permission over no key would never match a request.
func validPermRange(key, rangeEnd []byte) bool {
	if len(key) == 0 {
		return false
	}
	return len(rangeEnd) == 0 || bytes.Equal(rangeEnd, []byte{0}) || bytes.Compare(key, rangeEnd) < 0
}

// comparePerm orders a role's permissions by key, then range end, as etcd
// keeps them (one permission per key and range end).
func comparePerm(a, b *authpb.Permission) int {
	if c := bytes.Compare(a.Key, b.Key); c != 0 {
		return c
	}
	return bytes.Compare(a.RangeEnd, b.RangeEnd)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
