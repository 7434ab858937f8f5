package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/strata-kv/strata/bench/internal/cluster"
	"github.com/strata-kv/strata/bench/internal/report"
)

// TestSmoke runs every step of the benchmark on tiny sizes against real etcd
// (built from the tools module) and, when cmd/strata builds, against strata
// and strata with --engine-wal. It asserts that every measurement completed
// without errors and that the JSON, Markdown and plots were written; it
// asserts nothing about timing.
func TestSmoke(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is needed to build etcd:", err)
	}
	o := smokeOptions()
	o.out = t.TempDir()
	o.workDir = t.TempDir()
	o.quiet = true
	if bin := os.Getenv("STRATA_BENCH_ETCD"); bin != "" {
		o.etcdBin = bin
	}
	// Count fsyncs with strace where it can trace, so that path runs too.
	if bin, err := exec.LookPath("strace"); err == nil && cluster.StraceUsable(t.Context(), bin) == nil {
		o.fsyncCount = "strace"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rep, err := runSuite(ctx, o, "go test -run TestSmoke", zap.NewNop())
	if err != nil {
		t.Fatalf("smoke run: %v", err)
	}

	var servers []string
	for _, s := range rep.Servers {
		servers = append(servers, s.Name)
	}
	if !slices.Contains(servers, "etcd") {
		t.Fatalf("servers %v: etcd missing", servers)
	}
	t.Logf("servers measured: %v; notes: %v", servers, rep.Notes)

	// Every server has a result for every workload the smoke options ask
	// for, and none of them failed a request.
	want := map[string]bool{"put": true, "range-l": true, "range-s": true, "sweep-put": true, "restart": true, "defrag": true}
	for _, w := range o.ycsbWorkloads {
		want["ycsb-"+w] = true
	}
	got := map[string]map[string]bool{} // server -> workload family
	for _, r := range rep.Results {
		fam := r.Workload
		if strings.HasPrefix(fam, "ycsb-") {
			fam = fam[:strings.LastIndexByte(fam, '-')]
		}
		if got[r.Server] == nil {
			got[r.Server] = map[string]bool{}
		}
		got[r.Server][fam] = true
		switch r.Phase {
		case "run":
			if r.Errors != 0 || r.Ops != r.Total {
				t.Errorf("%s %s %d/%d: %d ops of %d, %d errors (%s)", r.Server, r.Workload, r.Conns, r.Clients, r.Ops, r.Total, r.Errors, r.FirstError)
			}
			if r.Latency.P50 <= 0 || r.Latency.Max < r.Latency.P99 || r.Latency.P99 < r.Latency.P50 {
				t.Errorf("%s %s: implausible latency %+v", r.Server, r.Workload, r.Latency)
			}
			if o.fsyncCount == "strace" && (r.Usage.Fsyncs == nil || (r.Workload == "put" && *r.Usage.Fsyncs == 0)) {
				t.Errorf("%s %s: fsyncs %v under strace; want a count (and > 0 for put)", r.Server, r.Workload, r.Usage.Fsyncs)
			}
			if r.DataDirBytes <= 0 {
				t.Errorf("%s %s: data dir size %d", r.Server, r.Workload, r.DataDirBytes)
			}
		case "restart":
			if r.RestartSeconds <= 0 {
				t.Errorf("%s restart: %v s", r.Server, r.RestartSeconds)
			}
		case "defrag":
			if r.Errors != 0 || r.Ops == 0 || r.StallSeconds <= 0 || r.StallSeconds > r.Seconds || r.DataDirBytesBefore <= 0 {
				t.Errorf("%s defrag: %d writes, %d errors (%s), stall %v s of %v s, size before %d", r.Server, r.Ops, r.Errors, r.FirstError, r.StallSeconds, r.Seconds, r.DataDirBytesBefore)
			}
		}
	}
	for _, s := range servers {
		for w := range want {
			if !got[s][w] {
				t.Errorf("server %s: no result for %s", s, w)
			}
		}
	}

	// The files are there and the JSON reads back.
	back, err := report.ReadJSON(filepath.Join(o.out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Results) != len(rep.Results) {
		t.Errorf("results.json holds %d results, run had %d", len(back.Results), len(rep.Results))
	}
	md, err := os.ReadFile(filepath.Join(o.out, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"## Workloads", "## Restart after kill -9", "## Writes during Defragment", "| put | 1/1 |"} {
		if !strings.Contains(string(md), s) {
			t.Errorf("results.md lacks %q", s)
		}
	}
	pngs, _ := filepath.Glob(filepath.Join(o.out, "*.png"))
	var cdf, tput int
	for _, p := range pngs {
		switch {
		case strings.HasPrefix(filepath.Base(p), "cdf-"):
			cdf++
		case strings.HasPrefix(filepath.Base(p), "tput-lat-"):
			tput++
		}
	}
	if cdf == 0 || tput == 0 {
		t.Errorf("plots: %d CDF and %d throughput/latency PNGs, want some of each", cdf, tput)
	}
}

// TestSmokeThreeMembers runs the multi-member path (bootstrap of three
// members, load over all endpoints, kill -9 and restart of member 0) on the
// put and restart steps.
func TestSmokeThreeMembers(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is needed to build etcd:", err)
	}
	o := smokeOptions()
	o.steps = []string{"put", "restart"}
	o.members = 3
	o.out = t.TempDir()
	o.workDir = t.TempDir()
	o.quiet = true
	if bin := os.Getenv("STRATA_BENCH_ETCD"); bin != "" {
		o.etcdBin = bin
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rep, err := runSuite(ctx, o, "go test -run TestSmokeThreeMembers", zap.NewNop())
	if err != nil {
		t.Fatalf("three-member smoke run: %v", err)
	}
	restarts := map[string]bool{}
	for _, r := range rep.Results {
		if r.Phase == "restart" && r.RestartSeconds > 0 {
			restarts[r.Server] = true
		}
	}
	for _, s := range rep.Servers {
		if !restarts[s.Name] {
			t.Errorf("server %s: no restart measured", s.Name)
		}
		if n := strings.Count(strings.Join(s.Command, " "), "=http://127.0.0.1:"); n < 3 {
			t.Errorf("server %s: command %q does not name three members", s.Name, s.Command)
		}
	}
}

// TestSmokeEngines runs strata on each other engine (strata-bbolt,
// strata-appendlog, strata-hybridlog: --engine) through put, range, YCSB
// and restart at the smoke sizes, without etcd: every measurement
// completes without errors and each server runs with its --engine.
func TestSmokeEngines(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is needed to build strata:", err)
	}
	o := smokeOptions()
	// One configuration of each step: every step starts a fresh cluster
	// per server, and the other configurations exercise the bench, not
	// the engine (TestSmoke covers them).
	o.steps = []string{"put", "range", "ycsb", "restart"}
	o.servers = []string{"strata-bbolt", "strata-appendlog", "strata-hybridlog"}
	o.putConfigs = o.putConfigs[:1]
	o.rangeConfigs = o.rangeConfigs[:1]
	o.consistency = []string{"l"}
	o.ycsbWorkloads = []string{"A"}
	o.ycsbDists = []string{"std"}
	o.out = t.TempDir()
	o.workDir = t.TempDir()
	o.quiet = true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rep, err := runSuite(ctx, o, "go test -run TestSmokeEngines", zap.NewNop())
	if err != nil {
		t.Fatalf("engines smoke run: %v", err)
	}
	got := map[string]map[string]bool{} // server -> workload
	for _, r := range rep.Results {
		if got[r.Server] == nil {
			got[r.Server] = map[string]bool{}
		}
		got[r.Server][strings.SplitN(r.Workload, "-", 2)[0]] = true
		if r.Phase == "run" && (r.Errors != 0 || r.Ops != r.Total) {
			t.Errorf("%s %s %d/%d: %d ops of %d, %d errors (%s)", r.Server, r.Workload, r.Conns, r.Clients, r.Ops, r.Total, r.Errors, r.FirstError)
		}
		if r.Phase == "restart" && r.RestartSeconds <= 0 {
			t.Errorf("%s restart: %v s", r.Server, r.RestartSeconds)
		}
	}
	if len(rep.Servers) != len(o.servers) {
		t.Fatalf("servers measured %v, want %v", rep.Servers, o.servers)
	}
	for _, s := range rep.Servers {
		engine := strings.TrimPrefix(s.Name, "strata-")
		if !slices.Contains(s.Command, "--engine="+engine) {
			t.Errorf("server %s: command %q lacks --engine=%s", s.Name, s.Command, engine)
		}
		for _, w := range []string{"put", "range", "ycsb", "restart"} {
			if !got[s.Name][w] {
				t.Errorf("server %s: no result for %s (got %v)", s.Name, w, got[s.Name])
			}
		}
	}
}

// TestSmokeGrow runs the data-growth run (grow.go) on a tiny target: etcd
// and, when cmd/strata builds, strata, one after the other, each written
// until its data directory reaches 8 MiB (a fresh member's already does, so
// each stops at the first one-second check). It asserts that both wrote keys
// without errors, that the samples are plausible and that the JSON,
// Markdown and plots were written and re-render.
func TestSmokeGrow(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is needed to build etcd:", err)
	}
	o := defaultGrowOptions()
	o.bytes = 8 << 20
	o.interval = time.Second
	o.clients, o.conns = 10, 2
	o.out = t.TempDir()
	o.workDir = t.TempDir()
	o.quiet = true
	if bin := os.Getenv("STRATA_BENCH_ETCD"); bin != "" {
		o.etcdBin = bin
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	rep, err := runGrowBench(ctx, o, "go test -run TestSmokeGrow", zap.NewNop())
	if err != nil {
		t.Fatalf("grow smoke run: %v", err)
	}
	t.Logf("grow smoke run took %v", time.Since(start))
	// A strata that does not build is dropped with a note (resolveServers).
	if len(rep.Runs) != len(rep.Servers) || len(rep.Runs) == 0 || rep.Runs[0].Server != "etcd" {
		t.Fatalf("runs %+v, want one per server measured %+v, etcd first", rep.Runs, rep.Servers)
	}
	var names []string
	for _, s := range rep.Servers {
		names = append(names, s.Name)
	}
	t.Logf("servers grown: %v; notes: %v", names, rep.Notes)
	for _, r := range rep.Runs {
		if r.Keys == 0 || r.Errors != 0 || r.Stop != "size" || len(r.Samples) == 0 {
			t.Errorf("%s: %d keys, %d errors (%s), stop %q, %d samples", r.Server, r.Keys, r.Errors, r.FirstError, r.Stop, len(r.Samples))
		}
		if r.DataDirBytes < o.bytes || r.InitialDataDirBytes <= 0 {
			t.Errorf("%s: data dir %d bytes at the end (target %d), %d at the start", r.Server, r.DataDirBytes, o.bytes, r.InitialDataDirBytes)
		}
		if !slices.Contains(r.Command, "--quota-backend-bytes=8589934592") {
			t.Errorf("%s: command %q lacks the raised quota", r.Server, r.Command)
		}
		for _, s := range r.Samples {
			if s.Keys > r.Keys || s.RSSBytes <= 0 || s.CPUSeconds < 0 || (s.Ops > 0 && (s.P50 <= 0 || s.P99 < s.P50)) {
				t.Errorf("%s: implausible sample %+v", r.Server, s)
			}
		}
	}
	back, err := report.ReadGrowJSON(filepath.Join(o.out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	files, err := report.RenderGrow(back, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range files {
		got = append(got, filepath.Base(f))
	}
	want := []string{"results.md", "grow-tput-size.png", "grow-tput-time.png", "grow-p99-size.png", "grow-p99-time.png"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("re-rendered %v, want %v", got, want)
	}
	md, err := os.ReadFile(filepath.Join(o.out, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"## Summary", "--quota-backend-bytes=8589934592", "| etcd | size |"} {
		if !strings.Contains(string(md), s) {
			t.Errorf("results.md lacks %q", s)
		}
	}
}

// TestSmokeRestartRounds runs the restart step in two interleaved rounds
// on strata alone: each round restarts a fresh cluster and is tagged with
// its round, and results.md gives the medians.
func TestSmokeRestartRounds(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is needed to build strata:", err)
	}
	o := smokeOptions()
	o.steps = []string{"restart"}
	o.servers = []string{"strata"}
	o.rounds = 2
	o.out = t.TempDir()
	o.workDir = t.TempDir()
	o.quiet = true
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := runSuite(ctx, o, "go test -run TestSmokeRestartRounds", zap.NewNop())
	if err != nil {
		t.Fatalf("restart rounds smoke run: %v", err)
	}
	var rounds []int
	for _, r := range rep.Results {
		if r.Phase == "restart" && r.RestartSeconds > 0 {
			rounds = append(rounds, r.Round)
		}
	}
	if !slices.Equal(rounds, []int{1, 2}) {
		t.Errorf("restart results in rounds %v, want [1 2]", rounds)
	}
	md, err := os.ReadFile(filepath.Join(o.out, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "| 300 | strata (2 rounds) |") {
		t.Errorf("results.md lacks the restart medians row:\n%s", md)
	}
}
