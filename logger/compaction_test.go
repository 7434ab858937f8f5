package logger

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/apply"
	pebbleengine "github.com/strata-kv/strata/engine/pebble"
	"github.com/strata-kv/strata/internal/testutil"
	"github.com/strata-kv/strata/lease"
	"github.com/strata-kv/strata/logcompact"
	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/node"
	"github.com/strata-kv/strata/raftlog"
)

// clusterLog is a cluster's log as a leader would send it: the bootstrap
// membership (a voter, the logger as a learner), then puts cycling over
// keys, a lease grant and a put attached to it, a delete, an auth request
// (kept verbatim by the logger's batches), a revision compaction.
func clusterLog(t *testing.T, puts, keys int) []*raftpb.Entry {
	t.Helper()
	var ents []*raftpb.Entry
	add := func(typ raftpb.EntryType, data []byte) {
		ents = append(ents, &raftpb.Entry{Index: proto.Uint64(uint64(len(ents) + 1)), Term: proto.Uint64(1), Type: typ.Enum(), Data: data})
	}
	conf := func(typ raftpb.ConfChangeType, id uint64, name string) {
		m, _ := proto.Marshal(&pb.Member{ID: id, Name: name, PeerURLs: []string{fmt.Sprintf("http://127.0.0.1:%d", id)}})
		cc, _ := proto.Marshal(&raftpb.ConfChange{Type: typ.Enum(), NodeId: proto.Uint64(id), Context: m})
		add(raftpb.EntryConfChange, cc)
	}
	req := func(r *pb.InternalRaftRequest) {
		r.Header = &pb.RequestHeader{ID: uint64(len(ents) + 1)}
		raw, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		add(raftpb.EntryNormal, raw)
	}
	conf(raftpb.ConfChangeAddNode, 1, "m1")
	conf(raftpb.ConfChangeAddLearnerNode, 2, "logger")
	add(raftpb.EntryNormal, nil) // the leader's empty entry
	for i := 0; i < puts; i++ {
		switch i {
		case puts / 4:
			req(&pb.InternalRaftRequest{LeaseGrant: &pb.LeaseGrantRequest{ID: 77, TTL: 600}})
			req(&pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte("leased"), Value: []byte("x"), Lease: 77}})
		case puts / 3:
			req(&pb.InternalRaftRequest{DeleteRange: &pb.DeleteRangeRequest{Key: []byte("k1")}})
		case puts / 2:
			req(&pb.InternalRaftRequest{AuthUserAdd: &pb.AuthUserAddRequest{Name: "u"}})
			req(&pb.InternalRaftRequest{Compaction: &pb.CompactionRequest{Revision: int64(puts / 4)}})
		}
		req(&pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte(fmt.Sprintf("k%d", i%keys)), Value: []byte(fmt.Sprintf("value %d %s", i, strings.Repeat("x", 200)))}})
	}
	return ents
}

// testStore is a store applying entries and batches as a restore does.
type testStore struct {
	t     *testing.T
	eng   *pebbleengine.Engine
	store *mvcc.Store
}

func newTestStore(t *testing.T) *testStore {
	eng, err := pebbleengine.Open(t.TempDir(), pebbleengine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	store, err := mvcc.Open(eng, mvcc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	store.Start()
	t.Cleanup(func() { _ = store.Close(); _ = eng.Close() })
	return &testStore{t: t, eng: eng, store: store}
}

func (s *testStore) applyEntries(ents []*raftpb.Entry) {
	s.t.Helper()
	lessor := lease.New(lease.Config{MinTTL: 1})
	if err := lessor.Load(s.store); err != nil {
		s.t.Fatal(err)
	}
	app, err := apply.New(apply.Config{Store: s.store, Lessor: lessor})
	if err != nil {
		s.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in := make(chan node.Committed)
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, in) }()
	in <- node.Committed{Entries: ents}
	if err := app.WaitApplied(context.Background(), ents[len(ents)-1].GetIndex()); err != nil {
		s.t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		s.t.Fatal(err)
	}
}

func (s *testStore) replay(b *logcompact.Batch) {
	s.t.Helper()
	rep, err := apply.New(apply.Config{Store: s.store})
	if err != nil {
		s.t.Fatal(err)
	}
	if _, err := logcompact.Replay(rep, []*logcompact.Batch{b}, logcompact.RecoveryNaive, s.store.CompactRev(), 1); err != nil {
		s.t.Fatal(err)
	}
}

// state is every key's current version and the revision.
func (s *testStore) state() string {
	s.t.Helper()
	resp, err := s.store.Range(&pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}})
	if err != nil {
		s.t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "rev %d applied %d\n", s.store.Rev(), s.store.AppliedIndex())
	for _, kv := range resp.Kvs {
		fmt.Fprintf(&b, "%s create %d mod %d version %d lease %d value %q\n", kv.Key, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease, kv.Value)
	}
	return b.String()
}

// TestLogCompaction: a logger with log compaction rewrites a cluster's
// committed log as compacted batches (membership changes, the auth request
// and the lease grant kept in them), holds far fewer bytes and records than
// entries, reports it in Status, refuses the compacted range to an
// entries-only client and to CatchUp, and serves batches then entries to
// RecoverBatches, from which a store reaches exactly the state of a store
// that applied every entry; after a restart (its compaction state
// reopened) it goes on.
func TestLogCompaction(t *testing.T) {
	ctx := context.Background()
	const puts, keys = 3000, 5
	ents := clusterLog(t, puts, keys)
	last := uint64(len(ents))
	dir := t.TempDir()
	rec := &ClusterRecord{ClusterID: 0xc1, MemberID: 2, PeerURLs: []string{"http://127.0.0.1:1"}, Peers: map[uint64][]string{1: {"http://127.0.0.1:2"}}, Voters: []uint64{1}}
	if err := addCluster(vfs.Default, dir, rec); err != nil {
		t.Fatal(err)
	}
	lg, err := raftlog.Open(raftlog.Options{FS: vfs.Default, Dirs: []string{filepath.Join(clusterDir(dir, 0xc1), logDirName)}, SegmentSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(ents); i += 100 {
		chunk := ents[i:min(i+100, len(ents))]
		if err := lg.Append(chunk, &raftpb.HardState{Term: proto.Uint64(1), Commit: proto.Uint64(chunk[len(chunk)-1].GetIndex())}); err != nil {
			t.Fatal(err)
		}
	}
	uncompacted := uint64(lg.Stats().Bytes)
	_ = lg.Close()

	url := fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePorts(t, 1)[0])
	cfg := Config{DataDir: dir, ListenPeerURLs: []string{"http://127.0.0.1:0"}, ListenClientURLs: []string{url},
		SegmentSize:   64 << 10,
		LogCompaction: logcompact.Config{Enabled: true, HistoryLatest: true, BatchEntries: 200, Interval: 10 * time.Millisecond}}
	start := func() *Logger {
		l, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return l
	}
	l := start()
	c, err := Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var st *ClusterStatus
	wantLast := last / 200 * 200
	deadline := time.Now().Add(20 * time.Second)
	for {
		sts, err := c.Status(ctx, 0xc1)
		if err != nil {
			t.Fatal(err)
		}
		st = sts[0]
		if st.CompactedLast >= wantLast {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no compaction up to %d: %+v", wantLast, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("status: %+v; uncompacted log %d bytes", st, uncompacted)
	if st.Compaction != "on" || st.FirstIndex != 1 || st.CompactedFirst != 1 || st.CompactedEntries != wantLast ||
		st.CompactedBatches != wantLast/200 || st.CommitIndex != last {
		t.Errorf("status %+v: want compaction on, batches of 200 standing for 1-%d, commit %d", st, wantLast, last)
	}
	if st.CompactedRecords*10 > st.CompactedEntries {
		t.Errorf("%d records for %d entries: want at most a tenth", st.CompactedRecords, st.CompactedEntries)
	}
	if held := st.CompactedBytes + st.Bytes; held*4 > uncompacted {
		t.Errorf("the compacted log holds %d bytes (batches %d, segments %d), the log %d: want at most a quarter", held, st.CompactedBytes, st.Bytes, uncompacted)
	}

	// Entries only: refused, and CatchUp too.
	err = c.Recover(ctx, 0xc1, 1, last, func([]*raftpb.Entry) error { return nil })
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "compacted batches") {
		t.Errorf("Recover of a compacted range, entries only: %v; want FailedPrecondition", err)
	}
	memberLog, err := raftlog.Open(raftlog.Options{FS: vfs.Default, Dirs: []string{t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	defer memberLog.Close()
	if _, err := CatchUp(ctx, url, 0xc1, memberLog); !errors.Is(err, ErrCatchUp) || !strings.Contains(err.Error(), "compacted batches") {
		t.Errorf("CatchUp from a compacted log: %v; want ErrCatchUp naming the batches", err)
	}
	if n, _ := memberLog.LastIndex(); n != 0 {
		t.Errorf("a refused CatchUp left entries up to %d", n)
	}

	want := newTestStore(t)
	want.applyEntries(ents)
	check := func(from uint64) {
		t.Helper()
		got := newTestStore(t)
		if from > 1 {
			got.applyEntries(ents[:from-1])
		}
		var batches, entries int
		err := c.RecoverBatches(ctx, 0xc1, from, last, func(it RecoverItem) error {
			if it.Batch != nil {
				if entries > 0 {
					return errors.New("a batch after entries")
				}
				batches++
				got.replay(it.Batch)
				return nil
			}
			entries += len(it.Entries)
			got.applyEntries(it.Entries)
			return nil
		})
		if err != nil {
			t.Fatalf("RecoverBatches from %d: %v", from, err)
		}
		if batches == 0 || uint64(entries) != last-wantLast {
			t.Errorf("RecoverBatches from %d: %d batches and %d entries, want batches and the %d entries after %d", from, batches, entries, last-wantLast, wantLast)
		}
		if g, w := got.state(), want.state(); g != w {
			t.Errorf("state after batches and entries from %d:\n%s\nwant (every entry applied):\n%s", from, g, w)
		}
	}
	check(1)
	check(555) // inside a batch: its records before 555 are skipped

	// A restart reopens the compaction state and goes on.
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = start()
	defer l.Close()
	sts, err := c.Status(ctx, 0xc1)
	if err != nil || sts[0].CompactedLast != st.CompactedLast || sts[0].Compaction != "on" {
		t.Fatalf("status after a restart: %+v, %v", sts, err)
	}
	check(1)
}
