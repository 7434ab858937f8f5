package apply

import (
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/etcd/api/v3/authpb"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/auth"
	pebbleengine "github.com/strata-kv/strata/engine/pebble"
	"github.com/strata-kv/strata/lease"
	"github.com/strata-kv/strata/logcompact"
	"github.com/strata-kv/strata/mvcc"
)

// authMember is a store with its auth store and applier, as a member
// wires them; auth is reopened from the engine, as at a restart.
type authMember struct {
	eng     *pebbleengine.Engine
	store   *mvcc.Store
	auth    *auth.Store
	applier *Applier
}

func newAuthMember(t *testing.T) *authMember {
	t.Helper()
	eng, err := pebbleengine.Open("engine", pebbleengine.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	store, err := mvcc.Open(eng, mvcc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = store.Close()
		_ = eng.Close()
	})
	m := &authMember{eng: eng, store: store}
	m.reopen(t)
	return m
}

// reopen builds the member's auth store and applier anew over its engine.
func (m *authMember) reopen(t *testing.T) {
	t.Helper()
	var err error
	if m.auth, err = auth.Open(auth.Flags{}, m.eng, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	if m.applier, err = New(Config{Store: m.store, Lessor: lease.New(lease.Config{}), Auth: m.auth}); err != nil {
		t.Fatal(err)
	}
}

func (m *authMember) apply(t *testing.T, entries []*raftpb.Entry) {
	t.Helper()
	(&member{store: m.store, applier: m.applier}).apply(t, rand.New(rand.NewPCG(1, 1)), entries)
}

// TestReplaySkipsRefusedLeaseRequests: a lease grant or revocation that
// the live applier refused (an alarm, or auth) changed nothing, and the
// replay of a compacted batch that kept it must change nothing either;
// before, replay wrote every kept grant and dropped the record of every
// kept revocation, whatever its outcome had been.
func TestReplaySkipsRefusedLeaseRequests(t *testing.T) {
	nopw := &authpb.UserAddOptions{NoPassword: true}
	put := func(k string, lease int64) *pb.InternalRaftRequest {
		return &pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte(k), Value: []byte("v"), Lease: lease}}
	}
	alarm := func(typ pb.AlarmType) *pb.InternalRaftRequest {
		return &pb.InternalRaftRequest{Alarm: &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: 1, Alarm: typ}}
	}
	// Auth on: alice may write only under "a"; root may write anything.
	authOn := []*pb.InternalRaftRequest{
		{AuthUserAdd: &pb.AuthUserAddRequest{Name: "root", Options: nopw}},
		{AuthRoleAdd: &pb.AuthRoleAddRequest{Name: "root"}},
		{AuthUserGrantRole: &pb.AuthUserGrantRoleRequest{User: "root", Role: "root"}},
		{AuthUserAdd: &pb.AuthUserAddRequest{Name: "alice", Options: nopw}},
		{AuthRoleAdd: &pb.AuthRoleAddRequest{Name: "ra"}},
		{AuthRoleGrantPermission: &pb.AuthRoleGrantPermissionRequest{Name: "ra", Perm: &authpb.Permission{PermType: authpb.Permission_READWRITE, Key: []byte("a"), RangeEnd: []byte("b")}}},
		{AuthUserGrantRole: &pb.AuthUserGrantRoleRequest{User: "alice", Role: "ra"}},
		{AuthEnable: &pb.AuthEnableRequest{}},
	}
	as := func(user string, rev uint64, r *pb.InternalRaftRequest) *pb.InternalRaftRequest {
		r.Header = &pb.RequestHeader{Username: user, AuthRevision: rev}
		return r
	}
	for _, tc := range []struct {
		name  string
		setup []*pb.InternalRaftRequest // applied by both members; not compactable
		// run is compacted into one batch (given the auth revision after setup).
		run func(authRev uint64) []*pb.InternalRaftRequest
	}{
		{name: "grant under CORRUPT", setup: []*pb.InternalRaftRequest{alarm(pb.AlarmType_CORRUPT)},
			run: func(uint64) []*pb.InternalRaftRequest {
				return []*pb.InternalRaftRequest{{LeaseGrant: &pb.LeaseGrantRequest{ID: 7, TTL: 60}}}
			}},
		{name: "grant under NOSPACE", setup: []*pb.InternalRaftRequest{alarm(pb.AlarmType_NOSPACE)},
			run: func(uint64) []*pb.InternalRaftRequest {
				return []*pb.InternalRaftRequest{{LeaseGrant: &pb.LeaseGrantRequest{ID: 7, TTL: 60}}}
			}},
		{name: "revoke under CORRUPT",
			setup: []*pb.InternalRaftRequest{{LeaseGrant: &pb.LeaseGrantRequest{ID: 7, TTL: 60}}, alarm(pb.AlarmType_CORRUPT)},
			run: func(uint64) []*pb.InternalRaftRequest {
				return []*pb.InternalRaftRequest{{LeaseRevoke: &pb.LeaseRevokeRequest{ID: 7}}}
			}},
		{name: "revoke by a user without write access to the lease's keys", setup: authOn,
			run: func(rev uint64) []*pb.InternalRaftRequest {
				return []*pb.InternalRaftRequest{
					as("root", rev, &pb.InternalRaftRequest{LeaseGrant: &pb.LeaseGrantRequest{ID: 7, TTL: 60}}),
					as("root", rev, put("z", 7)),
					as("alice", rev, &pb.InternalRaftRequest{LeaseRevoke: &pb.LeaseRevokeRequest{ID: 7}}),
					as("alice", rev, put("a1", 0)),
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			full, m := newAuthMember(t), newAuthMember(t)
			var entries []*raftpb.Entry
			for _, r := range tc.setup {
				entries = append(entries, normal(t, uint64(len(entries)+1), r))
			}
			full.apply(t, entries)
			setupLen := len(entries)
			for _, r := range tc.run(full.auth.Revision()) {
				entries = append(entries, normal(t, uint64(len(entries)+1), r))
			}
			full.apply(t, entries[setupLen:])
			want := stateOf(t, full.store, true)

			b, err := logcompact.Build(full.store, entries[setupLen:], full.store.CompactRev())
			if err != nil {
				t.Fatalf("build the run's batch: %v", err)
			}
			m.apply(t, entries[:setupLen])
			// Recovery, as member.Open runs it: an applier with no lessor
			// over the state the engine holds.
			m.reopen(t)
			recovering, err := New(Config{Store: m.store, Auth: m.auth})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := logcompact.Replay(recovering, []*logcompact.Batch{b}, logcompact.RecoveryNaive, m.store.CompactRev(), 0); err != nil {
				t.Fatal(err)
			}
			if got := stateOf(t, m.store, true); got != want {
				t.Fatalf("replayed batch:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}
