package mvcc

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/proto"

	epebble "github.com/strata-kv/strata/engine/pebble"
)

// TestCrashRecoversAppliedPrefix cuts power at random instants while
// batches are applied and physical compaction runs, and checks that the
// store reopens at some applied index A >= the durable index seen before
// the cut, with exactly the state (revision, compact revision, keys) it had
// after batch A.
func TestCrashRecoversAppliedPrefix(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { crashRun(t, seed) })
	}
}

type snapshotState struct {
	rev, compactRev int64
	all             *pb.RangeResponse
}

func crashRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	fs := vfs.NewCrashableMem()
	e, err := epebble.Open("db", epebble.Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(e, Options{CompactChunk: 5})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	all := &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}}
	states := []snapshotState{{rev: 1, compactRev: -1, all: &pb.RangeResponse{Header: &pb.ResponseHeader{Revision: 1}}}}
	for i := uint64(1); i <= 200; i++ {
		w := s.Write(nil)
		for range 1 + rng.IntN(5) {
			key := fmt.Appendf(nil, "k%02d", rng.IntN(30))
			if rng.IntN(4) == 0 {
				if _, err := w.DeleteRange(&pb.DeleteRangeRequest{Key: key}); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if _, err := w.Put(&pb.PutRequest{Key: key, Value: fmt.Appendf(nil, "%d", i)}); err != nil {
				t.Fatal(err)
			}
		}
		if rng.IntN(15) == 0 && w.Rev() > s.CompactRev()+1 {
			if _, _, err := w.Compact(&pb.CompactionRequest{Revision: w.Rev() - 1}); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Commit(i); err != nil {
			t.Fatal(err)
		}
		resp, err := s.Range(all)
		if err != nil {
			t.Fatal(err)
		}
		states = append(states, snapshotState{rev: s.Rev(), compactRev: s.CompactRev(), all: resp})
		if rng.IntN(25) == 0 {
			if err := e.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		if rng.IntN(20) != 0 {
			continue
		}
		d := e.DurableIndex()
		clone := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rand.New(rand.NewPCG(seed, i))})
		e2, err := epebble.Open("db", epebble.Options{FS: clone})
		if err != nil {
			t.Fatal(err)
		}
		s2, err := Open(e2, Options{})
		if err != nil {
			t.Fatal(err)
		}
		a := s2.AppliedIndex()
		if a < d || a > i {
			t.Fatalf("crash after batch %d: applied %d outside [durable %d, %d]", i, a, d, i)
		}
		want := states[a]
		got, err := s2.Range(all)
		if err != nil {
			t.Fatal(err)
		}
		if s2.Rev() != want.rev || s2.CompactRev() != want.compactRev || !proto.Equal(got, want.all) {
			t.Fatalf("crash after batch %d, recovered at %d: rev %d compact %d, want %d %d; keys equal: %v",
				i, a, s2.Rev(), s2.CompactRev(), want.rev, want.compactRev, proto.Equal(got, want.all))
		}
		// A pending physical compaction finishes after the restart.
		s2.Start()
		if want.compactRev > 0 {
			select {
			case <-s2.CompactDone(want.compactRev):
			case <-time.After(10 * time.Second):
				t.Fatal("physical compaction did not resume")
			}
		}
		s2.Close()
		e2.Close()
	}
	s.Close()
	e.Close()
}
