package apply

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/strata-kv/strata/logcompact"
)

// TestBuildCompactedBatchRefusesNonMonotoneRows: logcompact.Build
// takes the revisions a run of indexes wrote from the store's index ->
// revision rows; rows that do not describe the log (a row of another
// log, such as an old cluster's kept by a restore before it dropped them,
// or a damaged one) must make the run not compactable rather than give a
// batch missing writes. Entries 1..5 are puts (revisions 2..6), 6 and 7
// empty entries (no rows); each case overwrites some rows with raw
// (before, after) pairs.
func TestBuildCompactedBatchRefusesNonMonotoneRows(t *testing.T) {
	type row struct {
		index         uint64
		before, after int64
	}
	for _, tc := range []struct {
		name     string
		rows     []row
		lo, hi   uint64 // the batch's entries
		records  int    // want, if built
		refusing bool
	}{
		{name: "rows of the log", lo: 1, hi: 7, records: 5},
		{name: "rows of the log, batch after the first index", lo: 3, hi: 7, records: 3},
		// The restore case: index 7 wrote nothing in this log, the old
		// row says it moved the revision from 2 to 3.
		{name: "stale row at the last index", rows: []row{{7, 2, 3}}, lo: 1, hi: 7, refusing: true},
		{name: "stale row in the middle", rows: []row{{6, 1, 2}}, lo: 1, hi: 7, refusing: true},
		{name: "row going backwards", rows: []row{{3, 4, 3}}, lo: 1, hi: 7, refusing: true},
		{name: "row starting before the previous row's end", rows: []row{{4, 3, 5}}, lo: 1, hi: 7, refusing: true},
		{name: "first row starting before the revision at first-1", rows: []row{{2, 2, 5}}, lo: 3, hi: 7, refusing: true},
		// A row that wrote nothing and starts where the previous ended
		// is consistent whatever log it came from.
		{name: "row that wrote nothing", rows: []row{{6, 6, 6}}, lo: 1, hi: 7, records: 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMember(t)
			var entries []*raftpb.Entry
			for i, key := range []string{"a", "b", "a", "c", "a"} {
				entries = append(entries, normal(t, uint64(i+1), &pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte(key), Value: []byte("v")}}))
			}
			for i := uint64(6); i <= 7; i++ {
				entries = append(entries, &raftpb.Entry{Index: ptr(i), Term: ptr(uint64(1)), Type: raftpb.EntryNormal.Enum()})
			}
			m.apply(t, rand.New(rand.NewPCG(1, 1)), entries)
			if len(tc.rows) > 0 {
				w := m.store.Write(nil)
				for _, r := range tc.rows {
					// mvcc's row layout (mvcc/logcompact.go): "mi", the
					// index, then before and after, big-endian.
					k := binary.BigEndian.AppendUint64([]byte("mi"), r.index)
					v := binary.BigEndian.AppendUint64(nil, uint64(r.before))
					v = binary.BigEndian.AppendUint64(v, uint64(r.after))
					if err := w.Batch().Set(k, v); err != nil {
						t.Fatal(err)
					}
				}
				if err := w.Commit(m.store.AppliedIndex()); err != nil {
					t.Fatal(err)
				}
			}
			b, err := logcompact.Build(m.store, entries[tc.lo-1:tc.hi], -1)
			switch {
			case tc.refusing && !errors.Is(err, logcompact.ErrNotCompactable):
				if err == nil {
					t.Fatalf("built a batch of %d records, want logcompact.ErrNotCompactable", len(b.Records))
				}
				t.Fatalf("error %v, want logcompact.ErrNotCompactable", err)
			case tc.refusing:
				t.Logf("refused: %v", err)
			case err != nil:
				t.Fatal(err)
			case len(b.Records) != tc.records:
				t.Fatalf("%d records, want %d: %+v", len(b.Records), tc.records, b.Records)
			}
		})
	}
}
