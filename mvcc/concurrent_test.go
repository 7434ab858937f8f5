package mvcc

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/proto"

	epebble "github.com/strata-kv/strata/engine/pebble"
)

// TestConcurrentReadsSeeImmutableHistory reads the key space at fixed
// revisions while the applier writes and physical compaction removes old
// versions: every successful read at a revision returns the same answer,
// until the revision is compacted (then ErrCompacted).
func TestConcurrentReadsSeeImmutableHistory(t *testing.T) {
	e, err := epebble.Open("db", epebble.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	s, err := Open(e, Options{CompactChunk: 3})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	defer s.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	write := func(n int) {
		for range n {
			w := s.Write(nil)
			for range 3 {
				key := fmt.Appendf(nil, "k%d", rng.IntN(20))
				if rng.IntN(3) == 0 {
					_, err = w.DeleteRange(&pb.DeleteRangeRequest{Key: key})
				} else {
					_, err = w.Put(&pb.PutRequest{Key: key, Value: fmt.Appendf(nil, "%d", rng.IntN(100))})
				}
				if err != nil {
					t.Error(err)
				}
			}
			if err := w.Commit(s.AppliedIndex() + 1); err != nil {
				t.Error(err)
			}
		}
	}
	write(50)
	revs := []int64{s.Rev() - 40, s.Rev() - 20, s.Rev()}
	var wg sync.WaitGroup
	for _, rev := range revs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var first *pb.RangeResponse
			for range 200 {
				resp, err := s.Range(&pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: rev})
				if errors.Is(err, ErrCompacted) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				resp.Header = nil
				if first == nil {
					first = resp
				} else if !proto.Equal(first, resp) {
					t.Errorf("range at %d changed:\n%v\n%v", rev, first, resp)
					return
				}
			}
		}()
	}
	for _, c := range []int64{revs[0] - 5, revs[0], revs[1] + 3} {
		write(10)
		w := s.Write(nil)
		if _, _, err := w.Compact(&pb.CompactionRequest{Revision: c}); err != nil {
			t.Error(err)
		}
		if err := w.Commit(s.AppliedIndex() + 1); err != nil {
			t.Error(err)
		}
	}
	wg.Wait()
}
