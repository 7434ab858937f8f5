package raftlog

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// TestPendingSnapshot: a recorded snapshot survives a reopen (and a power
// cut after BeginSnapshot returned), ApplySnapshot included, until
// ForgetPendingSnapshot drops it; the drop survives a power cut too.
func TestPendingSnapshot(t *testing.T) {
	meta := &raftpb.SnapshotMetadata{Index: proto.Uint64(40), Term: proto.Uint64(3),
		ConfState: &raftpb.ConfState{Voters: []uint64{1, 2, 3}}}
	for _, finish := range []string{"apply", "forget"} {
		t.Run(finish, func(t *testing.T) {
			mem := vfs.NewCrashableMem()
			l := openLog(t, mem, 1<<16)
			mustAppend(t, l, ents(1, 10, 1), hs(1, 1, 10))
			if l.PendingSnapshot() != nil {
				t.Fatal("a new log has a pending snapshot")
			}
			if err := l.BeginSnapshot(meta); err != nil {
				t.Fatal(err)
			}
			// A power cut right after BeginSnapshot: the record is durable.
			fs := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
			_ = l.Close()
			l = openLog(t, fs, 1<<16)
			if got := l.PendingSnapshot(); !proto.Equal(got, meta) {
				t.Fatalf("after a power cut, pending snapshot %v, want %v", got, meta)
			}
			if finish == "apply" {
				if err := l.ApplySnapshot(meta); err != nil {
					t.Fatal(err)
				}
				// The engine may still be past the log's end: the record
				// stays until the node drops it.
				if got := l.PendingSnapshot(); got.GetIndex() != meta.GetIndex() || got.GetTerm() != meta.GetTerm() {
					t.Fatalf("after ApplySnapshot, pending snapshot %v, want %v", got, meta)
				}
			}
			if err := l.ForgetPendingSnapshot(); err != nil {
				t.Fatal(err)
			}
			if l.PendingSnapshot() != nil {
				t.Fatalf("pending snapshot after %s and forget", finish)
			}
			fs2 := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
			_ = l.Close()
			l = openLog(t, fs2, 1<<16)
			defer l.Close()
			if got := l.PendingSnapshot(); got != nil {
				t.Fatalf("after %s and a power cut, pending snapshot %v", finish, got)
			}
			if finish == "apply" {
				if last, _ := l.LastIndex(); last != 40 {
					t.Fatalf("log restarted after the snapshot ends at %d, want 40", last)
				}
			}
		})
	}
}
