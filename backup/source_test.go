package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/internal/testutil"
	"github.com/strata-kv/strata/logger"
	"github.com/strata-kv/strata/raftlog"
)

// startLogger runs a real logger (package logger, its gRPC API on a
// loopback port) whose data directory holds cluster clusterID's log: the
// entries ents, committed up to commit, after a snapshot point at
// snapshotAt (the logger holds nothing at or below it: a gap, or the
// entries before it joined). The directory is written in the layout
// docs/logger.md documents (cluster.json, log/ a raftlog), as `strata
// logger join` and the learner write it. It returns a client of it.
func startLogger(t *testing.T, clusterID uint64, ents []*raftpb.Entry, snapshotAt, commit uint64) (*logger.Client, string) {
	t.Helper()
	dir := t.TempDir()
	cdir := filepath.Join(dir, "clusters", strconv.FormatUint(clusterID, 16))
	if err := os.MkdirAll(cdir, 0o700); err != nil {
		t.Fatal(err)
	}
	rec, err := json.Marshal(logger.ClusterRecord{ClusterID: clusterID, MemberID: 0x99, PeerURLs: []string{"http://127.0.0.1:1"},
		Peers: map[uint64][]string{1: {"http://127.0.0.1:2"}}, Voters: []uint64{1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cdir, "cluster.json"), rec, 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := raftlog.Open(raftlog.Options{FS: vfs.Default, Dirs: []string{filepath.Join(cdir, "log")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := log.ApplySnapshot(&raftpb.SnapshotMetadata{Index: proto.Uint64(snapshotAt), Term: proto.Uint64(1),
		ConfState: &raftpb.ConfState{Voters: []uint64{1}, Learners: []uint64{0x99}}}); err != nil {
		t.Fatal(err)
	}
	var held []*raftpb.Entry
	for _, e := range ents {
		if e.GetIndex() > snapshotAt {
			held = append(held, e)
		}
	}
	if err := log.Append(held, &raftpb.HardState{Term: proto.Uint64(1), Commit: proto.Uint64(commit)}); err != nil {
		t.Fatal(err)
	}
	if err := log.Close(); err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePorts(t, 1)[0])
	l, err := logger.Open(logger.Config{DataDir: dir, ListenPeerURLs: []string{fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePorts(t, 1)[0])},
		ListenClientURLs: []string{url}})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	c, err := logger.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, url
}

// TestPointInTimeFromLogger: a logger's Recover stream as the source of a
// point-in-time restore, with no archived log in the target: every
// revision from the oldest version's to the last committed entry's, and
// every index, restores to what the live store answered (keys, revisions,
// HashKV). A logger holding the log from after a gap, or committed only up
// to some index, or another cluster's log, is refused naming what it holds.
func TestPointInTimeFromLogger(t *testing.T) {
	ctx := context.Background()
	m := newMember(t)
	a := newApplied(t, m)
	target := fileTarget(t)
	b := newBackuper(t, m, target)
	for i := range 5 {
		a.propose(put(fmt.Sprintf("k%d", i), fmt.Sprint("v", i), 0))
	}
	v1, err := b.Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a.propose(put("k1", "changed", 0))
	a.propose(&pb.InternalRaftRequest{DeleteRange: &pb.DeleteRangeRequest{Key: []byte("k2")}})
	a.propose(&pb.InternalRaftRequest{LeaseGrant: &pb.LeaseGrantRequest{ID: 7, TTL: 60}})
	a.propose(put("leased", "x", 7))
	v2, err := b.Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a.propose(&pb.InternalRaftRequest{Txn: &pb.TxnRequest{
		Compare: []*pb.Compare{{Key: []byte("k3"), Target: pb.Compare_VERSION, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_Version{Version: 1}}},
		Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("k3"), Value: []byte("txn")}}}},
	}})
	a.propose(&pb.InternalRaftRequest{LeaseRevoke: &pb.LeaseRevokeRequest{ID: 7}})
	a.propose(put("k0", "last", 0))
	last, lastIndex := m.store.Rev(), a.app.AppliedIndex()
	if l, err := ArchivedLog(ctx, target); err != nil || len(l) != 0 {
		t.Fatalf("archived log %v, %v: the test wants none", l, err)
	}
	ents := a.log.ents
	first := ents[0].GetIndex()
	whole, url := startLogger(t, uint64(testID.ClusterID), ents, first-1, lastIndex)
	src := LoggerSource{Client: whole, Endpoint: url}

	restore := func(src EntrySource, rev int64, index uint64) (RestoreResult, string, error) {
		t.Helper()
		dir := filepath.Join(t.TempDir(), "restored")
		cfg := restoreConfig(dir, 0)
		cfg.ToRevision, cfg.ToIndex, cfg.Source = rev, index, src
		res, err := Restore(ctx, target, cfg)
		if err != nil {
			if _, serr := os.Stat(dir); serr == nil {
				t.Errorf("a refused restore left %s", dir)
			}
			return res, "", err
		}
		s := openRestored(t, dir)
		return res, answer(t, s.Rev(), kvs(t, s), s.HashKV), nil
	}
	for rev := v1.Revision; rev <= last; rev++ {
		res, got, err := restore(src, rev, 0)
		if err != nil {
			t.Errorf("restore to revision %d from the logger: %v", rev, err)
			continue
		}
		if got != a.states[rev] {
			t.Errorf("restored to revision %d from the logger:\n%s\nthe live store answered:\n%s", rev, got, a.states[rev])
		}
		if (rev == res.Manifest.Revision) != (res.ReplayedTo == 0) || (res.ReplayedTo != 0 && res.Source != src.String()) {
			t.Errorf("revision %d: version %d, replayed to %d from %q", rev, res.Manifest.Version, res.ReplayedTo, res.Source)
		}
	}
	// Every index: a version's own, or the version before it and the
	// entries up to it.
	for i := v1.RaftIndex; i <= lastIndex; i++ {
		res, _, err := restore(src, 0, i)
		if err != nil {
			t.Errorf("restore to index %d from the logger: %v", i, err)
			continue
		}
		if res.ReplayedTo != i && (res.ReplayedTo != 0 || res.Manifest.RaftIndex != i) {
			t.Errorf("restore to index %d: version %d (index %d), replayed to %d", i, res.Manifest.Version, res.Manifest.RaftIndex, res.ReplayedTo)
		}
	}
	// The archive, empty, holds nothing after version 2.
	if _, _, err := restore(nil, last, 0); !errors.Is(err, ErrRevisionRange) || !strings.Contains(err.Error(), "holds committed entries nothing") {
		t.Errorf("restore from the empty archive = %v, want ErrRevisionRange naming nothing held", err)
	}

	refusals := []struct {
		name       string
		src        func() EntrySource
		rev        int64
		index      uint64
		want       error
		wantInText string
	}{
		{name: "beyond the last committed entry", src: func() EntrySource { return src }, rev: last + 1, want: ErrRevisionRange,
			wantInText: fmt.Sprintf("holds committed entries %d-%d", first, lastIndex)},
		{name: "index beyond", src: func() EntrySource { return src }, index: lastIndex + 1, want: ErrIndexRange,
			wantInText: fmt.Sprintf("holds committed entries %d-%d", first, lastIndex)},
		{name: "before the oldest version", src: func() EntrySource { return src }, rev: v1.Revision - 1, want: ErrRevisionRange},
		{name: "committed only up to version 2's index", src: func() EntrySource {
			c, url := startLogger(t, uint64(testID.ClusterID), ents, first-1, v2.RaftIndex+1)
			return LoggerSource{Client: c, Endpoint: url}
		}, rev: last, want: ErrRevisionRange, wantInText: fmt.Sprintf("holds committed entries %d-%d", first, v2.RaftIndex+1)},
		{name: "a gap after version 1", src: func() EntrySource {
			c, url := startLogger(t, uint64(testID.ClusterID), ents, v1.RaftIndex+2, lastIndex)
			return LoggerSource{Client: c, Endpoint: url}
		}, rev: v1.Revision + 1, want: ErrNotHeld, wantInText: fmt.Sprintf("needs entry %d on; the logger at http://127.0.0.1:", v1.RaftIndex+1)},
		{name: "another cluster's logger", src: func() EntrySource {
			c, url := startLogger(t, 0xc2, ents, first-1, lastIndex)
			return LoggerSource{Client: c, Endpoint: url}
		}, rev: last, want: ErrNotHeld, wantInText: "serves no cluster c1 (it serves: c2)"},
		{name: "another cluster named", src: func() EntrySource { return LoggerSource{Client: whole, Endpoint: url, ClusterID: 0xc2} },
			rev: last, want: ErrNotHeld, wantInText: "taken of cluster c1, the logger's cluster was named c2"},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := restore(tt.src(), tt.rev, tt.index)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.wantInText) {
				t.Errorf("restore: %v, want %v with %q", err, tt.want, tt.wantInText)
			}
		})
	}
	// After the gap the logger still serves a restore from version 2.
	c, gapURL := startLogger(t, uint64(testID.ClusterID), ents, v1.RaftIndex+2, lastIndex)
	if v2.RaftIndex < v1.RaftIndex+2 {
		t.Fatalf("version 2 at index %d, within the gap", v2.RaftIndex)
	}
	if _, got, err := restore(LoggerSource{Client: c, Endpoint: gapURL}, last, 0); err != nil || got != a.states[last] {
		t.Errorf("restore after the gap to revision %d: %v\n%s\nwant\n%s", last, err, got, a.states[last])
	}
}

// TestPointInTimeToIndex: a restore to a raft index gives the state the
// live store had right after that entry (keys, revisions, HashKV), for
// every index from the oldest version's on, from the archived log and from
// a logger alike; an index before the oldest version or past the log is
// refused.
func TestPointInTimeToIndex(t *testing.T) {
	ctx := context.Background()
	m := newMember(t)
	a := newApplied(t, m)
	target := fileTarget(t)
	b := newBackuper(t, m, target)
	byIndex := map[uint64]string{}
	propose := func(req *pb.InternalRaftRequest) {
		t.Helper()
		a.propose(req)
		byIndex[a.app.AppliedIndex()] = answer(t, m.store.Rev(), kvs(t, m.store), m.store.HashKV)
	}
	propose(put("a", "1", 0))
	v1, err := b.Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byIndex[v1.RaftIndex] = answer(t, m.store.Rev(), kvs(t, m.store), m.store.HashKV)
	propose(put("b", "1", 0))
	propose(&pb.InternalRaftRequest{LeaseGrant: &pb.LeaseGrantRequest{ID: 9, TTL: 60}})
	propose(put("a", "2", 9))
	propose(&pb.InternalRaftRequest{Compaction: &pb.CompactionRequest{Revision: m.store.Rev() - 1}})
	propose(&pb.InternalRaftRequest{DeleteRange: &pb.DeleteRangeRequest{Key: []byte("b")}})
	propose(put("c", "1", 0))
	if _, err := b.ArchiveLog(ctx, a.log, a.app.AppliedIndex(), nil); err != nil {
		t.Fatal(err)
	}
	lastIndex := a.app.AppliedIndex()
	ents := a.log.ents
	c, url := startLogger(t, uint64(testID.ClusterID), ents, ents[0].GetIndex()-1, lastIndex)
	sources := []EntrySource{nil, LoggerSource{Client: c, Endpoint: url}}
	for _, src := range sources {
		for i := v1.RaftIndex; i <= lastIndex; i++ {
			dir := filepath.Join(t.TempDir(), "restored")
			cfg := restoreConfig(dir, 0)
			cfg.ToIndex, cfg.Source = i, src
			res, err := Restore(ctx, target, cfg)
			if err != nil {
				t.Errorf("restore to index %d (source %v): %v", i, src, err)
				continue
			}
			s := openRestored(t, dir)
			if got := answer(t, s.Rev(), kvs(t, s), s.HashKV); got != byIndex[i] {
				t.Errorf("restored to index %d from %s:\n%s\nthe live store answered:\n%s", i, res.Source, got, byIndex[i])
			}
		}
		for _, i := range []uint64{v1.RaftIndex - 1, lastIndex + 1} {
			cfg := restoreConfig(filepath.Join(t.TempDir(), "restored"), 0)
			cfg.ToIndex, cfg.Source = i, src
			if _, err := Restore(ctx, target, cfg); !errors.Is(err, ErrIndexRange) {
				t.Errorf("restore to index %d (source %v) = %v, want ErrIndexRange", i, src, err)
			}
		}
	}
}
