package apply

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"

	pebbleengine "github.com/strata-kv/strata/engine/pebble"
	"github.com/strata-kv/strata/lease"
	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/node"
	"github.com/strata-kv/strata/raftlog"
)

// member is a store, its lessor and its applier, as a member wires them.
type member struct {
	store   *mvcc.Store
	applier *Applier
}

func newMember(t *testing.T) *member {
	t.Helper()
	fs := vfs.NewMem()
	eng, err := pebbleengine.Open("engine", pebbleengine.Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	lessor := lease.New(lease.Config{})
	store, err := mvcc.Open(eng, mvcc.Options{LeaseExists: lessor.Exists})
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(store, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.SetLessor(lessor)
	t.Cleanup(func() {
		_ = store.Close()
		_ = eng.Close()
	})
	return &member{store: store, applier: a}
}

// apply applies entries in groups of random size, as raft hands them over.
func (m *member) apply(t *testing.T, rng *rand.Rand, entries []*raftpb.Entry) {
	t.Helper()
	for len(entries) > 0 {
		n := min(len(entries), 1+rng.IntN(5))
		if err := m.applier.applyBatches([]node.Committed{{Entries: entries[:n]}}); err != nil {
			t.Fatal(err)
		}
		entries = entries[n:]
	}
}

// randomRequests makes a random command sequence: puts (some with a
// lease), single and range deletes, txns, lease grants and revokes,
// revision compactions, and the empty entries of new leaders.
func randomRequests(t *testing.T, rng *rand.Rand, n int) []*raftpb.Entry {
	key := func() []byte { return []byte(fmt.Sprintf("k%d", rng.IntN(12))) }
	var leases []int64
	nextLease := int64(100)
	rev := int64(1) // an upper bound of the store's revision, for compactions
	var out []*raftpb.Entry
	for i := 1; i <= n; i++ {
		var req *pb.InternalRaftRequest
		switch p := rng.IntN(100); {
		case p < 40:
			r := &pb.PutRequest{Key: key(), Value: []byte(fmt.Sprintf("v%d", i))}
			if len(leases) > 0 && rng.IntN(3) == 0 {
				r.Lease = leases[rng.IntN(len(leases))]
			}
			req = &pb.InternalRaftRequest{Put: r}
		case p < 50:
			r := &pb.DeleteRangeRequest{Key: key()}
			if rng.IntN(2) == 0 {
				r.RangeEnd = []byte(fmt.Sprintf("k%d", 1+rng.IntN(12)))
			}
			req = &pb.InternalRaftRequest{DeleteRange: r}
		case p < 65:
			k := key()
			req = &pb.InternalRaftRequest{Txn: &pb.TxnRequest{
				Compare: []*pb.Compare{{Key: k, Target: pb.Compare_VERSION, Result: pb.Compare_GREATER,
					TargetUnion: &pb.Compare_Version{Version: int64(rng.IntN(3))}}},
				Success: []*pb.RequestOp{
					{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: k, Value: []byte(fmt.Sprintf("t%d", i))}}},
					{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: key(), Value: []byte(fmt.Sprintf("u%d", i))}}},
				},
				Failure: []*pb.RequestOp{
					{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: key()}}},
				},
			}}
		case p < 75:
			nextLease++
			leases = append(leases, nextLease)
			req = &pb.InternalRaftRequest{LeaseGrant: &pb.LeaseGrantRequest{ID: nextLease, TTL: 60}}
		case p < 82 && len(leases) > 0:
			j := rng.IntN(len(leases))
			req = &pb.InternalRaftRequest{LeaseRevoke: &pb.LeaseRevokeRequest{ID: leases[j]}}
			leases = slices.Delete(leases, j, j+1)
		case p < 90:
			req = &pb.InternalRaftRequest{Compaction: &pb.CompactionRequest{Revision: 1 + rng.Int64N(rev)}}
		case p < 92 && len(leases) > 0:
			// A grant of an existing lease fails and changes nothing.
			req = &pb.InternalRaftRequest{LeaseGrant: &pb.LeaseGrantRequest{ID: leases[0], TTL: 5}}
		case p < 93 && len(leases) > 0:
			req = &pb.InternalRaftRequest{LeaseCheckpoint: &pb.LeaseCheckpointRequest{Checkpoints: []*pb.LeaseCheckpoint{
				{ID: leases[rng.IntN(len(leases))], Remaining_TTL: 1 + rng.Int64N(50)}}}}
		case p < 95:
			out = append(out, &raftpb.Entry{Index: ptr(uint64(i)), Term: ptr(uint64(1)), Type: raftpb.EntryNormal.Enum()})
			continue
		default:
			req = &pb.InternalRaftRequest{Put: &pb.PutRequest{Key: key(), Value: []byte("x")}}
		}
		rev += 3
		out = append(out, normal(t, uint64(i), req))
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// state is everything recovery must reproduce.
type state struct {
	rev, compactRev int64
	hash            uint32
	kvs             string
	leases          string // records and attached keys
}

func stateOf(t *testing.T, s *mvcc.Store, withHistory bool) state {
	t.Helper()
	st := state{rev: s.Rev(), compactRev: s.CompactRev()}
	if withHistory {
		h, _, _, err := s.HashKV(0)
		if err != nil {
			t.Fatal(err)
		}
		st.hash = h
	}
	resp, err := s.Range(&pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}})
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		st.kvs += fmt.Sprintf("%s=%s c%d m%d v%d l%d; ", kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease)
	}
	recs, err := s.Leases()
	if err != nil {
		t.Fatal(err)
	}
	// The keys attached to each lease: a revocation deletes them.
	for _, r := range recs {
		keys, err := s.LeaseKeys(r.ID)
		if err != nil {
			t.Fatal(err)
		}
		st.leases += fmt.Sprintf("%+v keys %q; ", r, keys)
	}
	return st
}

// TestCompactedBatchReplay is the property of log compaction: for random
// command sequences cut into batches of random sizes, a store that holds
// any prefix of the entries and replays the compacted batches after it
// reaches the state of a store that applied every entry -- values,
// create/mod revisions, versions, leases, revision and compact revision
// -- and, when the horizon is the compact revision, the same HashKV.
// With --history latest (the horizon at the batch's last revision) the
// current state is the same.
func TestCompactedBatchReplay(t *testing.T) {
	for _, tc := range []struct {
		name            string
		seeds           uint64
		commands, batch int // batch: the largest batch, in commands
	}{
		{name: "small", seeds: 12, commands: 150, batch: 40},
		// Enough records per batch for replay's parallel paths
		// (mvcc's minParallelPrepare).
		{name: "large", seeds: 2, commands: 3000, batch: 3000},
	} {
		testCompactedBatchReplay(t, tc.name, tc.seeds, tc.commands, tc.batch)
	}
}

func testCompactedBatchReplay(t *testing.T, name string, seeds uint64, commands, maxBatch int) {
	for seed := uint64(1); seed <= seeds; seed++ {
		for _, latest := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/seed%d/latest=%v", name, seed, latest), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 7))
				entries := randomRequests(t, rng, commands)
				full := newMember(t)
				full.apply(t, rng, entries)
				want := stateOf(t, full.store, !latest)

				// Cut the log into batches of random sizes.
				horizon := full.store.CompactRev()
				if latest {
					horizon = full.store.Rev()
				}
				var batches []*raftlog.CompactedBatch
				kept, commands := 0, 0
				for lo := 0; lo < len(entries); {
					hi := min(len(entries), lo+1+rng.IntN(maxBatch))
					b, err := BuildCompactedBatch(full.store, entries[lo:hi], horizon)
					if err != nil {
						t.Fatal(err)
					}
					// The batch survives its file format.
					data, err := raftlog.EncodeCompactedBatch(b)
					if err != nil {
						t.Fatal(err)
					}
					if b, err = raftlog.DecodeCompactedBatch(data); err != nil {
						t.Fatal(err)
					}
					batches = append(batches, b)
					kept += len(b.Records)
					commands += hi - lo
					lo = hi
				}
				// Recover from prefixes of every length k: the engine held
				// entries 1..k, the log the batches. Recovery replays them
				// before the member creates its lessor: a fresh applier
				// without one.
				for _, k := range []int{0, rng.IntN(len(entries)), rng.IntN(len(entries)), len(entries) - 1} {
					for _, strategy := range []string{RecoveryNaive, RecoveryDescending} {
						m := newMember(t)
						m.apply(t, rng, entries[:k])
						recovering, err := New(m.store, nil, nil)
						if err != nil {
							t.Fatal(err)
						}
						h := m.store.CompactRev()
						if latest {
							h = horizon
						}
						tm, err := recovering.ReplayCompactedBatches(batches, strategy, h, 0)
						if err != nil {
							t.Fatalf("k=%d %s: %v", k, strategy, err)
						}
						if got := stateOf(t, m.store, !latest); got != want {
							t.Fatalf("%s recovery from %d applied entries:\n got %+v\nwant %+v", strategy, k, got, want)
						}
						if recovering.AppliedIndex() != uint64(len(entries)) {
							t.Fatalf("applied index %d, want %d", recovering.AppliedIndex(), len(entries))
						}
						if k == 0 && strategy == RecoveryDescending && tm.Applied > tm.Records {
							t.Fatalf("descending applied %d of %d records", tm.Applied, tm.Records)
						}
					}
				}
				t.Logf("%d commands compacted to %d records", commands, kept)
			})
		}
	}
}
