package snapshot

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/engine/engines"
	"github.com/strata-kv/strata/mvcc"
)

// openStore opens the default engine and a store on it in a new directory.
func openStore(t *testing.T) (engine.Transferable, *mvcc.Store) {
	t.Helper()
	e, err := engines.Open("", filepath.Join(t.TempDir(), "db"), engines.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	s, err := mvcc.Open(e, mvcc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return e, s
}

// TestFullSnapshotSentTwice: a full snapshot received twice at one index
// (its first transfer failed after the table was staged, and the leader
// sent it again) installs. Both transfers once wrote one file name, and
// staging the second removed the table it had just written as the one it
// replaced: the install then failed, which stops the member.
func TestFullSnapshotSentTwice(t *testing.T) {
	le, ls := openStore(t)
	w := ls.Write(nil)
	if _, err := w.Put(&pb.PutRequest{Key: []byte("foo"), Value: []byte("bar")}); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(5); err != nil {
		t.Fatal(err)
	}
	leader := NewSnapshotter(Config{Engine: le, Store: ls})
	fe, fs := openStore(t)
	snapDir := filepath.Join(t.TempDir(), "snap")
	follower := NewSnapshotter(Config{Dir: snapDir, FS: vfs.Default, Engine: fe, Store: fs})

	snap := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: proto.Uint64(5), Term: proto.Uint64(2),
		ConfState: &raftpb.ConfState{}}}
	msg := &raftpb.Message{Snapshot: snap}
	for range 2 {
		rc, err := leader.openFull(5, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := follower.Receive(msg, rc); err != nil {
			t.Fatal(err)
		}
		_ = rc.Close()
	}
	if _, err := follower.Install(snap); err != nil {
		t.Fatalf("Install after the snapshot was received twice: %v", err)
	}
	resp, err := fs.Range(&pb.RangeRequest{Key: []byte("foo")})
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "bar" {
		t.Fatalf("after the install, Range foo = %v, %v; want bar", resp, err)
	}
	if names, _ := os.ReadDir(snapDir); len(names) != 0 {
		t.Fatalf("%d files left in the snapshot directory after the install, want 0", len(names))
	}
}

// TestLeftoverSnapshotTablesRemoved: a table a crashed process left in the
// snapshot directory (received, staged in memory only, or ingested and not
// yet removed) is removed when the next one starts; it could be as large as
// the whole store.
func TestLeftoverSnapshotTablesRemoved(t *testing.T) {
	snapDir := t.TempDir()
	left := filepath.Join(snapDir, "0000000000000002-0000000000000005-1.sst")
	if err := os.WriteFile(left, []byte("a table"), 0o600); err != nil {
		t.Fatal(err)
	}
	NewSnapshotter(Config{Dir: snapDir, FS: vfs.Default})
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Fatalf("the leftover table is still there (%v)", err)
	}
}
