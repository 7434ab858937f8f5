package mvcc

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	epebble "github.com/strata-kv/strata/engine/pebble"
)

// TestCompactChunkEndsInsideTarget: physical compaction to a revision that
// wrote several keys (a Txn, a DeleteRange, a lease revocation), with a
// chunk ending among that revision's entries, finishes. The job counted as
// done once its progress reached the target's main revision, so it stopped
// there: the rest of the revision's keys kept their old versions and
// CompactDone (a client's physical Compact) never answered (found by
// review; about half of all 500-key DeleteRange targets at the default
// chunk).
func TestCompactChunkEndsInsideTarget(t *testing.T) {
	e, err := epebble.Open("db", epebble.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(e, Options{CompactChunk: 2})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() {
		_ = s.Close()
		_ = e.Close()
	})
	w := s.Write(nil)
	if _, err := w.Txn(&pb.TxnRequest{Success: []*pb.RequestOp{put("k0", "a"), put("k1", "a"), put("k2", "a")}}); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(1); err != nil {
		t.Fatal(err)
	}
	w = s.Write(nil)
	_, done, err := w.Compact(&pb.CompactionRequest{Revision: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(2); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		s.mu.Lock()
		job := s.mu.job
		s.mu.Unlock()
		t.Fatalf("physical compaction to 2 did not finish; job %+v", job)
	}
}
