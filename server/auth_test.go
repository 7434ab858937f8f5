package server

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/etcd/api/v3/authpb"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/strata-kv/strata/apply"
	"github.com/strata-kv/strata/auth"
	pebbleengine "github.com/strata-kv/strata/engine/pebble"
	"github.com/strata-kv/strata/mvcc"
)

// newAuthStore returns an auth store with auth on, root, and alice with
// read-write on [foo/, foo0).
func newAuthStore(t *testing.T) *auth.Store {
	t.Helper()
	e, err := pebbleengine.Open("engine", pebbleengine.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	s := auth.New(auth.Options{BcryptCost: bcrypt.MinCost})
	for i, r := range []*pb.InternalRaftRequest{
		{AuthUserAdd: &pb.AuthUserAddRequest{Name: "root", Options: &authpb.UserAddOptions{NoPassword: true}}},
		{AuthUserGrantRole: &pb.AuthUserGrantRoleRequest{User: "root", Role: "root"}},
		{AuthRoleAdd: &pb.AuthRoleAddRequest{Name: "r"}},
		{AuthRoleGrantPermission: &pb.AuthRoleGrantPermissionRequest{Name: "r", Perm: &authpb.Permission{
			PermType: authpb.Permission_READWRITE, Key: []byte("foo/"), RangeEnd: []byte("foo0")}}},
		{AuthUserAdd: &pb.AuthUserAddRequest{Name: "alice", Options: &authpb.UserAddOptions{NoPassword: true}}},
		{AuthUserGrantRole: &pb.AuthUserGrantRoleRequest{User: "alice", Role: "r"}},
		{AuthEnable: &pb.AuthEnableRequest{}},
	} {
		b := e.NewBatch()
		_, _, refused, err := s.Apply(b, r)
		if err != nil || refused != nil {
			t.Fatalf("setup %d: %v %v", i, err, refused)
		}
		if err := b.Commit(uint64(i + 1)); err != nil {
			t.Fatal(err)
		}
		b.Close()
	}
	return s
}

// TestCheckUnary checks the one place where calls are permitted.
func TestCheckUnary(t *testing.T) {
	s := newAuthStore(t)
	a := &Auth{s: s}
	alice := &auth.Info{Username: "alice", Revision: s.Revision()}
	root := &auth.Info{Username: "root", Revision: s.Revision()}
	put := func(k string, prev bool) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(k), PrevKv: prev}}}
	}
	cases := []struct {
		name   string
		method string
		req    any
		who    *auth.Info
		want   error
	}{
		{"range inside", "/etcdserverpb.KV/Range", &pb.RangeRequest{Key: []byte("foo/a")}, alice, nil},
		{"range prefix", "/etcdserverpb.KV/Range", &pb.RangeRequest{Key: []byte("foo/"), RangeEnd: []byte("foo0")}, alice, nil},
		{"range wider", "/etcdserverpb.KV/Range", &pb.RangeRequest{Key: []byte("fo"), RangeEnd: []byte("fp")}, alice, rpctypes.ErrGRPCPermissionDenied},
		{"range anonymous", "/etcdserverpb.KV/Range", &pb.RangeRequest{Key: []byte("foo/a")}, nil, rpctypes.ErrGRPCUserEmpty},
		{"range old revision", "/etcdserverpb.KV/Range", &pb.RangeRequest{Key: []byte("foo/a")}, &auth.Info{Username: "alice", Revision: 1}, rpctypes.ErrGRPCAuthOldRevision},
		{"put outside", "/etcdserverpb.KV/Put", &pb.PutRequest{Key: []byte("bar")}, alice, rpctypes.ErrGRPCPermissionDenied},
		{"delete inside", "/etcdserverpb.KV/DeleteRange", &pb.DeleteRangeRequest{Key: []byte("foo/a"), PrevKv: true}, alice, nil},
		{"txn nested denied", "/etcdserverpb.KV/Txn", &pb.TxnRequest{Success: []*pb.RequestOp{
			{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Failure: []*pb.RequestOp{put("bar", false)}}}},
		}}, alice, rpctypes.ErrGRPCPermissionDenied},
		{"txn inside", "/etcdserverpb.KV/Txn", &pb.TxnRequest{Success: []*pb.RequestOp{put("foo/b", true)}}, alice, nil},
		{"compact as user", "/etcdserverpb.KV/Compact", &pb.CompactionRequest{Revision: 2}, alice, rpctypes.ErrGRPCPermissionDenied},
		{"compact as root", "/etcdserverpb.KV/Compact", &pb.CompactionRequest{Revision: 2}, root, nil},
		{"member add as user", "/etcdserverpb.Cluster/MemberAdd", &pb.MemberAddRequest{}, alice, rpctypes.ErrGRPCPermissionDenied},
		{"member list as user", "/etcdserverpb.Cluster/MemberList", &pb.MemberListRequest{}, alice, nil},
		{"member list anonymous", "/etcdserverpb.Cluster/MemberList", &pb.MemberListRequest{}, nil, rpctypes.ErrGRPCUserEmpty},
		{"status as user", "/etcdserverpb.Maintenance/Status", &pb.StatusRequest{}, alice, nil},
		{"status anonymous", "/etcdserverpb.Maintenance/Status", &pb.StatusRequest{}, nil, rpctypes.ErrGRPCUserEmpty},
		{"alarm list as user", "/etcdserverpb.Maintenance/Alarm", &pb.AlarmRequest{Action: pb.AlarmRequest_GET}, alice, nil},
		{"alarm list anonymous", "/etcdserverpb.Maintenance/Alarm", &pb.AlarmRequest{Action: pb.AlarmRequest_GET}, nil, rpctypes.ErrGRPCUserEmpty},
		{"alarm clear as user", "/etcdserverpb.Maintenance/Alarm", &pb.AlarmRequest{Action: pb.AlarmRequest_DEACTIVATE}, alice, rpctypes.ErrGRPCPermissionDenied},
		{"alarm clear as root", "/etcdserverpb.Maintenance/Alarm", &pb.AlarmRequest{Action: pb.AlarmRequest_DEACTIVATE}, root, nil},
		{"defragment as user", "/etcdserverpb.Maintenance/Defragment", &pb.DefragmentRequest{}, alice, rpctypes.ErrGRPCPermissionDenied},
		{"user get self", "/etcdserverpb.Auth/UserGet", &pb.AuthUserGetRequest{Name: "alice"}, alice, nil},
		{"user get other", "/etcdserverpb.Auth/UserGet", &pb.AuthUserGetRequest{Name: "root"}, alice, rpctypes.ErrGRPCPermissionDenied},
		// etcd 3.7 needs root for it (e2e TestAuthLeaseAndTokensLikeEtcd).
		{"change own password", "/etcdserverpb.Auth/UserChangePassword", &pb.AuthUserChangePasswordRequest{Name: "alice"}, alice, rpctypes.ErrGRPCPermissionDenied},
		{"role get own role", "/etcdserverpb.Auth/RoleGet", &pb.AuthRoleGetRequest{Role: "r"}, alice, nil},
		{"role get other role", "/etcdserverpb.Auth/RoleGet", &pb.AuthRoleGetRequest{Role: "root"}, alice, rpctypes.ErrGRPCPermissionDenied},
		{"user add as user", "/etcdserverpb.Auth/UserAdd", &pb.AuthUserAddRequest{Name: "x"}, alice, rpctypes.ErrGRPCPermissionDenied},
		{"lease time-to-live without keys", "/etcdserverpb.Lease/LeaseTimeToLive", &pb.LeaseTimeToLiveRequest{ID: 1}, alice, nil},
		{"lease grant", "/etcdserverpb.Lease/LeaseGrant", &pb.LeaseGrantRequest{TTL: 10}, alice, nil},
	}
	for _, c := range cases {
		err := a.checkUnary(c.method, c.req, c.who)
		if err != nil {
			err = authError(err)
		}
		if !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
}

// TestAuthErrorCodes checks that every auth error reaches clients as
// etcd's gRPC error, never as Unknown.
func TestAuthErrorCodes(t *testing.T) {
	for _, m := range authErrors {
		got := toGRPCError(m.err)
		if got != m.grpc {
			t.Errorf("%v: mapped to %v, want %v", m.err, got, m.grpc)
		}
		if status.Code(got) == codes.Unknown {
			t.Errorf("%v: code Unknown", m.err)
		}
		// Wrapped errors map too (the applier wraps nothing today, but
		// errors.Is is the contract).
		if got := toGRPCError(errors.Join(errors.New("context"), m.err)); got != m.grpc {
			t.Errorf("wrapped %v: mapped to %v", m.err, got)
		}
	}
}

// TestUnknownOutcomeIsEtcdsTimeout: a request a snapshot install covered is
// answered with etcd's error for an outcome it cannot tell.
func TestUnknownOutcomeIsEtcdsTimeout(t *testing.T) {
	if got := toGRPCError(fmt.Errorf("put: %w", apply.ErrOutcomeUnknown)); got != rpctypes.ErrGRPCTimeout {
		t.Fatalf("ErrOutcomeUnknown mapped to %v, want %v", got, rpctypes.ErrGRPCTimeout)
	}
}

// barrierBackend records ReadBarrier calls; the rest of Backend is nil and
// must not be called.
type barrierBackend struct {
	Backend
	barriers int
}

func (b *barrierBackend) ReadBarrier(context.Context) error { b.barriers++; return nil }

// TestAuthenticateAfterReadBarrier: Authenticate checks the auth state and
// the password only once the member has applied every write committed
// before the call, as etcd's does (linearizableReadNotify). Without the
// barrier a follower that had not yet applied an AuthEnable (or a password
// change) answered from its old state: "authentication is not enabled"
// right after auth was enabled, seen in TestAuthCluster (e2e).
func TestAuthenticateAfterReadBarrier(t *testing.T) {
	b := &barrierBackend{}
	s := auth.New(auth.Options{BcryptCost: bcrypt.MinCost}) // auth off, as on a follower behind
	a := NewAuth(b, s, Limits{RequestTimeout: time.Second, MaxRequestBytes: 1 << 20}, false, nil)
	_, err := a.Authenticate(context.Background(), &pb.AuthenticateRequest{Name: "alice", Password: "apw"})
	if !errors.Is(err, rpctypes.ErrGRPCAuthNotEnabled) {
		t.Fatalf("Authenticate with auth off: %v, want %v", err, rpctypes.ErrGRPCAuthNotEnabled)
	}
	if b.barriers != 1 {
		t.Fatalf("Authenticate answered after %d read barriers, want 1", b.barriers)
	}
}

// catchUpBackend is a member behind its cluster: its read barrier applies
// what was committed before the read (catchUp) and nothing else.
type catchUpBackend struct {
	Backend
	catchUp func()
}

func (b *catchUpBackend) ReadBarrier(context.Context) error {
	if b.catchUp != nil {
		b.catchUp()
		b.catchUp = nil
	}
	return nil
}

// TestLinearizableReadCheckedAfterBarrier: a linearizable read is checked
// against the auth state once the member has applied every write committed
// before it, as etcd checks after its read index. The check ran before the
// barrier, so a member that had not yet applied an acknowledged revoke of
// the user's permission answered the read.
func TestLinearizableReadCheckedAfterBarrier(t *testing.T) {
	s := newAuthStore(t)
	e, err := pebbleengine.Open("extra", pebbleengine.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	index := uint64(0)
	apply := func(r *pb.InternalRaftRequest) {
		t.Helper()
		b := e.NewBatch()
		defer b.Close()
		if _, _, refused, err := s.Apply(b, r); err != nil || refused != nil {
			t.Fatalf("apply %v: %v %v", r, err, refused)
		}
		index++
		if err := b.Commit(index); err != nil {
			t.Fatal(err)
		}
	}
	// bob has alice's role and a password, so that he can hold a token.
	h, err := s.HashPassword("bpw")
	if err != nil {
		t.Fatal(err)
	}
	apply(&pb.InternalRaftRequest{AuthUserAdd: &pb.AuthUserAddRequest{Name: "bob", HashedPassword: h}})
	apply(&pb.InternalRaftRequest{AuthUserGrantRole: &pb.AuthUserGrantRoleRequest{User: "bob", Role: "r"}})
	tok, err := s.NewSimpleToken()
	if err != nil {
		t.Fatal(err)
	}
	apply(&pb.InternalRaftRequest{Authenticate: &pb.InternalAuthenticateRequest{Name: "bob", SimpleToken: tok}})
	for _, tc := range []struct {
		name string
		req  any
	}{
		{"range", &pb.RangeRequest{Key: []byte("foo/x")}},
		{"read-only txn", &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestRange{
			RequestRange: &pb.RangeRequest{Key: []byte("foo/x")}}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &catchUpBackend{catchUp: func() {
				apply(&pb.InternalRaftRequest{AuthRoleRevokePermission: &pb.AuthRoleRevokePermissionRequest{
					Role: "r", Key: []byte("foo/"), RangeEnd: []byte("foo0")}})
			}}
			a := NewAuth(b, s, Limits{RequestTimeout: time.Second, MaxRequestBytes: 1 << 20}, false, nil)
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(rpctypes.TokenFieldNameGRPC, tok))
			answered := false
			_, err := a.unary(ctx, tc.req, &grpc.UnaryServerInfo{FullMethod: "/etcdserverpb.KV/Range"},
				func(context.Context, any) (any, error) { answered = true; return nil, nil })
			if err == nil || answered {
				t.Fatalf("bob's linearizable read after his permission's revoke was committed: answered %v, err %v; want refused", answered, err)
			}
			// Give the permission back for the next case.
			apply(&pb.InternalRaftRequest{AuthRoleGrantPermission: &pb.AuthRoleGrantPermissionRequest{Name: "r",
				Perm: &authpb.Permission{PermType: authpb.Permission_READWRITE, Key: []byte("foo/"), RangeEnd: []byte("foo0")}}})
			tok2, err := s.NewSimpleToken()
			if err != nil {
				t.Fatal(err)
			}
			apply(&pb.InternalRaftRequest{Authenticate: &pb.InternalAuthenticateRequest{Name: "bob", SimpleToken: tok2}})
			tok = tok2
		})
	}
}

// storeBackend is a member whose read barrier applies what was committed
// before the read (catchUp) and whose store reports its applied index.
type storeBackend struct {
	Backend
	store   *mvcc.Store
	catchUp func()
}

func (b *storeBackend) Store() *mvcc.Store { return b.store }
func (b *storeBackend) ReadBarrier(context.Context) error {
	if b.catchUp != nil {
		b.catchUp()
		b.catchUp = nil
	}
	return nil
}

// TestTokenFromAMemberAhead: a simple token ends with the index of the
// entry that issued it; a member that does not know the token and has not
// applied that index waits for what is committed before it refuses the
// token, as etcd waits for the token's index. A client that logged in
// through one member and sent its next request (clientv3 opens each watch
// with a fresh token) to a member behind got "invalid auth token" (found by
// review).
func TestTokenFromAMemberAhead(t *testing.T) {
	s := newAuthStore(t)
	e, err := pebbleengine.Open("engine", pebbleengine.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	store, err := mvcc.Open(e, mvcc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// bob, with a password, as only such a user logs in.
	h, err := s.HashPassword("bpw")
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range []*pb.InternalRaftRequest{{AuthUserAdd: &pb.AuthUserAddRequest{Name: "bob", HashedPassword: h}},
		{AuthUserGrantRole: &pb.AuthUserGrantRoleRequest{User: "bob", Role: "r"}}} {
		tb := e.NewBatch()
		if _, _, refused, err := s.Apply(tb, r); err != nil || refused != nil {
			t.Fatalf("setup %d: %v %v", i, err, refused)
		}
		if err := tb.Commit(uint64(i + 1)); err != nil {
			t.Fatal(err)
		}
	}
	prefix, err := s.NewSimpleToken()
	if err != nil {
		t.Fatal(err)
	}
	token := auth.SimpleToken(prefix, 100) // issued at index 100, which this member has not applied
	if idx, ok := auth.SimpleTokenIndex(token); !ok || idx != 100 {
		t.Fatalf("SimpleTokenIndex(%q) = %d, %v", token, idx, ok)
	}
	b := &storeBackend{store: store, catchUp: func() {
		tb := e.NewBatch()
		defer tb.Close()
		if _, _, refused, err := s.Apply(tb, &pb.InternalRaftRequest{Authenticate: &pb.InternalAuthenticateRequest{
			Name: "bob", SimpleToken: token}}); err != nil || refused != nil {
			t.Fatalf("apply the authentication: %v %v", err, refused)
		}
	}}
	a := NewAuth(b, s, Limits{RequestTimeout: time.Second, MaxRequestBytes: 1 << 20}, false, nil)
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(rpctypes.TokenFieldNameGRPC, token))
	ai, err := a.callerInfo(ctx)
	if err != nil || ai == nil || ai.Username != "bob" {
		t.Fatalf("the token of a member ahead: %v, %v; want bob", ai, err)
	}
	// A token this member has applied past and does not know (expired,
	// forged) is refused at once, with no barrier.
	b.catchUp = func() { t.Fatal("a read barrier for a token from the past") }
	past := metadata.NewIncomingContext(context.Background(), metadata.Pairs(rpctypes.TokenFieldNameGRPC, auth.SimpleToken(prefix+"x", 0)))
	if _, err := a.callerInfo(past); !errors.Is(err, auth.ErrInvalidAuthToken) {
		t.Fatalf("an unknown token from the past: %v, want %v", err, auth.ErrInvalidAuthToken)
	}
}

// raceBackend applies what it is asked to propose to an auth store, after
// before() (an auth change committed ahead of the proposal).
type raceBackend struct {
	storeBackend
	s      *auth.Store
	e      *pebbleengine.Engine
	before func()
}

func (b *raceBackend) ClusterID() uint64 { return 1 }
func (b *raceBackend) MemberID() uint64  { return 1 }
func (b *raceBackend) Term() uint64      { return 1 }
func (b *raceBackend) Propose(_ context.Context, r *pb.InternalRaftRequest) (apply.Result, error) {
	if b.before != nil {
		b.before()
		b.before = nil
	}
	tb := b.e.NewBatch()
	defer tb.Close()
	resp, _, refused, err := b.s.Apply(tb, r)
	return apply.Result{Response: resp, Err: refused}, err
}

// TestAuthenticateChecksAgainAfterAChange: a password changed between
// Authenticate's password check and the apply of its token makes it check
// again, as etcd does, so the old password gets no token. The token was
// issued at the new auth revision, after the user's tokens were revoked,
// and so fully valid (found by review).
func TestAuthenticateChecksAgainAfterAChange(t *testing.T) {
	s := newAuthStore(t)
	e, err := pebbleengine.Open("engine", pebbleengine.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	store, err := mvcc.Open(e, mvcc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	applyNow := func(r *pb.InternalRaftRequest) {
		t.Helper()
		tb := e.NewBatch()
		defer tb.Close()
		if _, _, refused, err := s.Apply(tb, r); err != nil || refused != nil {
			t.Fatalf("apply %v: %v %v", r, err, refused)
		}
	}
	old, err := s.HashPassword("bpw")
	if err != nil {
		t.Fatal(err)
	}
	changed, err := s.HashPassword("new")
	if err != nil {
		t.Fatal(err)
	}
	applyNow(&pb.InternalRaftRequest{AuthUserAdd: &pb.AuthUserAddRequest{Name: "bob", HashedPassword: old}})
	b := &raceBackend{storeBackend: storeBackend{store: store}, s: s, e: e, before: func() {
		applyNow(&pb.InternalRaftRequest{AuthUserChangePassword: &pb.AuthUserChangePasswordRequest{Name: "bob", HashedPassword: changed}})
	}}
	a := NewAuth(b, s, Limits{RequestTimeout: time.Second, MaxRequestBytes: 1 << 20}, false, nil)
	resp, err := a.Authenticate(context.Background(), &pb.AuthenticateRequest{Name: "bob", Password: "bpw"})
	if code, _ := status.FromError(err); code.Code() != codes.InvalidArgument || resp != nil {
		t.Fatalf("Authenticate with the password changed meanwhile: %v, %v; want etcd's authentication failure", resp, err)
	}
}
