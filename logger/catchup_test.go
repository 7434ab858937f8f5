package logger

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/internal/testutil"
	"github.com/strata-kv/strata/raftlog"
)

// TestCatchUp: a running logger's committed entries fill a member's empty
// raftlog through the API (index, term, data, the HardState's commit at the
// last), a log that holds entries is left alone, and a logger that holds
// the log only after a gap, or another cluster, is refused naming what it
// holds.
func TestCatchUp(t *testing.T) {
	ctx := context.Background()
	serve := func(snapshotAt, last, committed uint64) string {
		dir := newDataDir(t, snapshotAt, last, committed)
		url := fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePorts(t, 1)[0])
		l, err := Open(Config{DataDir: dir, ListenPeerURLs: []string{"http://127.0.0.1:0"}, ListenClientURLs: []string{url}})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return url
	}
	openLog := func() *raftlog.Log {
		lg, err := raftlog.Open(raftlog.Options{FS: vfs.Default, Dirs: []string{filepath.Join(t.TempDir(), "log")}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lg.Close() })
		return lg
	}

	url := serve(0, 20, 15)
	lg := openLog()
	res, err := CatchUp(ctx, url, 0xc1, lg)
	if err != nil || res.Last != 15 || res.Entries != 15 || res.Term != 1 {
		t.Fatalf("CatchUp: %+v, %v; want entries 1-15", res, err)
	}
	hs, _, err := lg.InitialState()
	if err != nil || hs.GetCommit() != 15 || hs.GetTerm() != 1 || hs.GetVote() != 0 {
		t.Errorf("HardState %v, %v; want term 1, commit 15, no vote", hs, err)
	}
	ents, err := lg.Entries(1, 16, 1<<30)
	if err != nil || len(ents) != 15 {
		t.Fatalf("entries %d, %v", len(ents), err)
	}
	for i, e := range ents {
		if e.GetIndex() != uint64(i+1) || e.GetTerm() != 1 || e.GetData()[0] != byte(i+1) {
			t.Errorf("entry %d: %v", i+1, e)
		}
	}
	// A log that holds entries is a restart: nothing is done.
	if res, err := CatchUp(ctx, url, 0xc1, lg); err != nil || res.Entries != 0 {
		t.Errorf("CatchUp into a log that holds entries: %+v, %v; want nothing done", res, err)
	}

	for _, tt := range []struct {
		name    string
		url     string
		cluster uint64
		want    string
	}{
		{name: "after a gap", url: serve(10, 20, 20), cluster: 0xc1, want: "holds committed entries 11-20 of cluster c1"},
		{name: "another cluster", url: url, cluster: 0xc2, want: "NotFound"},
		{name: "no logger", url: fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePorts(t, 1)[0]), cluster: 0xc1, want: "Unavailable"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lg := openLog()
			_, err := CatchUp(ctx, tt.url, tt.cluster, lg)
			if !errors.Is(err, ErrCatchUp) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("CatchUp: %v, want ErrCatchUp with %q", err, tt.want)
			}
			if last, _ := lg.LastIndex(); last != 0 {
				t.Errorf("a refused catch-up left entries up to %d", last)
			}
		})
	}
}

// TestCatchUpRestart: a member restarting with its log kept is brought up
// to the logger's commit index with committed entries only: entries it
// holds already (same index and term) are skipped, an uncommitted tail
// that differs is replaced, its term and vote are kept unless an entry's
// term is higher; a logger not ahead of it is no catch-up, and a logger
// that does not hold the entries after its commit index is refused with
// the log left as it was.
func TestCatchUpRestart(t *testing.T) {
	ctx := context.Background()
	// serve starts a logger on dir (from newDataDir), after replacing its
	// log from index replaceFrom on with term-2 entries to index 20,
	// committed up to 18, if replaceFrom is not 0.
	serve := func(dir string, replaceFrom uint64) string {
		if replaceFrom != 0 {
			l, err := raftlog.Open(raftlog.Options{FS: vfs.Default, Dirs: []string{filepath.Join(clusterDir(dir, 0xc1), logDirName)}})
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Append(entries(replaceFrom, 20, 2), &raftpb.HardState{Term: proto.Uint64(2), Commit: proto.Uint64(18)}); err != nil {
				t.Fatal(err)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
		}
		url := fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePorts(t, 1)[0])
		l, err := Open(Config{DataDir: dir, ListenPeerURLs: []string{"http://127.0.0.1:0"}, ListenClientURLs: []string{url}})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return url
	}
	// The logger holds 1-10 in term 1 and 11-20 in term 2, 1-18 committed.
	logger := serve(newDataDir(t, 0, 20, 10), 11)
	// gapLogger holds 11-20 in term 1, all committed.
	gapLogger := serve(newDataDir(t, 10, 20, 20), 0)
	cat := func(ents ...[]*raftpb.Entry) []*raftpb.Entry {
		var out []*raftpb.Entry
		for _, e := range ents {
			out = append(out, e...)
		}
		return out
	}
	hardState := func(term, vote, commit uint64) *raftpb.HardState {
		return &raftpb.HardState{Term: proto.Uint64(term), Vote: proto.Uint64(vote), Commit: proto.Uint64(commit)}
	}
	for _, tt := range []struct {
		name   string
		logger string
		log    []*raftpb.Entry
		hs     *raftpb.HardState
		// want: entries appended, the log's last index and the term of
		// each entry after, and the HardState; wantErr refuses instead.
		appended  uint64
		wantTerms []uint64
		wantHS    *raftpb.HardState
		wantErr   string
	}{
		{name: "behind", logger: logger, log: entries(1, 5, 1), hs: hardState(1, 0, 5),
			appended: 13, wantTerms: []uint64{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2}, wantHS: hardState(2, 0, 18)},
		{name: "uncommitted tail replaced", logger: logger, log: entries(1, 12, 1), hs: hardState(1, 3, 8),
			appended: 8, wantTerms: []uint64{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2}, wantHS: hardState(2, 0, 18)},
		{name: "matching tail skipped", logger: logger, log: cat(entries(1, 10, 1), entries(11, 14, 2)), hs: hardState(2, 1, 10),
			appended: 4, wantTerms: []uint64{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2}, wantHS: hardState(2, 1, 18)},
		{name: "a higher term and its vote kept", logger: logger, log: entries(1, 10, 1), hs: hardState(5, 3, 10),
			appended: 8, wantTerms: []uint64{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2}, wantHS: hardState(5, 3, 18)},
		{name: "not behind the logger", logger: logger, log: cat(entries(1, 10, 1), entries(11, 19, 2)), hs: hardState(2, 0, 18),
			wantTerms: []uint64{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2}, wantHS: hardState(2, 0, 18)},
		{name: "the logger holds the entries only after a gap", logger: gapLogger, log: entries(1, 5, 1), hs: hardState(1, 0, 5),
			wantErr:   "holds committed entries 11-20 of cluster c1 (compacted batches up to 0); this member's log needs them from 6",
			wantTerms: []uint64{1, 1, 1, 1, 1}, wantHS: hardState(1, 0, 5)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lg, err := raftlog.Open(raftlog.Options{FS: vfs.Default, Dirs: []string{filepath.Join(t.TempDir(), "log")}})
			if err != nil {
				t.Fatal(err)
			}
			defer lg.Close()
			if err := lg.Append(tt.log, tt.hs); err != nil {
				t.Fatal(err)
			}
			res, err := CatchUp(ctx, tt.logger, 0xc1, lg)
			if tt.wantErr != "" {
				if !errors.Is(err, ErrCatchUp) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("CatchUp: %v, want ErrCatchUp with %q", err, tt.wantErr)
				}
			} else if err != nil || res.Entries != tt.appended {
				t.Errorf("CatchUp: %+v, %v; want %d entries appended", res, err, tt.appended)
			}
			last, err := lg.LastIndex()
			if err != nil || last != uint64(len(tt.wantTerms)) {
				t.Fatalf("last index %d, %v; want %d", last, err, len(tt.wantTerms))
			}
			ents, err := lg.Entries(1, last+1, 1<<30)
			if err != nil {
				t.Fatal(err)
			}
			for i, e := range ents {
				if e.GetIndex() != uint64(i+1) || e.GetTerm() != tt.wantTerms[i] {
					t.Errorf("entry %d: index %d term %d, want term %d", i+1, e.GetIndex(), e.GetTerm(), tt.wantTerms[i])
				}
			}
			hs, _, err := lg.InitialState()
			if err != nil || !proto.Equal(hs, tt.wantHS) {
				t.Errorf("HardState %v, %v; want %v", hs, err, tt.wantHS)
			}
		})
	}
}
