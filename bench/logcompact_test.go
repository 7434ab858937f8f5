package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestSmokeLogCompact runs the log compaction experiment on tiny sizes:
// SL and PL on one and two log directories, a history window, and etcd.
// It asserts that every configuration completed, that the log and the
// recoveries were measured (PL's log holds batch files, every strata
// recovery has its breakdown, the state came back), and that the JSON and
// Markdown were written; nothing about timing.
func TestSmokeLogCompact(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is needed to build strata and etcd:", err)
	}
	o := smokeLCOptions()
	o.out = t.TempDir()
	o.workDir = t.TempDir()
	o.quiet = true
	if bin := os.Getenv("STRATA_BENCH_ETCD"); bin != "" {
		o.etcdBin = bin
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rep, err := runLC(ctx, o, "go test -run TestSmokeLogCompact", zap.NewNop())
	if err != nil {
		t.Fatalf("smoke run: %v", err)
	}
	if want := len(o.expand()); len(rep.Results) != want {
		t.Fatalf("%d results, want %d", len(rep.Results), want)
	}
	series := map[string]bool{}
	for _, r := range rep.Results {
		c := r.Config
		series[c.Series+"/"+c.Server] = true
		if r.Error != "" || r.Errors != 0 || r.Ops != o.ops {
			t.Errorf("%s: %d ops of %d, %d errors, error %q", c, r.Ops, o.ops, r.Errors, r.Error)
			continue
		}
		if r.Writes <= 0 || r.Latency.P50 <= 0 {
			t.Errorf("%s: %d writes, latency %+v", c, r.Writes, r.Latency)
		}
		kinds := map[string]int{}
		for _, rec := range r.Recoveries {
			kinds[rec.Kind]++
			if rec.Seconds <= 0 {
				t.Errorf("%s: recovery %+v took no time", c, rec)
			}
			if c.Server == "strata" && !rec.Breakdown {
				t.Errorf("%s: recovery %s/%s has no breakdown from the start-up log", c, rec.Kind, rec.Strategy)
			}
		}
		wantRun := o.reps
		if c.Server == "strata" && c.Batch > 0 {
			wantRun = 2 * o.reps // naive and descending
		}
		if kinds["crash"] != 1 || kinds["run"] != wantRun {
			t.Errorf("%s: recoveries %v, want 1 as crashed and %d of the whole run", c, kinds, wantRun)
		}
		switch {
		case c.Server == "etcd":
			if r.WALDiskBytes <= 0 {
				t.Errorf("%s: WAL size %d", c, r.WALDiskBytes)
			}
		case r.Log == nil:
			t.Errorf("%s: no log inspection", c)
		case c.Batch == 0:
			if r.Log.BatchFiles != 0 || r.Log.SegmentCommands < uint64(r.Writes) {
				t.Errorf("%s: SL log %+v for %d writes", c, r.Log, r.Writes)
			}
		default:
			if r.Log.BatchFiles == 0 || r.Log.BatchCommands%uint64(c.Batch) != 0 || r.Log.Commands() < uint64(r.Writes) {
				t.Errorf("%s: PL log %+v for %d writes", c, r.Log, r.Writes)
			}
			for _, rec := range r.Recoveries {
				if rec.Kind == "run" && (rec.Batches == 0 || rec.Records == 0) {
					t.Errorf("%s: whole-run recovery replayed no batch: %+v", c, rec)
				}
			}
		}
	}
	for _, s := range []string{"main/strata", "main/etcd", "window/strata", "dirs2/strata"} {
		if !series[s] {
			t.Errorf("no result for %s (have %v)", s, series)
		}
	}
	back, err := readLCReport(filepath.Join(o.out, "logcompact.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Results) != len(rep.Results) {
		t.Errorf("logcompact.json holds %d results, the run had %d", len(back.Results), len(rep.Results))
	}
	md, err := os.ReadFile(filepath.Join(o.out, "logcompact.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"## The log after", "## Recovery", "### PL", "## Overhead", "## One against two log directories", "## History window"} {
		if !strings.Contains(string(md), s) {
			t.Errorf("logcompact.md lacks %q", s)
		}
	}
}

// TestLCExpand checks the configuration matrix: the series, the cut batch
// sizes for large key spaces, templates grouped together.
func TestLCExpand(t *testing.T) {
	o := defaultLCOptions()
	configs := o.expand()
	count := map[string]int{}
	for _, c := range configs {
		count[c.Series+"/"+c.Server]++
		if c.Records > largeRecords && c.Series == "main" && c.Server == "strata" && c.Batch != 0 && c.Batch != 300 && c.Batch != 1200 {
			t.Errorf("%s: batch size not cut for a large key space", c)
		}
	}
	for _, tc := range []struct {
		key  string
		want int
	}{
		{key: "main/strata", want: 6*5 + 6*3},
		{key: "main/etcd", want: 12},
		{key: "window/strata", want: 2 * 2 * 1},
		{key: "dirs2/strata", want: 2 * 3},
	} {
		if count[tc.key] != tc.want {
			t.Errorf("%s: %d configurations, want %d", tc.key, count[tc.key], tc.want)
		}
	}
	seen := map[string]bool{}
	var last string
	for _, c := range configs {
		group := fmt.Sprintf("%s/%d/%d", c.Server, c.Dirs, c.Records)
		if group != last && seen[group] {
			t.Errorf("template group %s comes back after another one", group)
		}
		seen[group], last = true, group
	}
}
