package mvcc

import (
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// TestRaiseCompactRev: raising the compact revision (the replay of a
// compacted batch that dropped versions) works as a revision compaction:
// reads below it fail with ErrCompacted, reads at it answer, it is
// persisted, and physical compaction removes what it supersedes. It never
// lowers the compact revision, does nothing for 0 (nothing dropped), and
// stops at the revision the batch has reached.
func TestRaiseCompactRev(t *testing.T) {
	for _, tc := range []struct {
		name          string
		compactFirst  int64 // a revision compaction before, if not 0
		raise         int64
		want          int64
		wantSurviving int // versions left of a, after physical compaction
	}{
		{name: "raise", raise: 5, want: 5, wantSurviving: 2},
		{name: "nothing dropped", raise: 0, want: -1, wantSurviving: 4},
		{name: "below the compact revision", compactFirst: 4, raise: 3, want: 4, wantSurviving: 2},
		{name: "capped at the revision", raise: 100, want: 7, wantSurviving: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := vfs.NewMem()
			e, s := openTestStore(t, fs, "db")
			// a@2 a@3 a@4 b@5 a@6 b@7
			for i, k := range []string{"a", "a", "a", "b", "a", "b"} {
				w := s.Write(nil)
				if _, err := w.Put(&pb.PutRequest{Key: []byte(k), Value: []byte{byte('0' + i)}}); err != nil {
					t.Fatal(err)
				}
				if err := w.Commit(uint64(i + 1)); err != nil {
					t.Fatal(err)
				}
			}
			if tc.compactFirst != 0 {
				w := s.Write(nil)
				if _, _, err := w.Compact(&pb.CompactionRequest{Revision: tc.compactFirst}); err != nil {
					t.Fatal(err)
				}
				if err := w.Commit(7); err != nil {
					t.Fatal(err)
				}
			}
			w := s.Write(nil)
			if err := w.RaiseCompactRev(tc.raise); err != nil {
				t.Fatal(err)
			}
			if err := w.Commit(8); err != nil {
				t.Fatal(err)
			}
			if s.CompactRev() != tc.want {
				t.Fatalf("compact revision %d, want %d", s.CompactRev(), tc.want)
			}
			if tc.want > 1 {
				_, err := s.Range(&pb.RangeRequest{Key: []byte("a"), Revision: tc.want - 1})
				if !errors.Is(err, ErrCompacted) {
					t.Fatalf("read at %d: %v, want ErrCompacted", tc.want-1, err)
				}
			}
			if _, err := s.Range(&pb.RangeRequest{Key: []byte("a"), Revision: max(tc.want, 1)}); err != nil {
				t.Fatalf("read at %d: %v", max(tc.want, 1), err)
			}
			// Persisted, and the physical compaction it recorded resumes
			// after a restart.
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			e, s = openTestStore(t, fs, "db")
			defer e.Close()
			if s.CompactRev() != tc.want {
				t.Fatalf("after reopen: compact revision %d, want %d", s.CompactRev(), tc.want)
			}
			s.Start()
			defer s.Close()
			if tc.want > 0 {
				<-s.CompactDone(tc.want)
			}
			// Changes refuses a compacted range: count a's versions.
			if a := countVersions(t, s.e, []byte("a")); a != tc.wantSurviving {
				t.Fatalf("%d versions of a left, want %d", a, tc.wantSurviving)
			}
		})
	}
}
