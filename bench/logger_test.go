package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestSmokeLogger runs the logger experiment on tiny sizes: a cluster of
// three with no logger and with two, each run without errors, and the
// loggers' rate and catch-up reported.
func TestSmokeLogger(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is needed to build strata:", err)
	}
	o := defaultLGOptions()
	o.loggers, o.configs, o.total, o.reps = []int{0, 2}, []connClients{{1, 1}}, 20, 1
	o.out, o.workDir, o.quiet = t.TempDir(), t.TempDir(), true
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := runLG(ctx, o, "go test -run TestSmokeLogger", zap.NewNop())
	if err != nil {
		t.Fatalf("smoke run: %v", err)
	}
	if len(rep.Results) != 2 {
		t.Fatalf("%d results, want 2", len(rep.Results))
	}
	for _, r := range rep.Results {
		if r.Err != "" || r.Errors != 0 || r.Ops != o.total || r.Throughput <= 0 {
			t.Fatalf("%d loggers: %+v", r.Loggers, r)
		}
		if len(r.LoggerRate) != r.Loggers || len(r.CatchUpMs) != r.Loggers {
			t.Fatalf("%d loggers: rates %v, catch-up %v", r.Loggers, r.LoggerRate, r.CatchUpMs)
		}
	}
	md, err := os.ReadFile(filepath.Join(o.out, "logger.md"))
	if err != nil || !strings.Contains(string(md), "| 2 | 1/1 | 1 |") {
		t.Fatalf("logger.md: %v\n%s", err, md)
	}
}

// TestSmokeLoggerShared runs the shared-logger experiment on tiny sizes:
// one logger joined to two clusters of three loaded at once, each cluster's
// throughput and the logger's rate reported.
func TestSmokeLoggerShared(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is needed to build strata:", err)
	}
	o := defaultLGOptions()
	o.shared, o.configs, o.total, o.reps = []int{2}, []connClients{{1, 1}}, 20, 1
	o.out, o.workDir, o.quiet = t.TempDir(), t.TempDir(), true
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := runLG(ctx, o, "go test -run TestSmokeLoggerShared", zap.NewNop())
	if err != nil {
		t.Fatalf("smoke run: %v", err)
	}
	if len(rep.Shared) != 1 || len(rep.Results) != 0 {
		t.Fatalf("%d shared results and %d others, want 1 and 0", len(rep.Shared), len(rep.Results))
	}
	r := rep.Shared[0]
	if r.Err != "" || r.Errors != 0 || len(r.Throughput) != 2 || r.Cumulative <= 0 || r.LoggerRate <= 0 {
		t.Fatalf("shared run: %+v", r)
	}
}

// TestSmokeLoggerCost runs the disk-usage measurement for two seconds: the
// load ran, and the logger's log and the members' logs grew.
func TestSmokeLoggerCost(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is needed to build strata:", err)
	}
	o := defaultLGOptions()
	o.costSeconds, o.configs = 2, []connClients{{1, 1}}
	o.out, o.workDir, o.quiet = t.TempDir(), t.TempDir(), true
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := runLG(ctx, o, "go test -run TestSmokeLoggerCost", zap.NewNop())
	if err != nil {
		t.Fatalf("smoke run: %v", err)
	}
	r := rep.Cost
	if r == nil || r.Err != "" || r.Ops == 0 || r.LoggerLogMBPerMin <= 0 || r.MemberLogMBPerMin <= 0 {
		t.Fatalf("cost run: %+v", r)
	}
}
