package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/logcompact"
)

// spans are batch files 11..20 (term 2), 21..30 (term 3), 31..40 (term 3),
// of 1000 bytes each, the log's snapshot point at 40.
var testSpans = []batchSpan{
	{first: 11, last: 20, lastTerm: 2, size: 1000},
	{first: 21, last: 30, lastTerm: 3, size: 1000},
	{first: 31, last: 40, lastTerm: 3, size: 1000},
}

// spansFrom is what OpenCompactedBatches lists for planIncremental: the
// files ending at or above min(match, snapIndex).
func spansFrom(match, snapIndex uint64) []batchSpan {
	var out []batchSpan
	for _, s := range testSpans {
		if s.last >= min(match, snapIndex) {
			out = append(out, s)
		}
	}
	return out
}

func TestPlanIncremental(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		match, snapIndex, logSnap uint64
		spans                     []batchSpan // nil: spansFrom(match, snapIndex)
		wantBase, wantTerm        uint64
		wantSend                  []uint64 // first index of each batch sent
		wantEnd                   uint64
		reason                    string // part of the reason; "" for an incremental plan
	}{
		{name: "base inside a batch: that batch and the later ones, no term", match: 15, snapIndex: 45, logSnap: 40,
			wantBase: 15, wantSend: []uint64{11, 21, 31}, wantEnd: 45},
		{name: "base at a batch's end: its term, the later batches", match: 20, snapIndex: 45, logSnap: 40,
			wantBase: 20, wantTerm: 2, wantSend: []uint64{21, 31}, wantEnd: 45},
		{name: "base just below the oldest batch", match: 10, snapIndex: 45, logSnap: 40,
			wantBase: 10, wantSend: []uint64{11, 21, 31}, wantEnd: 45},
		{name: "snapshot at the log's snapshot point: no entries", match: 25, snapIndex: 40, logSnap: 40,
			wantBase: 25, wantSend: []uint64{21, 31}, wantEnd: 40},
		{name: "snapshot below the log's snapshot point: end at the batches' end", match: 12, snapIndex: 35, logSnap: 40,
			wantBase: 12, wantSend: []uint64{11, 21, 31}, wantEnd: 40},
		{name: "member past the batches: entries only, the log's term", match: 42, snapIndex: 45, logSnap: 40, spans: []batchSpan{},
			wantBase: 40, wantTerm: 3, wantEnd: 45},
		{name: "member below the oldest batch", match: 9, snapIndex: 45, logSnap: 40, reason: "below the oldest compacted batch 11..20"},
		{name: "match unknown", match: 0, snapIndex: 45, logSnap: 40, reason: "unknown"},
		{name: "member already at the end", match: 45, snapIndex: 45, logSnap: 45, spans: []batchSpan{}, reason: "the snapshot's end"},
		{name: "no batch file", match: 15, snapIndex: 45, logSnap: 40, spans: []batchSpan{}, reason: "no compacted batch covers 16..40"},
		{name: "gap between batches", match: 15, snapIndex: 45, logSnap: 40,
			spans: []batchSpan{testSpans[0], testSpans[2]}, reason: "not consecutive"},
		{name: "batches stop below the log's snapshot point", match: 15, snapIndex: 45, logSnap: 41,
			reason: "not at the log's snapshot point 41"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spans := tc.spans
			if spans == nil {
				spans = spansFrom(tc.match, tc.snapIndex)
			}
			p, reason := planIncremental(tc.match, tc.snapIndex, tc.logSnap, 3, spans)
			if tc.reason != "" {
				if !strings.Contains(reason, tc.reason) {
					t.Fatalf("reason %q, want one containing %q (plan %+v)", reason, tc.reason, p)
				}
				return
			}
			if reason != "" {
				t.Fatalf("no incremental snapshot: %s", reason)
			}
			var send []uint64
			for _, i := range p.send {
				send = append(send, spans[i].first)
			}
			if p.base != tc.wantBase || p.baseTerm != tc.wantTerm || p.end != tc.wantEnd || !slices.Equal(send, tc.wantSend) {
				t.Fatalf("plan base %d term %d end %d sending %v; want base %d term %d end %d sending %v",
					p.base, p.baseTerm, p.end, send, tc.wantBase, tc.wantTerm, tc.wantEnd, tc.wantSend)
			}
		})
	}
}

func TestCheckCatchUp(t *testing.T) {
	terms := func(i uint64) (uint64, error) {
		if i < 5 || i > 30 {
			return 0, raft.ErrCompacted
		}
		return 1 + i/10, nil // 5..9: 1, 10..19: 2, 20..29: 3, 30: 4
	}
	for _, tc := range []struct {
		name                  string
		applied, first, last  uint64
		base, baseTerm        uint64
		want                  string // part of the error; "" for none
		wantUnwrapsCompaction bool
	}{
		{name: "applied at the base", applied: 20, first: 6, last: 30, base: 20, baseTerm: 9},
		{name: "applied above the base", applied: 25, first: 26, last: 30, base: 20, baseTerm: 9},
		{name: "log holds the gap, term matches", applied: 8, first: 6, last: 30, base: 20, baseTerm: 3},
		{name: "log holds the gap, term not sent", applied: 8, first: 6, last: 30, base: 20},
		{name: "term differs", applied: 8, first: 6, last: 30, base: 20, baseTerm: 2, want: "has term 3, the leader's 2"},
		{name: "log starts above the applied index", applied: 8, first: 12, last: 30, base: 20, want: "log starts at 12"},
		{name: "log ends below the base", applied: 8, first: 6, last: 18, base: 20, want: "log ends at 18"},
		{name: "term unreadable", applied: 1, first: 2, last: 40, base: 35, baseTerm: 4, want: "term of the base 35",
			wantUnwrapsCompaction: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkCatchUp(tc.applied, tc.first, tc.last, terms, tc.base, tc.baseTerm)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("checkCatchUp = %v, want an error containing %q", err, tc.want)
			}
			if errors.Is(err, raft.ErrCompacted) != tc.wantUnwrapsCompaction {
				t.Fatalf("checkCatchUp = %v: wraps raft.ErrCompacted %v, want %v", err, !tc.wantUnwrapsCompaction, tc.wantUnwrapsCompaction)
			}
		})
	}
}

// TestIncrementalBytes: the size the leader weighs is the stream's size.
func TestIncrementalBytes(t *testing.T) {
	var batches []BatchSource
	var raw [][]byte
	var total int64
	for _, r := range [][2]uint64{{11, 20}, {21, 30}} {
		b := &logcompact.Batch{FirstIndex: r[0], LastIndex: r[1], LastTerm: 2, Revision: 9}
		for i := r[0]; i <= r[1]; i++ {
			b.Records = append(b.Records, logcompact.Record{Kind: logcompact.RecordDelete, Index: i, Main: int64(i), Key: []byte(fmt.Sprint(i))})
		}
		enc := encodeBatch(t, b)
		raw = append(raw, enc)
		total += int64(len(enc))
	}
	for _, enc := range raw {
		batches = append(batches, BatchSource{Size: int64(len(enc)), R: bytes.NewReader(enc)})
	}
	var entries []*raftpb.Entry
	for i := uint64(31); i <= 33; i++ {
		entries = append(entries, &raftpb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(2), Data: bytes.Repeat([]byte{1}, int(i))})
	}
	var buf bytes.Buffer
	n, err := WriteIncremental(&buf, IncrementalHeader{Index: 33, Term: 2, Base: 12, End: 33}, batches, entries)
	if err != nil {
		t.Fatal(err)
	}
	if got := incrementalBytes(len(raw), total, entries); got != n {
		t.Fatalf("incrementalBytes = %d, the stream is %d bytes", got, n)
	}
}

// TestReportedFallsBack: a failed incremental transfer makes the next
// snapshot to that member a full one, until a full one completes; a
// failure reported while a transfer is still in flight (the transport
// refusing a second one) changes nothing; the counters follow.
func TestReportedFallsBack(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := NewSnapshotter(Config{Registry: reg, Logger: zap.NewNop()})
	open := func(id uint64, kind string, n int64) *outgoing {
		out := &outgoing{kind: kind, index: 100}
		out.bytes.Store(n)
		s.send.mu.Lock()
		s.send.pending[id] = out
		s.send.mu.Unlock()
		return out
	}
	forced := func(id uint64) bool {
		s.send.mu.Lock()
		defer s.send.mu.Unlock()
		return s.send.forceFull[id]
	}
	out := open(2, KindIncremental, 500)
	s.reported(2, raft.SnapshotFailure) // still in flight: a refusal of another transfer
	if forced(2) {
		t.Fatal("a report during the transfer forced a full snapshot")
	}
	out.closed.Store(true)
	s.reported(2, raft.SnapshotFailure)
	if !forced(2) || forced(3) {
		t.Fatalf("after a failed incremental transfer: forced(2) %v forced(3) %v", forced(2), forced(3))
	}
	open(2, KindFull, 9000).closed.Store(true)
	s.reported(2, raft.SnapshotFinish)
	if forced(2) {
		t.Fatal("still forcing a full snapshot after one completed")
	}
	open(3, KindIncremental, 700).closed.Store(true)
	s.reported(3, raft.SnapshotFinish)
	s.reported(3, raft.SnapshotFinish) // nothing pending: ignored
	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"incremental sent", counterValue(t, reg, "strata_snapshot_sent_total", KindIncremental), 1},
		{"incremental bytes", counterValue(t, reg, "strata_snapshot_sent_bytes_total", KindIncremental), 700},
		{"incremental failures", counterValue(t, reg, "strata_snapshot_send_failures_total", KindIncremental), 1},
		{"full sent", counterValue(t, reg, "strata_snapshot_sent_total", KindFull), 1},
		{"full bytes", counterValue(t, reg, "strata_snapshot_sent_bytes_total", KindFull), 9000},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}
}

// counterValue reads the counter name{kind} from reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name, kind string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no counter %s{kind=%q}", name, kind)
	return 0
}
