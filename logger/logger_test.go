package logger

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/raftlog"
)

func entries(first, last, term uint64) []*raftpb.Entry {
	var out []*raftpb.Entry
	for i := first; i <= last; i++ {
		out = append(out, &raftpb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(term), Data: []byte{byte(i)}})
	}
	return out
}

// newDataDir returns a logger data directory holding cluster 0xc1, whose
// log holds [1, last] with commit committed, restarted after a snapshot at
// snapshotAt first if not 0.
func newDataDir(t *testing.T, snapshotAt, last, committed uint64) string {
	t.Helper()
	dir := t.TempDir()
	rec := &ClusterRecord{ClusterID: 0xc1, MemberID: 0x2, PeerURLs: []string{"http://127.0.0.1:1"}, Peers: map[uint64][]string{1: {"http://127.0.0.1:2"}}}
	if err := addCluster(vfs.Default, dir, rec); err != nil {
		t.Fatal(err)
	}
	l, err := raftlog.Open(raftlog.Options{FS: vfs.Default, Dirs: []string{filepath.Join(clusterDir(dir, 0xc1), logDirName)}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	first := uint64(1)
	if snapshotAt > 0 {
		meta := &raftpb.SnapshotMetadata{Index: proto.Uint64(snapshotAt), Term: proto.Uint64(1), ConfState: &raftpb.ConfState{Voters: []uint64{1}, Learners: []uint64{2}}}
		if err := l.ApplySnapshot(meta); err != nil {
			t.Fatal(err)
		}
		first = snapshotAt + 1
	}
	if err := l.Append(entries(first, last, 1), &raftpb.HardState{Term: proto.Uint64(1), Commit: proto.Uint64(committed)}); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestRecover(t *testing.T) {
	type refusal struct {
		name        string
		cluster     uint64
		first, last uint64
		want        codes.Code
		n           int // entries returned when want is OK
	}
	tests := []struct {
		name                        string
		snapshotAt, last, committed uint64
		cases                       []refusal
	}{
		{name: "whole log", last: 20, committed: 15, cases: []refusal{
			{name: "all committed", cluster: 0xc1, first: 1, last: 15, want: codes.OK, n: 15},
			{name: "one entry", cluster: 0xc1, first: 7, last: 7, want: codes.OK, n: 1},
			{name: "first > last", cluster: 0xc1, first: 8, last: 7, want: codes.InvalidArgument},
			{name: "first 0", cluster: 0xc1, first: 0, last: 7, want: codes.InvalidArgument},
			{name: "past the commit index", cluster: 0xc1, first: 10, last: 16, want: codes.OutOfRange},
			{name: "beyond the log", cluster: 0xc1, first: 100, last: 200, want: codes.OutOfRange},
			{name: "unknown cluster", cluster: 0xc2, first: 1, last: 2, want: codes.NotFound},
		}},
		{name: "after a gap", snapshotAt: 10, last: 20, committed: 20, cases: []refusal{
			{name: "after the gap", cluster: 0xc1, first: 11, last: 20, want: codes.OK, n: 10},
			{name: "across the gap", cluster: 0xc1, first: 5, last: 20, want: codes.OutOfRange},
			{name: "at the snapshot point", cluster: 0xc1, first: 10, last: 10, want: codes.OutOfRange},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := newDataDir(t, tt.snapshotAt, tt.last, tt.committed)
			l, err := Open(Config{DataDir: dir})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			for _, rc := range tt.cases {
				t.Run(rc.name, func(t *testing.T) {
					var got []*raftpb.Entry
					err := l.Recover(context.Background(), &RecoverRequest{ClusterID: rc.cluster, First: rc.first, Last: rc.last},
						func(r *RecoverResponse) error { got = append(got, r.Entries...); return nil })
					if status.Code(err) != rc.want {
						t.Fatalf("Recover [%d, %d]: %v, want %v", rc.first, rc.last, err, rc.want)
					}
					if rc.want != codes.OK {
						return
					}
					if len(got) != rc.n {
						t.Fatalf("Recover [%d, %d]: %d entries, want %d", rc.first, rc.last, len(got), rc.n)
					}
					for i, e := range got {
						if e.GetIndex() != rc.first+uint64(i) || e.GetData()[0] != byte(e.GetIndex()) {
							t.Fatalf("entry %d: index %d data %v", i, e.GetIndex(), e.GetData())
						}
					}
				})
			}
			st, err := l.Status(context.Background(), &StatusRequest{})
			if err != nil || len(st.Clusters) != 1 {
				t.Fatalf("Status: %v, %v", st, err)
			}
			c := st.Clusters[0]
			if c.FirstIndex != tt.snapshotAt+1 || c.LastIndex != tt.last || c.CommitIndex != tt.committed {
				t.Errorf("Status: %+v", c)
			}
			// The gap the snapshot left is found at open (reconciled).
			if wantGap := tt.snapshotAt > 0; wantGap != (len(c.Gaps) == 1) || (wantGap && (c.Gaps[0].SnapshotIndex != tt.snapshotAt || !c.Gaps[0].Reconciled)) {
				t.Errorf("Status gaps: %+v", c.Gaps)
			}
		})
	}
}

func TestOpenLocked(t *testing.T) {
	dir := newDataDir(t, 0, 3, 3)
	l, err := Open(Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Config{DataDir: dir}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: %v, want ErrLocked", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, err = Open(Config{DataDir: dir})
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	l.Close()
}

func TestJoinRecord(t *testing.T) {
	me := []string{"http://logger:2480"}
	list := func(cid uint64, ms ...*pb.Member) *pb.MemberListResponse {
		return &pb.MemberListResponse{Header: &pb.ResponseHeader{ClusterId: cid}, Members: ms}
	}
	m1 := &pb.Member{ID: 1, Name: "m1", PeerURLs: []string{"http://m1:2380"}}
	tests := []struct {
		name    string
		resp    *pb.MemberListResponse
		wantID  uint64
		wantErr string
	}{
		{name: "added as a learner", resp: list(0xc1, m1, &pb.Member{ID: 9, PeerURLs: me, IsLearner: true}), wantID: 9},
		{name: "not added", resp: list(0xc1, m1), wantErr: "add it first with etcdctl member add L1 --learner"},
		{name: "added as a voter", resp: list(0xc1, m1, &pb.Member{ID: 9, PeerURLs: me}), wantErr: "must be added as a learner"},
		{name: "no cluster ID", resp: list(0, m1), wantErr: "no cluster ID"},
		{name: "another cluster than named", resp: list(0xc2, m1, &pb.Member{ID: 9, PeerURLs: me, IsLearner: true}), wantErr: "answer for cluster c2, not c1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec, err := recordFor(tt.resp, JoinConfig{Name: "L1", AdvertisePeerURLs: me, ClusterID: 0xc1})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("recordFor: %v, want an error with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if rec.MemberID != tt.wantID || rec.ClusterID != 0xc1 || len(rec.Peers) != 1 || rec.Peers[1][0] != "http://m1:2380" {
				t.Fatalf("record %+v", rec)
			}
		})
	}
	// A cluster is joined once.
	dir := t.TempDir()
	rec, _ := recordFor(tests[0].resp, JoinConfig{AdvertisePeerURLs: me})
	if err := addCluster(vfs.Default, dir, rec); err != nil {
		t.Fatal(err)
	}
	if err := addCluster(vfs.Default, dir, rec); !errors.Is(err, ErrAlreadyJoined) {
		t.Fatalf("second addCluster: %v, want ErrAlreadyJoined", err)
	}
	got, err := readRecord(vfs.Default, clusterDir(dir, 0xc1))
	if err != nil || got.MemberID != 9 {
		t.Fatalf("readRecord: %+v, %v", got, err)
	}
	// A join left half-built (a crash) is not a cluster.
	if err := vfs.Default.MkdirAll(filepath.Join(clustersDir(dir), joinPrefix+"c2"), 0o700); err != nil {
		t.Fatal(err)
	}
	if ids, err := listClusters(vfs.Default, dir); err != nil || len(ids) != 1 || ids[0] != 0xc1 {
		t.Fatalf("listClusters: %v, %v", ids, err)
	}
}

func TestAPIRoundTrip(t *testing.T) {
	at := time.Unix(1700000000, 42).UTC()
	msgs := []message{
		&StatusRequest{ClusterID: 0xc1},
		&StatusResponse{Clusters: []*ClusterStatus{{ClusterID: 1, MemberID: 2, FirstIndex: 3, LastIndex: 4, CommitIndex: 5, Bytes: 6,
			LeaderCommit: 7, Lag: 8, Leader: 9, Gaps: []Gap{{SnapshotIndex: 10, SnapshotTerm: 11, DiscardedFirst: 1, DiscardedLast: 9, At: at}, {SnapshotIndex: 20, Reconciled: true, At: at}}}}},
		&StatusResponse{Clusters: []*ClusterStatus{{ClusterID: 1, CompactedFirst: 1, CompactedLast: 400, CompactedBatches: 2,
			CompactedBytes: 5000, CompactedEntries: 400, CompactedRecords: 12, Compaction: "on"}}},
		&RecoverRequest{ClusterID: 1, First: 2, Last: 3},
		&RecoverRequest{ClusterID: 1, First: 2, Last: 3, AcceptBatches: true},
		&RecoverResponse{Entries: entries(5, 7, 3)},
		&RecoverResponse{Batches: []*raftlog.CompactedBatch{{FirstIndex: 1, LastIndex: 200, LastTerm: 2, Records: 3, PayloadFormat: 3, Payload: []byte("payload")}}},
	}
	for _, m := range msgs {
		b, err := codec{}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var got message
		switch m.(type) {
		case *StatusRequest:
			got = &StatusRequest{}
		case *StatusResponse:
			got = &StatusResponse{}
		case *RecoverRequest:
			got = &RecoverRequest{}
		case *RecoverResponse:
			got = &RecoverResponse{}
		}
		if err := (codec{}).Unmarshal(b, got); err != nil {
			t.Fatal(err)
		}
		b2, _ := got.marshal()
		if string(b) != string(b2) || !reflect.DeepEqual(m, got) {
			t.Fatalf("%T does not round-trip: %+v, got %+v", m, m, got)
		}
	}
}

func FuzzAPIDecode(f *testing.F) {
	for _, m := range []message{&StatusResponse{Clusters: []*ClusterStatus{{ClusterID: 1, Gaps: []Gap{{SnapshotIndex: 2}}}}}, &RecoverResponse{Entries: entries(1, 2, 1)}} {
		b, _ := m.marshal()
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, m := range []message{&StatusRequest{}, &StatusResponse{}, &RecoverRequest{}, &RecoverResponse{}} {
			_ = m.unmarshal(b)
		}
	})
}

func TestTruncationPoint(t *testing.T) {
	voters := []uint64{1, 2, 3}
	tests := []struct {
		name     string
		requests map[uint64]uint64
		want     uint64
	}{
		{name: "none", requests: map[uint64]uint64{}, want: 0},
		{name: "one of three", requests: map[uint64]uint64{1: 50}, want: 0},
		{name: "two of three: the lower", requests: map[uint64]uint64{1: 50, 2: 40}, want: 40},
		{name: "three of three: the second highest", requests: map[uint64]uint64{1: 50, 2: 40, 3: 90}, want: 50},
		{name: "a learner does not count", requests: map[uint64]uint64{1: 50, 7: 40}, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := truncationPoint(tt.requests, voters); got != tt.want {
				t.Fatalf("truncationPoint(%v) = %d, want %d", tt.requests, got, tt.want)
			}
		})
	}
	if got := truncationPoint(map[uint64]uint64{1: 5}, nil); got != 0 {
		t.Fatalf("no voters: %d", got)
	}
}

// TestTruncate runs a logger (no leader reachable: its log is what
// newDataDir wrote) and truncates it through the API: one voter of three
// trims nothing, two trim at the lower index, never past the commit index,
// and a restart keeps the requests and finds no gap in the truncation.
func TestTruncate(t *testing.T) {
	dir := newDataDir(t, 0, 30, 25)
	rec, err := readRecord(vfs.Default, clusterDir(dir, 0xc1))
	if err != nil {
		t.Fatal(err)
	}
	rec.Voters = []uint64{1, 3, 4}
	if err := writeRecord(vfs.Default, clusterDir(dir, 0xc1), rec); err != nil {
		t.Fatal(err)
	}
	start := func() *Logger {
		l, err := Open(Config{DataDir: dir, ListenPeerURLs: []string{"http://127.0.0.1:0"}, ListenClientURLs: []string{"http://127.0.0.1:0"}, TickInterval: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		return l
	}
	l := start()
	firstIndex := func(want uint64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			st, err := l.Status(context.Background(), &StatusRequest{ClusterID: 0xc1})
			if err != nil {
				t.Fatal(err)
			}
			if got := st.Clusters[0].FirstIndex; got == want {
				return
			} else if time.Now().After(deadline) {
				t.Fatalf("first index %d, want %d", got, want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	ctx := context.Background()
	refusals := []struct {
		name string
		req  *TruncateRequest
		want codes.Code
	}{
		{name: "unknown cluster", req: &TruncateRequest{ClusterID: 0xc2, MemberID: 1, Index: 5}, want: codes.NotFound},
		{name: "index 0", req: &TruncateRequest{ClusterID: 0xc1, MemberID: 1, Index: 0}, want: codes.InvalidArgument},
		{name: "not a member", req: &TruncateRequest{ClusterID: 0xc1, MemberID: 9, Index: 5}, want: codes.FailedPrecondition},
	}
	for _, tt := range refusals {
		if _, err := l.Truncate(ctx, tt.req); status.Code(err) != tt.want {
			t.Errorf("%s: Truncate: %v, want %v", tt.name, err, tt.want)
		}
	}
	resp, err := l.Truncate(ctx, &TruncateRequest{ClusterID: 0xc1, MemberID: 1, Index: 20})
	if err != nil || resp.TruncationPoint != 0 {
		t.Fatalf("Truncate from one voter of three: %+v, %v", resp, err)
	}
	time.Sleep(20 * time.Millisecond)
	firstIndex(1)
	resp, err = l.Truncate(ctx, &TruncateRequest{ClusterID: 0xc1, MemberID: 3, Index: 10})
	if err != nil || resp.TruncationPoint != 10 || len(resp.Truncations) != 2 {
		t.Fatalf("Truncate from two voters of three: %+v, %v", resp, err)
	}
	firstIndex(11)
	err = l.Recover(ctx, &RecoverRequest{ClusterID: 0xc1, First: 5, Last: 15}, func(*RecoverResponse) error { return nil })
	if status.Code(err) != codes.OutOfRange || !strings.Contains(err.Error(), "truncated at the request of a majority") {
		t.Fatalf("Recover of a truncated range: %v", err)
	}
	// Past the commit index (25): the log keeps what is not committed.
	if _, err := l.Truncate(ctx, &TruncateRequest{ClusterID: 0xc1, MemberID: 4, Index: 29}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Truncate(ctx, &TruncateRequest{ClusterID: 0xc1, MemberID: 3, Index: 28}); err != nil {
		t.Fatal(err)
	}
	firstIndex(26)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = start()
	defer l.Close()
	st, err := l.Status(ctx, &StatusRequest{ClusterID: 0xc1})
	if err != nil {
		t.Fatal(err)
	}
	c := st.Clusters[0]
	if c.FirstIndex != 26 || len(c.Gaps) != 0 || c.TruncationPoint != 28 || len(c.Truncations) != 3 {
		t.Fatalf("after a restart: %+v", c)
	}
}
