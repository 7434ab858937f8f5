package raftlog

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// model is the log as a plain slice: what every read must return.
type model struct {
	snapIndex, snapTerm uint64
	entries             []*raftpb.Entry // snapIndex+1 ..
	hs                  hardState
}

func (m model) clone() model {
	m.entries = append([]*raftpb.Entry(nil), m.entries...)
	return m
}

func (m model) last() uint64 { return m.snapIndex + uint64(len(m.entries)) }

func (m model) term(i uint64) uint64 {
	if i == m.snapIndex {
		return m.snapTerm
	}
	return m.entries[i-m.snapIndex-1].GetTerm()
}

// modelOp is one random operation, applicable to the model and the log.
type modelOp struct {
	kind     string // "append", "compact", "snapshot", "reopen"
	entries  []*raftpb.Entry
	hs       *raftpb.HardState
	index    uint64
	snapTerm uint64
}

func (o modelOp) String() string {
	switch o.kind {
	case "append":
		if len(o.entries) == 0 {
			return fmt.Sprintf("append hs %v", hardStateOf(o.hs))
		}
		return fmt.Sprintf("append %d..%d hs %v", o.entries[0].GetIndex(), o.entries[len(o.entries)-1].GetIndex(), hardStateOf(o.hs))
	case "reopen":
		return "reopen"
	}
	return fmt.Sprintf("%s %d", o.kind, o.index)
}

// randomOp draws an operation valid for m: appends with conflicts and
// entries below the snapshot point, HardState-only appends, log compactions
// up to the commit index, rare snapshot installs and reopens.
func randomOp(rng *rand.Rand, m model, term *uint64) modelOp {
	switch r := rng.IntN(100); {
	case r < 8 && m.hs.commit > m.snapIndex:
		return modelOp{kind: "compact", index: m.snapIndex + 1 + rng.Uint64N(m.hs.commit-m.snapIndex)}
	case r < 10:
		*term += 1
		return modelOp{kind: "snapshot", index: m.last() + 1 + rng.Uint64N(20), snapTerm: *term}
	case r < 14:
		return modelOp{kind: "reopen"}
	}
	if rng.IntN(10) == 0 {
		*term += 1
	}
	// As raft does: a conflict replaces only uncommitted entries; a batch
	// that starts at or below the commit index repeats the entries the log
	// has (those at or below the snapshot point are ignored by the log).
	first := m.last() + 1
	switch r := rng.IntN(6); {
	case r < 2 && m.hs.commit < m.last():
		first = m.hs.commit + 1 + rng.Uint64N(m.last()-m.hs.commit)
	case r == 2 && m.snapIndex >= 3:
		first = m.snapIndex - 2
	}
	n := rng.IntN(12)
	if first <= m.hs.commit {
		n += int(m.last() + 1 - first)
	}
	var es []*raftpb.Entry
	for i := 0; i < n; i++ {
		idx := first + uint64(i)
		if idx > m.snapIndex && idx <= m.last() && idx <= m.hs.commit {
			es = append(es, m.entries[idx-m.snapIndex-1])
			continue
		}
		data := make([]byte, rng.IntN(300))
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		es = append(es, &raftpb.Entry{Index: proto.Uint64(idx), Term: proto.Uint64(*term),
			Type: raftpb.EntryType(rng.IntN(3)).Enum(), Data: data})
	}
	newLast := max(m.last(), first+uint64(n)-1)
	if n > 0 && first+uint64(n)-1 > m.snapIndex {
		newLast = first + uint64(n) - 1
	}
	commit := m.hs.commit
	if newLast > commit && rng.IntN(2) == 0 {
		commit += rng.Uint64N(newLast - commit + 1)
	}
	var h *raftpb.HardState
	if rng.IntN(4) > 0 || n == 0 {
		h = hs(*term, uint64(rng.IntN(3)), commit)
	}
	return modelOp{kind: "append", entries: es, hs: h}
}

// apply applies op to the model (the expected outcome of a successful call).
func (m model) apply(op modelOp) model {
	m = m.clone()
	switch op.kind {
	case "append":
		es := op.entries
		for len(es) > 0 && es[0].GetIndex() <= m.snapIndex {
			es = es[1:]
		}
		if len(es) > 0 {
			m.entries = append(m.entries[:es[0].GetIndex()-m.snapIndex-1], es...)
		}
		if !raft.IsEmptyHardState(op.hs) {
			m.hs = hardStateOf(op.hs)
		}
	case "compact":
		m.snapTerm = m.term(op.index)
		m.entries = m.entries[op.index-m.snapIndex:]
		m.snapIndex = op.index
		m.hs.commit = max(m.hs.commit, op.index)
	case "snapshot":
		m.snapIndex, m.snapTerm, m.entries = op.index, op.snapTerm, nil
		m.hs.commit = max(m.hs.commit, op.index)
	}
	return m
}

// do performs op on the log.
func do(l *Log, op modelOp) error {
	switch op.kind {
	case "append":
		return l.Append(op.entries, op.hs)
	case "compact":
		return l.Compact(op.index, &raftpb.ConfState{Voters: []uint64{op.index}})
	case "snapshot":
		return l.ApplySnapshot(&raftpb.SnapshotMetadata{Index: proto.Uint64(op.index), Term: proto.Uint64(op.snapTerm)})
	}
	return nil
}

// matches reports how the log differs from the model, or nil.
func matches(l *Log, m model) error {
	first, _ := l.FirstIndex()
	last, _ := l.LastIndex()
	if first != m.snapIndex+1 || last != m.last() {
		return fmt.Errorf("log spans %d..%d, model %d..%d", first, last, m.snapIndex+1, m.last())
	}
	got, err := l.Entries(first, last+1, 1<<62)
	if err != nil {
		return fmt.Errorf("Entries: %w", err)
	}
	if err := sameEntries(got, m.entries); err != nil {
		return err
	}
	if t, err := l.Term(m.snapIndex); err != nil || t != m.snapTerm {
		return fmt.Errorf("Term(%d) = %d, %v; model %d", m.snapIndex, t, err, m.snapTerm)
	}
	h, _, _ := l.InitialState()
	if hardStateOf(h) != m.hs {
		return fmt.Errorf("HardState %v, model %v", hardStateOf(h), m.hs)
	}
	return nil
}

// TestModel runs random operations against the log and a plain slice and
// compares every read after every operation, across reopens, with log
// compaction of whole segments or of random batch sizes interleaved.
// With several directories every Append is striped across them.
func TestModel(t *testing.T) {
	// stripe -1 splits every Append; 0 (the default) writes small ones
	// whole, the directories taking turns.
	for _, c := range []struct{ ndirs, stripe int }{{1, 0}, {2, -1}, {3, -1}, {2, 0}} {
		for seed := uint64(1); seed <= 8; seed++ {
			t.Run(fmt.Sprintf("dirs%d/stripe%d/seed%d", c.ndirs, c.stripe, seed), func(t *testing.T) {
				testModel(t, seed, testDirs(c.ndirs), c.stripe)
			})
		}
	}
}

// testDirs names n log directories; the first is testDir.
func testDirs(n int) []string {
	dirs := []string{testDir}
	for i := 1; i < n; i++ {
		dirs = append(dirs, fmt.Sprintf("%s%d", testDir, i))
	}
	return dirs
}

func testModel(t *testing.T, seed uint64, dirs []string, stripe int) {
	{
		{
			rng := rand.New(rand.NewPCG(seed, seed))
			fs := vfs.NewMem()
			opts := Options{FS: fs, Dirs: dirs, SegmentSize: 8 << 10, tailBudget: 4 << 10, MinStripeBytes: stripe}
			l, err := Open(opts)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = l.Close() }()
			var m model
			var term uint64 = 1
			batches := 0
			// The unit of log compaction: whole segments (0) or runs of
			// batchN entries (--log-compaction-batch), chosen per seed.
			var batchN uint64
			if rng.IntN(2) == 0 {
				batchN = 1 + rng.Uint64N(40)
			}
			for i := 0; i < 400; i++ {
				op := randomOp(rng, m, &term)
				if op.kind == "reopen" {
					_ = l.Close()
					if l, err = Open(opts); err != nil {
						t.Fatalf("op %d: reopen: %v", i, err)
					}
				} else if err := do(l, op); err != nil {
					t.Fatalf("op %d (%v): %v", i, op, err)
				}
				m = m.apply(op)
				if err := matches(l, m); err != nil {
					t.Fatalf("op %d (%v): %v", i, op, err)
				}
				if rng.IntN(8) == 0 {
					// Log compaction into a batch file, up to the commit
					// index: the batch holds exactly the model's entries,
					// and the log then looks as after Compact to its end.
					var built *CompactedBatch
					build := func(es []*raftpb.Entry) (*CompactedBatch, error) {
						b, err := keepAll(es)
						built = b
						return b, err
					}
					var ok bool
					var err error
					if batchN == 0 {
						ok, err = l.CompactOldestSegment(m.hs.commit, build)
					} else {
						ok, err = l.CompactNextBatch(m.hs.commit, batchN, build)
					}
					if err != nil {
						t.Fatalf("op %d: log compaction: %v", i, err)
					}
					if ok && built != nil {
						got := payloadEntries(t, built)
						lo, hi := built.FirstIndex-m.snapIndex-1, built.LastIndex-m.snapIndex
						if built.FirstIndex != m.snapIndex+1 || hi > uint64(len(m.entries)) {
							t.Fatalf("op %d: batch %d..%d, model snapshot %d last %d", i, built.FirstIndex, built.LastIndex, m.snapIndex, m.last())
						}
						if err := sameEntries(got, m.entries[lo:hi]); err != nil {
							t.Fatalf("op %d: batch %d..%d: %v", i, built.FirstIndex, built.LastIndex, err)
						}
						if batchN > 0 && built.LastIndex-built.FirstIndex+1 != batchN {
							t.Fatalf("op %d: batch %d..%d of %d entries, want %d", i, built.FirstIndex, built.LastIndex,
								built.LastIndex-built.FirstIndex+1, batchN)
						}
						batches++
						m = m.apply(modelOp{kind: "compact", index: built.LastIndex})
						if err := matches(l, m); err != nil {
							t.Fatalf("op %d (log compaction to %d): %v", i, built.LastIndex, err)
						}
					}
				}
			}
			t.Logf("%d runs rewritten as batch files (batch size %d; 0: segments)", batches, batchN)
			if segs := l.Stats().Segments; segs > 20*len(dirs) {
				t.Errorf("%d segments left: log compaction does not delete them", segs)
			}
		}
	}
}
