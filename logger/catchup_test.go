package logger

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

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
