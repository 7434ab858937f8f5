package mvcc

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	epebble "github.com/strata-kv/strata/engine/pebble"
)

// TestCompactPause: with CompactPause (--compaction-sleep-interval),
// physical revision compaction of 10 keys waits between its CompactChunk steps
// (--compaction-batch-limit) and still finishes.
func TestCompactPause(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pause   time.Duration
		atLeast time.Duration
	}{
		{name: "no pause"},
		{name: "20ms between chunks", pause: 20 * time.Millisecond, atLeast: 4 * 20 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := epebble.Open("db", epebble.Options{FS: vfs.NewMem()})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			s, err := Open(e, Options{CompactChunk: 2, CompactPause: tc.pause})
			if err != nil {
				t.Fatal(err)
			}
			s.Start()
			defer s.Close()
			for i := range 10 {
				w := s.Write(nil)
				if _, err := w.Put(&pb.PutRequest{Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "%d", i)}); err != nil {
					t.Fatal(err)
				}
				if err := w.Commit(s.AppliedIndex() + 1); err != nil {
					t.Fatal(err)
				}
			}
			start := time.Now()
			w := s.Write(nil)
			_, done, err := w.Compact(&pb.CompactionRequest{Revision: s.Rev()})
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Commit(s.AppliedIndex() + 1); err != nil {
				t.Fatal(err)
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("compaction did not finish")
			}
			if took := time.Since(start); took < tc.atLeast {
				t.Errorf("compaction of 10 revisions in chunks of 2 took %v, want at least %v", took, tc.atLeast)
			}
		})
	}
}
