package apply

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/logcompact"
)

// ownLog serves entries [lo, hi) of entries (index i at entries[i-1]) up
// to last, as a member's raft log would: raft's Entries contract, at least
// one entry, with maxSize honoured crudely (at most 7 per call, so that
// InstallCatchUp's reading in chunks is exercised).
func ownLog(entries []*raftpb.Entry, last uint64) func(lo, hi, maxSize uint64) ([]*raftpb.Entry, error) {
	return func(lo, hi, _ uint64) ([]*raftpb.Entry, error) {
		if lo == 0 || hi > last+1 || lo >= hi {
			return nil, fmt.Errorf("entries [%d, %d) not in a log ending at %d", lo, hi, last)
		}
		hi = min(hi, lo+7)
		return entries[lo-1 : hi-1], nil
	}
}

// cutBatches builds the leader's compacted batches for entries[:p] in
// random sizes, through their file format.
func cutBatches(t *testing.T, rng *rand.Rand, m *member, entries []*raftpb.Entry, p int, horizon int64) []*logcompact.Batch {
	t.Helper()
	var out []*logcompact.Batch
	for lo := 0; lo < p; {
		hi := min(p, lo+1+rng.IntN(30))
		b, err := logcompact.Build(m.store, entries[lo:hi], horizon)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, throughFormat(t, b))
		lo = hi
	}
	return out
}

// TestInstallCatchUp is the property of incremental snapshots: a leader
// applied entries 1..E and compacted 1..P into batches; a member that
// applied any prefix A, whose log holds the leader's entries up to any
// base B (A <= B or not), installs the batches ending above B and the
// entries (P, E], and reaches the leader's state at E -- values, create
// and mod revisions, versions, leases and their keys, revision, compact
// revision and HashKV (with --history latest, the current state, and a
// compact revision raised over the versions the batches dropped) -- with
// the snapshot's ConfState; a read at an old revision answers as on the
// leader or is refused as compacted (checkHistory). The member has a lessor, as at run time: a
// kept revocation must refuse a later put to that lease.
func TestInstallCatchUp(t *testing.T) {
	cs := &raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	for seed := uint64(1); seed <= 10; seed++ {
		for _, latest := range []bool{false, true} {
			t.Run(fmt.Sprintf("seed%d/latest=%v", seed, latest), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 11))
				const e = 240
				entries := randomRequests(t, rng, e, 0)
				// The leader builds its batches of entries[:p] as its log
				// compactor does, physical compaction running; the batches
				// follow the log's truncation point (lm.floor).
				p := 1 + rng.IntN(e-1)
				leader := newMember(t)
				leader.store.Start()
				lm := buildLog(t, rng, leader, entries[:p], 30, latest)
				leader.apply(t, rng, entries[p:])
				want := stateOf(t, leader.store, !latest)
				batches := lm.batches
				for try := 0; try < 4; try++ {
					// A base at a batch boundary, or inside a batch.
					b := uint64(lm.floor + rng.IntN(p-lm.floor+1))
					a := uint64(rng.IntN(e)) // any applied index below E
					var send []*logcompact.Batch
					for _, x := range batches {
						if x.LastIndex > b {
							send = append(send, x)
						}
					}
					m := newMember(t)
					m.apply(t, rng, entries[:a])
					st, err := m.applier.InstallCatchUp(CatchUp{
						Base: b, OwnEntries: ownLog(entries, max(a, b)), Batches: send,
						Entries: entries[p:], End: e, ConfState: cs,
					})
					if err != nil {
						t.Fatalf("applied %d, base %d, batches to %d: %v", a, b, p, err)
					}
					got := stateOf(t, m.store, !latest)
					if latest {
						// Raised (checkHistory checks the reads).
						got.compactRev = want.compactRev
					}
					if got != want {
						t.Fatalf("applied %d, base %d, batches to %d:\n got %+v\nwant %+v", a, b, p, got, want)
					}
					checkHistory(t, m.store, leader.store, 0)
					if m.applier.AppliedIndex() != e || !proto.Equal(m.applier.ConfState(), cs) {
						t.Fatalf("applied index %d, conf state %v", m.applier.AppliedIndex(), m.applier.ConfState())
					}
					if wantOwn := int(b) - int(a); (wantOwn > 0) != (st.OwnEntries > 0) || st.OwnEntries > max(wantOwn, 0) {
						t.Fatalf("applied %d, base %d: %d own entries applied", a, b, st.OwnEntries)
					}
					// What the store holds is what a restart reads back.
					again, err := New(Config{Store: m.store})
					if err != nil {
						t.Fatal(err)
					}
					if again.AppliedIndex() != e || !proto.Equal(again.ConfState(), cs) {
						t.Fatalf("after reload: applied index %d, conf state %v", again.AppliedIndex(), again.ConfState())
					}
				}
			})
		}
	}
}

// TestInstallCatchUpRevokedLease: a lease revoked inside a compacted
// batch must not accept a put in the entries after it, although the
// member's lessor knew the lease before the install.
func TestInstallCatchUpRevokedLease(t *testing.T) {
	entries := []*raftpb.Entry{
		normal(t, 1, &pb.InternalRaftRequest{LeaseGrant: &pb.LeaseGrantRequest{ID: 7, TTL: 60}}),
		normal(t, 2, put(0, "a", "1")),
		normal(t, 3, &pb.InternalRaftRequest{LeaseRevoke: &pb.LeaseRevokeRequest{ID: 7}}),
		normal(t, 4, &pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte("b"), Value: []byte("2"), Lease: 7}}),
		normal(t, 5, put(0, "c", "3")),
	}
	rng := rand.New(rand.NewPCG(1, 1))
	leader := newMember(t)
	leader.apply(t, rng, entries)
	batch, err := logcompact.Build(leader.store, entries[1:3], leader.store.CompactRev())
	if err != nil {
		t.Fatal(err)
	}
	m := newMember(t)
	m.apply(t, rng, entries[:1])
	if _, err := m.applier.InstallCatchUp(CatchUp{Base: 1, Batches: []*logcompact.Batch{batch}, Entries: entries[3:], End: 5}); err != nil {
		t.Fatal(err)
	}
	if got, want := stateOf(t, m.store, true), stateOf(t, leader.store, true); got != want {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	if strings.Contains(stateOf(t, m.store, false).kvs, "b=") {
		t.Fatalf("the put to the revoked lease was applied: %s", stateOf(t, m.store, false).kvs)
	}
}

// TestInstallCatchUpRefuses: a gap the member cannot cross is an error,
// found before anything is written.
func TestInstallCatchUpRefuses(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	// No compaction reaches the batches' revisions (which would refuse
	// them): the refusals tested here are the stream's.
	entries := randomRequests(t, rng, 60, 3*60)
	leader := newMember(t)
	leader.apply(t, rng, entries)
	batches := cutBatches(t, rng, leader, entries, 40, leader.store.CompactRev())
	for _, tc := range []struct {
		name    string
		applied uint64
		c       CatchUp
		want    string
	}{
		{name: "own log ends before the base", applied: 5,
			c:    CatchUp{Base: 20, OwnEntries: ownLog(entries, 10), Batches: batches, Entries: entries[40:], End: 60},
			want: "read own entries"},
		{name: "no own log", applied: 5, c: CatchUp{Base: 20, Batches: batches, Entries: entries[40:], End: 60},
			want: "not readable"},
		// The own entries are readable, the rest leaves a gap: nothing is
		// written, the own entries included (they once committed on their
		// own, leaving an engine at the base whose membership entries had
		// no ConfState).
		{name: "gap after the own entries", applied: 5,
			c:    CatchUp{Base: 20, OwnEntries: ownLog(entries, 20), Entries: entries[30:], End: 60},
			want: "entry 31 where 21 was due"},
		{name: "batches start above the applied index", applied: 5,
			c:    CatchUp{Base: 5, Batches: batches[1:], Entries: entries[40:], End: 60},
			want: "does not cover index 6"},
		{name: "entries do not follow the batches", applied: 5,
			c:    CatchUp{Base: 5, Batches: batches, Entries: entries[41:], End: 60},
			want: "entry 42 where 41 was due"},
		{name: "entries end early", applied: 5,
			c:    CatchUp{Base: 5, Batches: batches, Entries: entries[40:59], End: 60},
			want: "end at 59"},
		{name: "already there", applied: 60, c: CatchUp{Base: 5, Batches: batches, Entries: entries[40:], End: 60},
			want: "already applied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMember(t)
			m.apply(t, rng, entries[:tc.applied])
			_, err := m.applier.InstallCatchUp(tc.c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("InstallCatchUp = %v, want an error containing %q", err, tc.want)
			}
			if got := m.applier.AppliedIndex(); got != tc.applied {
				t.Fatalf("applied index %d after a refusal, was %d", got, tc.applied)
			}
		})
	}
}
