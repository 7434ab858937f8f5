package apply

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"

	pebbleengine "github.com/strata-kv/strata/engine/pebble"
	"github.com/strata-kv/strata/lease"
	"github.com/strata-kv/strata/logcompact"
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
	store, err := mvcc.Open(eng, mvcc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Store: store, Lessor: lessor})
	if err != nil {
		t.Fatal(err)
	}
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
// revision compactions, and the empty entries of new leaders. Compactions
// target a random revision at least compactLag (in the generator's upper
// bound of revisions, 3 per command) below the newest: a history window.
func randomRequests(t *testing.T, rng *rand.Rand, n int, compactLag int64) []*raftpb.Entry {
	key := func() []byte { return []byte(fmt.Sprintf("k%d", rng.IntN(12))) }
	var leases []int64
	nextLease := int64(100)
	rev := int64(1)    // an upper bound of the store's revision, for compactions
	writes := int64(1) // puts and txns so far: about the store's revision
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
			target := 1 + rng.Int64N(max(1, rev-compactLag))
			if compactLag == 0 && rng.IntN(2) == 0 {
				// Near the newest revision (writes is about it), where it
				// reaches the revisions of runs not yet compacted.
				target = max(1, writes-rng.Int64N(4))
			}
			req = &pb.InternalRaftRequest{Compaction: &pb.CompactionRequest{Revision: target}}
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
		if req.Put != nil || req.Txn != nil {
			writes++
		}
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
// command sequences, a store that holds any prefix of the entries the log
// still needs and replays the log's compacted batches and then its entries
// reaches the state of a store that applied every entry -- values,
// create/mod revisions, versions, leases, revision and compact revision --
// and, when the horizon is the compact revision, the same HashKV. With
// --history latest (only each key's last version in a batch) the current
// state is the same, and the compact revision is raised over the versions
// the batches dropped. Either way a read at an old revision answers as on
// the store that applied everything, or is refused as compacted
// (checkHistory).
//
// The log is built as a member builds it: batches of random sizes, each
// built a random number of entries after its last one was applied, while
// the store's physical revision compaction runs in the background. A run
// the builder refuses (a configuration change, or revisions compaction has
// reached) stays in the log until the log is truncated below the engine's
// durable index, which deletes the batches before it; the recovering
// engine then holds at least that index.
func TestCompactedBatchReplay(t *testing.T) {
	for _, tc := range []struct {
		name            string
		seeds           uint64
		commands, batch int // batch: the largest batch, in commands
		compactLag      int64
	}{
		{name: "small", seeds: 12, commands: 150, batch: 40},
		// Enough records per batch for replay's parallel paths (mvcc's
		// minParallelPrepare); compactions reach no batch's revisions,
		// which would refuse it (the small case has them).
		{name: "large", seeds: 2, commands: 6000, batch: 3000, compactLag: 3 * 6000},
	} {
		testCompactedBatchReplay(t, tc.name, tc.seeds, tc.commands, tc.batch, tc.compactLag)
	}
}

// logModel is the raft log after log compaction: the engine must hold at
// least floor entries (the log was truncated there), batches follow it,
// and entries after the last batch are kept as they are.
type logModel struct {
	floor   int
	batches []*logcompact.Batch
	built   int // batches built in all, those truncated included
	refused int // runs the builder refused
}

// buildLog applies entries to full as raft hands them over and builds the
// log as the member's log compactor does.
func buildLog(t *testing.T, rng *rand.Rand, full *member, entries []*raftpb.Entry, maxBatch int, latest bool) logModel {
	t.Helper()
	var lm logModel
	applied := 0
	for lo := 0; lo < len(entries); {
		hi := min(len(entries), lo+1+rng.IntN(maxBatch))
		// The batch is built some entries after its last one is applied.
		upTo := max(applied, min(len(entries), hi+rng.IntN(maxBatch)))
		full.apply(t, rng, entries[applied:upTo])
		applied = upTo
		// Physical compaction has caught up (it runs in the background;
		// waiting makes its effect on the builder deterministic).
		select {
		case <-full.store.CompactDone(full.store.CompactRev()):
		case <-time.After(10 * time.Second):
			t.Fatal("physical compaction did not finish")
		}
		horizon := full.store.CompactRev()
		if latest {
			horizon = math.MaxInt64
		}
		b, err := logcompact.Build(full.store, entries[lo:hi], horizon)
		if errors.Is(err, logcompact.ErrNotCompactable) {
			// The run stays in the log until the node truncates the log at
			// or past it; truncation deletes the batches below.
			lm.refused++
			lm.floor, lm.batches = hi, nil
			lo = hi
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		lm.batches = append(lm.batches, throughFormat(t, b))
		lm.built++
		lo = hi
	}
	full.apply(t, rng, entries[applied:])
	return lm
}

// throughFormat returns b encoded and decoded again: the batches replayed
// in the tests are those the file format gives back.
func throughFormat(t *testing.T, b *logcompact.Batch) *logcompact.Batch {
	t.Helper()
	file, err := logcompact.EncodeBatch(b)
	if err != nil {
		t.Fatal(err)
	}
	data, err := raftlog.EncodeCompactedBatch(file)
	if err != nil {
		t.Fatal(err)
	}
	if file, err = raftlog.DecodeCompactedBatch(data); err != nil {
		t.Fatal(err)
	}
	out, err := logcompact.DecodeBatch(file)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func testCompactedBatchReplay(t *testing.T, name string, seeds uint64, commands, maxBatch int, compactLag int64) {
	for seed := uint64(1); seed <= seeds; seed++ {
		for _, latest := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/seed%d/latest=%v", name, seed, latest), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 7))
				entries := randomRequests(t, rng, commands, compactLag)
				full := newMember(t)
				full.store.Start()
				lm := buildLog(t, rng, full, entries, maxBatch, latest)
				want := stateOf(t, full.store, !latest)

				// Recover from prefixes of every length k the log allows:
				// the engine held entries 1..k, the log the batches and the
				// entries after them. Recovery replays the batches before
				// the member creates its lessor (a fresh applier without
				// one); raft then redelivers the entries.
				span := len(entries) - lm.floor
				for _, k := range []int{lm.floor, lm.floor + rng.IntN(span+1), lm.floor + rng.IntN(span+1), max(lm.floor, len(entries)-1)} {
					for _, strategy := range []string{logcompact.RecoveryNaive, logcompact.RecoveryDescending} {
						m := newMember(t)
						m.apply(t, rng, entries[:k])
						recovering, err := New(Config{Store: m.store})
						if err != nil {
							t.Fatal(err)
						}
						h := m.store.CompactRev()
						if latest {
							h = math.MaxInt64
						}
						tm, err := logcompact.Replay(recovering, lm.batches, strategy, h, 0)
						if err != nil {
							t.Fatalf("k=%d %s: %v", k, strategy, err)
						}
						if k == lm.floor && strategy == logcompact.RecoveryDescending && tm.Applied > tm.Records {
							t.Fatalf("descending applied %d of %d records", tm.Applied, tm.Records)
						}
						if err := m.applier.lessor.Load(m.store); err != nil {
							t.Fatal(err)
						}
						if recovering, err = New(Config{Store: m.store, Lessor: m.applier.lessor}); err != nil {
							t.Fatal(err)
						}
						(&member{store: m.store, applier: recovering}).apply(t, rng, entries[recovering.AppliedIndex():])
						got := stateOf(t, m.store, !latest)
						if latest {
							// Raised (checkHistory checks the reads).
							got.compactRev = want.compactRev
						}
						if got != want {
							t.Fatalf("%s recovery from %d applied entries:\n got %+v\nwant %+v", strategy, k, got, want)
						}
						checkHistory(t, m.store, full.store, 200)
						if recovering.AppliedIndex() != uint64(len(entries)) {
							t.Fatalf("applied index %d, want %d", recovering.AppliedIndex(), len(entries))
						}
					}
				}
				t.Logf("%d commands: %d batches built, %d runs refused, floor %d", len(entries), lm.built, lm.refused, lm.floor)
			})
		}
	}
}

// TestCompactedBatchAfterPhysicalCompaction is the reliability review's
// finding 1: physical revision compaction removes a deletion's tombstone
// (and versions a later write superseded) from the store, so a batch built
// from the store afterwards held no record of the deletion, and a member
// whose engine still held the key live -- a power cut that left its
// durable index before the delete, or a follower sent the batch -- kept the
// key forever (deleted by a lease revoke: a zombie attached to a lease that
// no longer exists). A run whose revisions compaction may have reached is
// not compacted (it stays as entries, which raft redelivers); whatever the
// builder decides, recovery from any prefix reaches the state of the member
// that applied everything.
func TestCompactedBatchAfterPhysicalCompaction(t *testing.T) {
	put := func(k, v string, lease int64) *pb.InternalRaftRequest {
		return &pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte(k), Value: []byte(v), Lease: lease}}
	}
	compact := func(rev int64) *pb.InternalRaftRequest {
		return &pb.InternalRaftRequest{Compaction: &pb.CompactionRequest{Revision: rev, Physical: true}}
	}
	for _, tc := range []struct {
		name string
		reqs []*pb.InternalRaftRequest
		// compactTo is the revision of a physical compaction after reqs,
		// by an entry of its own (in the run or after it).
		compactTo  int64
		inRun      bool // the compaction's entry is part of the run
		runLen     int  // if not 0, the run is the first runLen entries
		prefixLive int  // the recovering engine applied this many entries: the key is live there
	}{
		{name: "delete", reqs: []*pb.InternalRaftRequest{
			put("k", "a", 0), put("other", "x", 0),
			{DeleteRange: &pb.DeleteRangeRequest{Key: []byte("k")}},
			put("other", "y", 0),
		}, compactTo: 5, prefixLive: 1},
		{name: "delete, compaction in the run", reqs: []*pb.InternalRaftRequest{
			put("k", "a", 0), put("other", "x", 0),
			{DeleteRange: &pb.DeleteRangeRequest{Key: []byte("k")}},
			put("other", "y", 0),
		}, compactTo: 5, inRun: true, prefixLive: 1},
		// The versions the run wrote are superseded by a put after it: a
		// batch without them leaves the key absent, and the put redelivered
		// after it creates the key anew (version 1, not 3).
		{name: "overwrite after the run", reqs: []*pb.InternalRaftRequest{
			put("k", "a", 0), put("k", "b", 0), put("other", "x", 0), put("k", "c", 0),
		}, compactTo: 5, runLen: 2},
		{name: "lease revoke", reqs: []*pb.InternalRaftRequest{
			{LeaseGrant: &pb.LeaseGrantRequest{ID: 7, TTL: 60}},
			put("k", "a", 7), put("other", "x", 0),
			{LeaseRevoke: &pb.LeaseRevokeRequest{ID: 7}},
			put("other", "y", 0),
		}, compactTo: 5, prefixLive: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var entries []*raftpb.Entry
			for i, r := range tc.reqs {
				entries = append(entries, normal(t, uint64(i+1), r))
			}
			entries = append(entries, normal(t, uint64(len(entries)+1), compact(tc.compactTo)))
			run := entries
			if !tc.inRun {
				run = entries[:len(entries)-1]
			}
			if tc.runLen != 0 {
				run = entries[:tc.runLen]
			}

			full := newMember(t)
			full.store.Start()
			full.apply(t, rand.New(rand.NewPCG(1, 1)), entries)
			select {
			case <-full.store.CompactDone(tc.compactTo):
			case <-time.After(10 * time.Second):
				t.Fatal("physical compaction did not finish")
			}
			want := stateOf(t, full.store, true)

			b, err := logcompact.Build(full.store, run, full.store.CompactRev())
			switch {
			case errors.Is(err, logcompact.ErrNotCompactable):
				b = nil // the run stays as entries in the log
			case err != nil:
				t.Fatal(err)
			}

			m := newMember(t)
			m.apply(t, rand.New(rand.NewPCG(2, 2)), entries[:tc.prefixLive])
			if b != nil {
				recovering, err := New(Config{Store: m.store})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := logcompact.Replay(recovering, []*logcompact.Batch{b}, logcompact.RecoveryNaive, m.store.CompactRev(), 0); err != nil {
					t.Fatal(err)
				}
				if recovering, err = New(Config{Store: m.store, Lessor: lease.New(lease.Config{})}); err != nil {
					t.Fatal(err)
				}
				m = &member{store: m.store, applier: recovering}
			}
			// Raft redelivers the entries after the applied index.
			m.apply(t, rand.New(rand.NewPCG(3, 3)), entries[m.store.AppliedIndex():])
			if got := stateOf(t, m.store, true); got != want {
				t.Fatalf("recovered from %d applied entries (batch built: %v):\n got %+v\nwant %+v", tc.prefixLive, b != nil, got, want)
			}
		})
	}
}
