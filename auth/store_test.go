package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/etcd/api/v3/authpb"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"golang.org/x/crypto/bcrypt"

	"github.com/strata-kv/strata/engine"
	pebbleengine "github.com/strata-kv/strata/engine/pebble"
)

// env is a store over an in-memory engine, applying each request in a
// batch of its own as the applier would.
type env struct {
	t     *testing.T
	e     engine.Engine
	s     *Store
	index uint64
}

func newEnv(t *testing.T, tokens TokenProvider) *env {
	t.Helper()
	e, err := pebbleengine.Open("engine", pebbleengine.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return &env{t: t, e: e, s: New(Options{BcryptCost: bcrypt.MinCost, Tokens: tokens})}
}

func (v *env) apply(r *pb.InternalRaftRequest) (any, error) {
	v.t.Helper()
	b := v.e.NewBatch()
	defer b.Close()
	resp, handled, refused, err := v.s.Apply(b, r)
	if err != nil {
		v.t.Fatalf("apply %v: %v", r, err)
	}
	if !handled {
		v.t.Fatalf("apply %v: not handled", r)
	}
	v.index++
	if err := b.Commit(v.index); err != nil {
		v.t.Fatal(err)
	}
	return resp, refused
}

func (v *env) hash(pw string) string {
	h, err := v.s.HashPassword(pw)
	if err != nil {
		v.t.Fatal(err)
	}
	return h
}

func perm(typ authpb.Permission_Type, key, end string) *authpb.Permission {
	p := &authpb.Permission{PermType: typ, Key: []byte(key)}
	if end != "" {
		p.RangeEnd = []byte(end)
	}
	return p
}

// TestApplyRules runs etcd's management rules in order on one store.
func TestApplyRules(t *testing.T) {
	v := newEnv(t, nil)
	steps := []struct {
		name string
		req  *pb.InternalRaftRequest
		want error
	}{
		{"enable without root", &pb.InternalRaftRequest{AuthEnable: &pb.AuthEnableRequest{}}, ErrRootUserNotExist},
		{"add root", &pb.InternalRaftRequest{AuthUserAdd: &pb.AuthUserAddRequest{Name: "root", HashedPassword: v.hash("rootpw")}}, nil},
		{"add root again", &pb.InternalRaftRequest{AuthUserAdd: &pb.AuthUserAddRequest{Name: "root", HashedPassword: v.hash("x")}}, ErrUserAlreadyExist},
		{"add empty user", &pb.InternalRaftRequest{AuthUserAdd: &pb.AuthUserAddRequest{}}, ErrUserEmpty},
		{"enable without root role", &pb.InternalRaftRequest{AuthEnable: &pb.AuthEnableRequest{}}, ErrRootRoleNotExist},
		{"grant missing role", &pb.InternalRaftRequest{AuthUserGrantRole: &pb.AuthUserGrantRoleRequest{User: "root", Role: "nope"}}, ErrRoleNotFound},
		{"grant root role (implicit)", &pb.InternalRaftRequest{AuthUserGrantRole: &pb.AuthUserGrantRoleRequest{User: "root", Role: "root"}}, nil},
		{"add role r", &pb.InternalRaftRequest{AuthRoleAdd: &pb.AuthRoleAddRequest{Name: "r"}}, nil},
		{"add role r again", &pb.InternalRaftRequest{AuthRoleAdd: &pb.AuthRoleAddRequest{Name: "r"}}, ErrRoleAlreadyExist},
		{"grant perm", &pb.InternalRaftRequest{AuthRoleGrantPermission: &pb.AuthRoleGrantPermissionRequest{Name: "r", Perm: perm(authpb.Permission_READWRITE, "foo", "fop")}}, nil},
		{"grant perm to missing role", &pb.InternalRaftRequest{AuthRoleGrantPermission: &pb.AuthRoleGrantPermissionRequest{Name: "x", Perm: perm(authpb.Permission_READ, "a", "")}}, ErrRoleNotFound},
		{"grant perm without key", &pb.InternalRaftRequest{AuthRoleGrantPermission: &pb.AuthRoleGrantPermissionRequest{Name: "r", Perm: perm(authpb.Permission_READ, "", "")}}, ErrInvalidAuthMgmt},
		{"grant perm without key, missing role", &pb.InternalRaftRequest{AuthRoleGrantPermission: &pb.AuthRoleGrantPermissionRequest{Name: "x", Perm: perm(authpb.Permission_READ, "", "b")}}, ErrInvalidAuthMgmt},
		{"grant perm with end before key", &pb.InternalRaftRequest{AuthRoleGrantPermission: &pb.AuthRoleGrantPermissionRequest{Name: "r", Perm: perm(authpb.Permission_READ, "b", "a")}}, ErrInvalidAuthMgmt},
		{"grant perm with end equal to key", &pb.InternalRaftRequest{AuthRoleGrantPermission: &pb.AuthRoleGrantPermissionRequest{Name: "r", Perm: perm(authpb.Permission_READ, "b", "b")}}, ErrInvalidAuthMgmt},
		{"grant perm from key on", &pb.InternalRaftRequest{AuthRoleGrantPermission: &pb.AuthRoleGrantPermissionRequest{Name: "r", Perm: perm(authpb.Permission_READ, "b", "\x00")}}, nil},
		{"grant perm without role and without perm", &pb.InternalRaftRequest{AuthRoleGrantPermission: &pb.AuthRoleGrantPermissionRequest{Name: "x"}}, ErrPermissionNotGiven},
		{"add alice", &pb.InternalRaftRequest{AuthUserAdd: &pb.AuthUserAddRequest{Name: "alice", HashedPassword: v.hash("apw")}}, nil},
		{"grant r to alice", &pb.InternalRaftRequest{AuthUserGrantRole: &pb.AuthUserGrantRoleRequest{User: "alice", Role: "r"}}, nil},
		{"revoke ungranted role", &pb.InternalRaftRequest{AuthUserRevokeRole: &pb.AuthUserRevokeRoleRequest{Name: "alice", Role: "root"}}, ErrRoleNotGranted},
		{"revoke ungranted perm", &pb.InternalRaftRequest{AuthRoleRevokePermission: &pb.AuthRoleRevokePermissionRequest{Role: "r", Key: []byte("zz")}}, ErrPermissionNotGranted},
		{"enable", &pb.InternalRaftRequest{AuthEnable: &pb.AuthEnableRequest{}}, nil},
		{"enable again", &pb.InternalRaftRequest{AuthEnable: &pb.AuthEnableRequest{}}, nil},
		{"delete root while enabled", &pb.InternalRaftRequest{AuthUserDelete: &pb.AuthUserDeleteRequest{Name: "root"}}, ErrInvalidAuthMgmt},
		{"revoke root role while enabled", &pb.InternalRaftRequest{AuthUserRevokeRole: &pb.AuthUserRevokeRoleRequest{Name: "root", Role: "root"}}, ErrInvalidAuthMgmt},
		{"delete missing user", &pb.InternalRaftRequest{AuthUserDelete: &pb.AuthUserDeleteRequest{Name: "bob"}}, ErrUserNotFound},
		{"add no-password user", &pb.InternalRaftRequest{AuthUserAdd: &pb.AuthUserAddRequest{Name: "np", Options: &authpb.UserAddOptions{NoPassword: true}}}, nil},
		{"authenticate no-password user", &pb.InternalRaftRequest{Authenticate: &pb.InternalAuthenticateRequest{Name: "np", SimpleToken: "t.1"}}, ErrAuthFailed},
		{"authenticate alice", &pb.InternalRaftRequest{Authenticate: &pb.InternalAuthenticateRequest{Name: "alice", SimpleToken: "tok.2"}}, nil},
	}
	for _, st := range steps {
		_, err := v.apply(st.req)
		if !errors.Is(err, st.want) || (st.want == nil && err != nil) {
			t.Fatalf("%s: got %v, want %v", st.name, err, st.want)
		}
	}
	if err := v.s.CheckPassword("alice", "apw"); err != nil {
		t.Errorf("alice's password: %v", err)
	}
	if err := v.s.CheckPassword("alice", "wrong"); !errors.Is(err, ErrAuthFailed) {
		t.Errorf("wrong password: %v", err)
	}
	info, err := v.s.TokenInfo("tok.2")
	if err != nil || info.Username != "alice" || info.Revision != v.s.Revision() {
		t.Fatalf("token info %+v %v, revision %d", info, err, v.s.Revision())
	}

	// The state survives a reload from the engine.
	rev := v.s.Revision()
	s2 := New(Options{})
	if err := s2.Load(v.e); err != nil {
		t.Fatal(err)
	}
	if !s2.Enabled() || s2.Revision() != rev {
		t.Fatalf("reloaded: enabled %v revision %d, want true %d", s2.Enabled(), s2.Revision(), rev)
	}
	if err := s2.IsPutPermitted(&Info{Username: "alice", Revision: rev}, []byte("foo1")); err != nil {
		t.Errorf("alice put foo1 after reload: %v", err)
	}
	list, err := s2.Read(&pb.InternalRaftRequest{AuthUserList: &pb.AuthUserListRequest{}})
	if err != nil || strings.Join(list.(*pb.AuthUserListResponse).Users, ",") != "alice,np,root" {
		t.Errorf("user list %v %v", list, err)
	}

	// Deleting the role takes it from alice and raises the revision, which
	// voids her token.
	if _, err := v.apply(&pb.InternalRaftRequest{AuthRoleDelete: &pb.AuthRoleDeleteRequest{Role: "r"}}); err != nil {
		t.Fatal(err)
	}
	if err := v.s.IsPutPermitted(&info, []byte("foo1")); !errors.Is(err, ErrAuthOldRevision) {
		t.Errorf("old token after role delete: %v", err)
	}
	if _, err := v.s.TokenInfo("tok.2"); err != nil {
		t.Errorf("token itself should survive a role change: %v", err)
	}
	if err := v.s.IsPutPermitted(&Info{Username: "alice", Revision: v.s.Revision()}, []byte("foo1")); !errors.Is(err, ErrPermissionDenied) {
		t.Errorf("alice after role delete: %v", err)
	}
	// Changing the password voids the simple tokens.
	if _, err := v.apply(&pb.InternalRaftRequest{AuthUserChangePassword: &pb.AuthUserChangePasswordRequest{Name: "alice", HashedPassword: v.hash("new")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := v.s.TokenInfo("tok.2"); !errors.Is(err, ErrInvalidAuthToken) {
		t.Errorf("token after password change: %v", err)
	}
}

func TestPermissions(t *testing.T) {
	v := newEnv(t, nil)
	for _, r := range []*pb.InternalRaftRequest{
		{AuthUserAdd: &pb.AuthUserAddRequest{Name: "root", Options: &authpb.UserAddOptions{NoPassword: true}}},
		{AuthUserGrantRole: &pb.AuthUserGrantRoleRequest{User: "root", Role: "root"}},
		{AuthRoleAdd: &pb.AuthRoleAddRequest{Name: "r"}},
		{AuthRoleGrantPermission: &pb.AuthRoleGrantPermissionRequest{Name: "r", Perm: perm(authpb.Permission_READ, "a", "c")}},
		{AuthRoleGrantPermission: &pb.AuthRoleGrantPermissionRequest{Name: "r", Perm: perm(authpb.Permission_READWRITE, "c", "e")}},
		{AuthRoleGrantPermission: &pb.AuthRoleGrantPermissionRequest{Name: "r", Perm: perm(authpb.Permission_WRITE, "k", "")}},
		{AuthRoleGrantPermission: &pb.AuthRoleGrantPermissionRequest{Name: "r", Perm: perm(authpb.Permission_READ, "x", "\x00")}},
		{AuthUserAdd: &pb.AuthUserAddRequest{Name: "u", Options: &authpb.UserAddOptions{NoPassword: true}}},
		{AuthUserGrantRole: &pb.AuthUserGrantRoleRequest{User: "u", Role: "r"}},
		{AuthEnable: &pb.AuthEnableRequest{}},
	} {
		if _, err := v.apply(r); err != nil {
			t.Fatal(err)
		}
	}
	u := &Info{Username: "u", Revision: v.s.Revision()}
	root := &Info{Username: "root", Revision: v.s.Revision()}
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"read in first range", v.s.IsRangePermitted(u, []byte("b"), nil), nil},
		{"read across touching ranges", v.s.IsRangePermitted(u, []byte("a"), []byte("e")), nil},
		{"read past the end", v.s.IsRangePermitted(u, []byte("a"), []byte("f")), ErrPermissionDenied},
		{"read open range from x", v.s.IsRangePermitted(u, []byte("xyz"), []byte{0}), nil},
		{"read open range from w", v.s.IsRangePermitted(u, []byte("w"), []byte{0}), ErrPermissionDenied},
		// etcd refuses a range ending at or before its key to a user, even
		// inside the user's ranges (checkKeyInterval).
		{"read a range ending before its key", v.s.IsRangePermitted(u, []byte("c"), []byte("b")), ErrPermissionDenied},
		{"root reads a range ending before its key", v.s.IsRangePermitted(root, []byte("c"), []byte("b")), nil},
		{"write in read-only range", v.s.IsPutPermitted(u, []byte("b")), ErrPermissionDenied},
		{"write in readwrite range", v.s.IsPutPermitted(u, []byte("d")), nil},
		{"write single key", v.s.IsPutPermitted(u, []byte("k")), nil},
		{"write key after single key", v.s.IsPutPermitted(u, []byte("k0")), ErrPermissionDenied},
		{"read write-only key", v.s.IsRangePermitted(u, []byte("k"), nil), ErrPermissionDenied},
		{"delete range", v.s.IsDeleteRangePermitted(u, []byte("c"), []byte("e")), nil},
		{"admin as user", v.s.IsAdminPermitted(u), ErrPermissionDenied},
		{"admin as root", v.s.IsAdminPermitted(root), nil},
		{"root reads anything", v.s.IsRangePermitted(root, []byte{0}, []byte{0}), nil},
		{"no user", v.s.IsRangePermitted(nil, []byte("b"), nil), ErrUserEmpty},
		{"unknown user", v.s.IsRangePermitted(&Info{Username: "z", Revision: v.s.Revision()}, []byte("b"), nil), ErrPermissionDenied},
		// etcd's IsAdminPermitted names the missing user.
		{"admin as unknown user", v.s.IsAdminPermitted(&Info{Username: "z", Revision: v.s.Revision()}), ErrUserNotFound},
		{"old revision", v.s.IsRangePermitted(&Info{Username: "u", Revision: 1}, []byte("b"), nil), ErrAuthOldRevision},
		{"txn with a denied put", v.s.IsTxnPermitted(u, &pb.TxnRequest{
			Compare: []*pb.Compare{{Key: []byte("b")}},
			Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("b")}}}},
		}), ErrPermissionDenied},
		{"txn reads and writes allowed", v.s.IsTxnPermitted(u, &pb.TxnRequest{
			Compare: []*pb.Compare{{Key: []byte("b")}},
			Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("d"), PrevKv: true}}}},
		}), nil},
		{"put with prev_kv needs read", v.s.IsOpPermitted(u, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("k"), PrevKv: true}}}), ErrPermissionDenied},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.want) || (c.want == nil && c.err != nil) {
			t.Errorf("%s: got %v, want %v", c.name, c.err, c.want)
		}
	}
}

func TestSimpleTokenExpiry(t *testing.T) {
	now := time.Unix(1000, 0)
	tp := NewSimpleTokens(10*time.Second, func() time.Time { return now })
	tok, err := tp.NewSimpleToken()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tp.Assign(tok, Info{Username: "u", Revision: 3}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(9 * time.Second)
	if info, ok := tp.Info(tok); !ok || info.Username != "u" {
		t.Fatalf("token before TTL: %+v %v", info, ok)
	}
	// The use extended it by a TTL.
	now = now.Add(9 * time.Second)
	if _, ok := tp.Info(tok); !ok {
		t.Fatal("token used within TTL of its last use expired")
	}
	now = now.Add(10 * time.Second)
	if _, ok := tp.Info(tok); ok {
		t.Fatal("token valid after TTL without use")
	}
}

// TestSimpleTokenSweep checks that tokens never used again do not pile up.
func TestSimpleTokenSweep(t *testing.T) {
	now := time.Unix(1000, 0)
	tp := NewSimpleTokens(time.Second, func() time.Time { return now })
	for i := range 10000 {
		if _, err := tp.Assign(fmt.Sprintf("t.%d", i), Info{Username: "u"}); err != nil {
			t.Fatal(err)
		}
		now = now.Add(10 * time.Millisecond)
	}
	tp.mu.Lock()
	n := len(tp.tokens)
	tp.mu.Unlock()
	// At most 100 are live (1 s at 10 ms each); expired ones wait at most
	// until the map doubles.
	if n > 2*max(100, 64)+1 {
		t.Fatalf("%d tokens kept, want about 100 live ones", n)
	}
}

func TestJWT(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	privDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	privPath, pubPath := filepath.Join(dir, "priv.pem"), filepath.Join(dir, "pub.pem")
	if err := os.WriteFile(privPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: privDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	tp, err := ParseTokenOptions("jwt,pub-key="+pubPath+",priv-key="+privPath+",sign-method=ES256,ttl=1m", 0)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tp.Assign("", Info{Username: "alice", Revision: 7})
	if err != nil {
		t.Fatal(err)
	}
	if info, ok := tp.Info(tok); !ok || info != (Info{Username: "alice", Revision: 7}) {
		t.Fatalf("info %+v %v", info, ok)
	}
	if _, ok := tp.Info(tok[:len(tok)-2] + "xx"); ok {
		t.Fatal("forged signature accepted")
	}
	// A verify-only member (no private key) checks but cannot sign.
	verifier, err := ParseTokenOptions("jwt,pub-key="+pubPath+",sign-method=ES256", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := verifier.Info(tok); !ok {
		t.Fatal("verifier refused a valid token")
	}
	if _, err := verifier.Assign("", Info{Username: "a"}); err == nil {
		t.Fatal("verifier signed a token")
	}
	expired, err := NewJWTTokens("ES256", pubPath, privPath, time.Minute, func() time.Time { return time.Now().Add(-2 * time.Minute) })
	if err != nil {
		t.Fatal(err)
	}
	old, err := expired.Assign("", Info{Username: "alice", Revision: 7})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tp.Info(old); ok {
		t.Fatal("expired token accepted")
	}
	for _, bad := range []string{"jwt,sign-method=RS256", "jwt,pub-key=" + pubPath + ",sign-method=XX", "opaque", "jwt,foo=bar"} {
		if _, err := ParseTokenOptions(bad, 0); err == nil {
			t.Errorf("--auth-token %q accepted", bad)
		}
	}
}
