package maintenance

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/engine/engines"
	"github.com/strata-kv/strata/etcddb"
	"github.com/strata-kv/strata/mvcc"
)

func confChangeEntry(t *testing.T, index uint64, typ raftpb.ConfChangeType, node uint64) *raftpb.Entry {
	t.Helper()
	raw, err := proto.Marshal(&raftpb.ConfChange{Type: typ.Enum(), NodeId: proto.Uint64(node)})
	if err != nil {
		t.Fatal(err)
	}
	return &raftpb.Entry{Index: proto.Uint64(index), Type: raftpb.EntryConfChange.Enum(), Data: raw}
}

func TestSoleVoter(t *testing.T) {
	one := &raftpb.ConfState{Voters: []uint64{7}}
	three := &raftpb.ConfState{Voters: []uint64{7, 8, 9}}
	put := &raftpb.Entry{Index: proto.Uint64(11), Type: raftpb.EntryNormal.Enum(), Data: []byte{1}}
	for _, c := range []struct {
		name  string
		cs    *raftpb.ConfState
		after uint64
		first uint64
		ents  []*raftpb.Entry
		want  bool
	}{
		{name: "one voter in the database", cs: one, after: 10, first: 1, ents: []*raftpb.Entry{put}, want: true},
		{name: "three voters", cs: three, after: 10, first: 1, ents: []*raftpb.Entry{put}},
		{name: "one voter, another member's WAL", cs: &raftpb.ConfState{Voters: []uint64{8}}, after: 10, first: 1},
		{name: "a member added in the WAL", cs: one, after: 10, first: 1,
			ents: []*raftpb.Entry{confChangeEntry(t, 11, raftpb.ConfChangeAddNode, 8)}},
		{name: "two removed in the WAL", cs: three, after: 10, first: 1,
			ents: []*raftpb.Entry{confChangeEntry(t, 11, raftpb.ConfChangeRemoveNode, 8), confChangeEntry(t, 12, raftpb.ConfChangeRemoveNode, 9)}, want: true},
		{name: "no conf state, the WAL from index 1 bootstraps one member", first: 1,
			ents: []*raftpb.Entry{confChangeEntry(t, 1, raftpb.ConfChangeAddNode, 7), put}, want: true},
		{name: "no conf state, the WAL from index 1 bootstraps three", first: 1,
			ents: []*raftpb.Entry{confChangeEntry(t, 1, raftpb.ConfChangeAddNode, 7), confChangeEntry(t, 2, raftpb.ConfChangeAddNode, 8),
				confChangeEntry(t, 3, raftpb.ConfChangeAddNode, 9)}},
		{name: "no conf state, the WAL's start purged", first: 5, ents: []*raftpb.Entry{put}},
		{name: "joint configuration", cs: &raftpb.ConfState{Voters: []uint64{7}, VotersOutgoing: []uint64{7, 8}}, after: 10, first: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := &etcddb.WAL{NodeID: 7, FirstIndex: c.first, Entries: c.ents}
			if got := soleVoter(c.cs, c.after, w); got != c.want {
				t.Errorf("soleVoter = %v, want %v", got, c.want)
			}
		})
	}
}

// TestReplayEtcdWALApplyErrorReturns: migrating an etcd data directory
// whose WAL holds an entry the applier cannot apply fails with an error;
// it hung, waiting for an index the failed applier would never reach
// (found by review).
func TestReplayEtcdWALApplyErrorReturns(t *testing.T) {
	eng, err := engines.Open(engines.Default, t.TempDir(), engines.Options{FS: vfs.Default, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	done := make(chan error, 1)
	go func() {
		_, err := replayEtcdWAL(RestoreConfig{Logger: zap.NewNop(), FS: vfs.Default}, eng, 0,
			[]*raftpb.Entry{{Index: proto.Uint64(1), Term: proto.Uint64(1), Type: raftpb.EntryNormal.Enum(), Data: []byte{0xff}}})
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("an undecodable entry replayed without an error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("replay still running 10 s after the applier failed")
	}
}

// TestReplayEtcdWALUnderAlarm: an etcd database whose NOSPACE alarm was
// raised, and a WAL entry after it that etcd's applier refused (a put
// accepted by a member below its quota while the alarm stood): the
// migration refuses it too, so the key is absent and no revision moves.
// The replay ran without the database's alarms, and applied it (found by
// review).
func TestReplayEtcdWALUnderAlarm(t *testing.T) {
	dir := t.TempDir()
	db, err := os.Create(filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	contents := etcddb.Contents{ConsistentIndex: 5, Term: 2, Revisions: mvcc.RevisionState{Rev: 1, CompactRev: -1},
		Alarms: []*pb.AlarmMember{{MemberID: 1, Alarm: pb.AlarmType_NOSPACE}}}
	if _, err := etcddb.Write(db, dir, contents, func(func(mvcc.KeyChange) error) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	eng, err := engines.Open(engines.Default, filepath.Join(dir, "stage"), engines.Options{FS: vfs.Default, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	cfg := RestoreConfig{Logger: zap.NewNop(), FS: vfs.Default}
	if _, _, err := restoreEtcd(cfg, db.Name(), eng, func(c *etcddb.Contents) uint64 { return c.ConsistentIndex }); err != nil {
		t.Fatal(err)
	}
	put, err := proto.Marshal(&pb.InternalRaftRequest{Header: &pb.RequestHeader{ID: 9}, Put: &pb.PutRequest{Key: []byte("k"), Value: []byte("v")}})
	if err != nil {
		t.Fatal(err)
	}
	last, err := replayEtcdWAL(cfg, eng, 5, []*raftpb.Entry{{Index: proto.Uint64(6), Term: proto.Uint64(2), Type: raftpb.EntryNormal.Enum(), Data: put}})
	if err != nil || last != 6 {
		t.Fatalf("replay: %d, %v", last, err)
	}
	store, err := mvcc.Open(eng, mvcc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	resp, err := store.Range(&pb.RangeRequest{Key: []byte("k")})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 || store.Rev() != 1 {
		t.Fatalf("after replaying a put etcd refused under NOSPACE: %v at revision %d; want no key, revision 1", resp.Kvs, store.Rev())
	}
}
