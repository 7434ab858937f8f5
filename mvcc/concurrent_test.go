package mvcc

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/engine"
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

// commitOnSnapshot is an engine that runs before, once, just before it makes
// the next snapshot: a write that commits while a reader picks its state.
type commitOnSnapshot struct {
	engine.Engine
	before func()
}

func (e *commitOnSnapshot) NewSnapshot() engine.Snapshot {
	if f := e.before; f != nil {
		e.before = nil
		f()
	}
	return e.Engine.NewSnapshot()
}

// TestViewHasItsSnapshotsRevision: a Range's header revision is the
// revision of the snapshot it read, when a write commits between the
// reader's look at the store's revision and its snapshot. The snapshot then
// holds the write, and the header must say so: a header older than a
// returned mod_revision would make a client that watches from header+1 see
// that change twice.
func TestViewHasItsSnapshotsRevision(t *testing.T) {
	pe, err := epebble.Open("db", epebble.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	defer pe.Close()
	e := &commitOnSnapshot{Engine: pe}
	s, err := Open(e, Options{})
	if err != nil {
		t.Fatal(err)
	}
	put := func(index uint64, value string) {
		t.Helper()
		w := s.Write(nil)
		if _, err := w.Put(&pb.PutRequest{Key: []byte("foo"), Value: []byte(value)}); err != nil {
			t.Fatal(err)
		}
		if err := w.Commit(index); err != nil {
			t.Fatal(err)
		}
	}
	put(1, "a")
	for i, read := range []func() (*pb.ResponseHeader, []*mvccpb.KeyValue, error){
		func() (*pb.ResponseHeader, []*mvccpb.KeyValue, error) {
			resp, err := s.Range(&pb.RangeRequest{Key: []byte("foo")})
			return resp.GetHeader(), resp.GetKvs(), err
		},
		func() (*pb.ResponseHeader, []*mvccpb.KeyValue, error) {
			resp, err := s.ReadTxn(&pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("foo")}}}}})
			if err != nil {
				return nil, nil, err
			}
			return resp.GetHeader(), resp.GetResponses()[0].GetResponseRange().GetKvs(), nil
		},
	} {
		e.before = func() { put(uint64(i+2), fmt.Sprintf("v%d", i)) }
		header, kvs, err := read()
		if err != nil {
			t.Fatal(err)
		}
		if len(kvs) != 1 || string(kvs[0].Value) != fmt.Sprintf("v%d", i) {
			t.Fatalf("read %d: got %v; want the value written while the snapshot was made", i, kvs)
		}
		if header.GetRevision() != kvs[0].ModRevision || header.GetRevision() != s.Rev() {
			t.Errorf("read %d: header revision %d, mod_revision %d, store revision %d; want all equal",
				i, header.GetRevision(), kvs[0].ModRevision, s.Rev())
		}
	}
}
