package apply

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/strata-kv/strata/logcompact"
	"github.com/strata-kv/strata/mvcc"
)

// rangeAt is every key at revision rev, as text, or the error.
func rangeAt(s *mvcc.Store, rev int64) (string, error) {
	resp, err := s.Range(&pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: rev})
	if err != nil {
		return "", err
	}
	out := fmt.Sprintf("count %d: ", resp.Count)
	for _, kv := range resp.Kvs {
		out += fmt.Sprintf("%s=%s c%d m%d v%d l%d; ", kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease)
	}
	return out, nil
}

// checkHistory checks etcd's contract for reads at old revisions on got, a
// store that replayed compacted batches, against want, which applied the
// entries themselves: got's compact revision is want's or higher, and at
// every revision up to want's current one, a read either answers exactly
// as want does or, below got's compact revision, is refused with
// ErrCompacted. With a sample, only that many revisions, spread evenly, and
// the two around got's compact revision.
func checkHistory(t *testing.T, got, want *mvcc.Store, sample int) {
	t.Helper()
	if got.CompactRev() < want.CompactRev() {
		t.Fatalf("compact revision %d, below %d", got.CompactRev(), want.CompactRev())
	}
	step := int64(1)
	if sample > 0 {
		step = max(1, want.Rev()/int64(sample))
	}
	check := func(rev int64) {
		if rev < 1 || rev > want.Rev() {
			return
		}
		g, gerr := rangeAt(got, rev)
		if rev < got.CompactRev() {
			if !errors.Is(gerr, mvcc.ErrCompacted) {
				t.Fatalf("read at revision %d, below the compact revision %d: %q, %v; want ErrCompacted", rev, got.CompactRev(), g, gerr)
			}
			return
		}
		w, werr := rangeAt(want, rev)
		if gerr != nil || werr != nil || g != w {
			t.Fatalf("read at revision %d (compact revision %d):\n got %q, %v\nwant %q, %v", rev, got.CompactRev(), g, gerr, w, werr)
		}
	}
	for rev := int64(1); rev <= want.Rev(); rev += step {
		check(rev)
	}
	check(got.CompactRev() - 1)
	check(got.CompactRev())
}

// TestReplayRaisesCompactRevision: a batch built with --history latest
// keeps only each key's last version, so after replaying it the reads at
// revisions whose versions it dropped must be refused as compacted
// (etcd's contract: a revision reads exactly as it was or not at all),
// and the reads at later revisions, whose versions are all there, must
// still answer. Recovery's descending strategy drops more, across
// batches. Entries (index: request -> revision):
//
//	1: a=1 -> 2   2: b=1 -> 3   3: a=2 -> 4   4: c=1 -> 5      | batch 1..4: a@2 dropped, a@4 kept
//	5: b=2 -> 6   6: del c -> 7 7: d=1 -> 8   8: d=2 -> 9      | batch 5..8: d@8 dropped, d@9 kept
//	9: b=3 -> 10  10: f=1 -> 11                                | batch 9..10: nothing dropped
//
// so replaying the batches one by one must leave the compact revision at
// 9 (the last version kept where one was dropped); descending also drops
// b@3 and b@6 (b@10 kept) and c@5 (its deletion at 7 kept): 10. With full
// history nothing is dropped and every revision still reads. Batches of
// format version 1 do not say what they dropped: the compact revision goes
// to the last batch's revision, 11, with --history latest (or in an
// incremental install, which does not know the horizon), and stays
// otherwise.
func TestReplayRaisesCompactRevision(t *testing.T) {
	reqs := []*pb.InternalRaftRequest{
		put(0, "a", "1"), put(0, "b", "1"), put(0, "a", "2"), put(0, "c", "1"),
		put(0, "b", "2"), {DeleteRange: &pb.DeleteRangeRequest{Key: []byte("c")}}, put(0, "d", "1"), put(0, "d", "2"),
		put(0, "b", "3"), put(0, "f", "1"),
	}
	var entries []*raftpb.Entry
	for i, r := range reqs {
		entries = append(entries, normal(t, uint64(i+1), r))
	}
	cuts := [][2]int{{0, 4}, {4, 8}, {8, 10}}
	const catchUp = "catch-up" // InstallCatchUp, as an incremental snapshot installs
	for _, tc := range []struct {
		how        string
		latest     bool
		applied    int   // entries the store held before the replay
		v1         bool  // batches of format version 1
		compactRev int64 // want, after the replay
	}{
		{how: logcompact.RecoveryNaive, latest: true, compactRev: 9},
		{how: logcompact.RecoveryDescending, latest: true, compactRev: 10},
		{how: catchUp, latest: true, compactRev: 9},
		// Holding 1..5 (b@6 included), the store lacks only what the
		// batches 5..8 and 9..10 dropped: d@8.
		{how: logcompact.RecoveryNaive, latest: true, applied: 5, compactRev: 9},
		{how: logcompact.RecoveryDescending, latest: true, applied: 5, compactRev: 9},
		{how: catchUp, latest: true, applied: 5, compactRev: 9},
		{how: logcompact.RecoveryNaive, compactRev: -1},
		{how: logcompact.RecoveryDescending, compactRev: -1},
		{how: catchUp, applied: 5, compactRev: -1},
		{how: logcompact.RecoveryNaive, latest: true, v1: true, compactRev: 11},
		{how: logcompact.RecoveryDescending, latest: true, v1: true, compactRev: 11},
		{how: logcompact.RecoveryNaive, v1: true, compactRev: -1},
		{how: logcompact.RecoveryDescending, v1: true, compactRev: -1},
		{how: catchUp, v1: true, compactRev: 11},
	} {
		t.Run(fmt.Sprintf("%s/latest=%v/applied=%d/v1=%v", tc.how, tc.latest, tc.applied, tc.v1), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, 3))
			full := newMember(t)
			full.apply(t, rng, entries)
			horizon := full.store.CompactRev()
			if tc.latest {
				horizon = math.MaxInt64
			}
			var batches []*logcompact.Batch
			for _, c := range cuts {
				b, err := logcompact.Build(full.store, entries[c[0]:c[1]], horizon)
				if err != nil {
					t.Fatal(err)
				}
				if tc.v1 {
					// As a version 1 file reads (logcompact's golden
					// tests decode those); no release writes one now.
					b.CompactRevision = logcompact.UnknownCompactRevision
				} else {
					b = throughFormat(t, b) // the batch survives its file format
				}
				batches = append(batches, b)
			}
			m := newMember(t)
			m.apply(t, rng, entries[:tc.applied])
			var err error
			if tc.how == catchUp {
				_, err = m.applier.InstallCatchUp(CatchUp{Base: uint64(tc.applied), Batches: batches, End: uint64(len(entries))})
			} else {
				var recovering *Applier
				if recovering, err = New(Config{Store: m.store}); err != nil {
					t.Fatal(err)
				}
				_, err = logcompact.Replay(recovering, batches, tc.how, horizon, 0)
			}
			if err != nil {
				t.Fatal(err)
			}
			checkHistory(t, m.store, full.store, 0)
			if got := m.store.CompactRev(); got != tc.compactRev {
				t.Fatalf("compact revision %d, want %d", got, tc.compactRev)
			}
		})
	}
}
