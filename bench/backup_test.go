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

// TestSmokeBackup runs the backup experiment on tiny sizes against strata
// and real etcd: two growing steps (restored after the second) and two
// update steps. It asserts that every snapshot and restore completed, that
// the second incremental version reused files of the first while the full
// snapshots grew, and that the JSON, Markdown and plots were written; it
// asserts nothing about timing.
func TestSmokeBackup(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is needed to build etcd and strata:", err)
	}
	o := smokeBKOptions()
	o.restoreEvery = 2
	o.out, o.workDir, o.quiet = t.TempDir(), t.TempDir(), true
	if bin := os.Getenv("STRATA_BENCH_ETCD"); bin != "" {
		o.etcdBin = bin
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rep, err := runBK(ctx, o, "go test -run TestSmokeBackup", zap.NewNop())
	if err != nil {
		t.Fatalf("smoke run: %v", err)
	}
	// 2 grow steps and 2 update steps, 3 methods each.
	if len(rep.Snapshots) != 12 {
		t.Fatalf("%d snapshots, want 12", len(rep.Snapshots))
	}
	_, grow := snapsOf(rep, expGrow)
	for _, s := range rep.Snapshots {
		if s.Err != "" || s.Seconds <= 0 || s.Bytes <= 0 || s.FullBytes <= 0 || s.CumBytes < s.Bytes {
			t.Errorf("%s step %d %s: %+v", s.Experiment, s.Step, s.Method, s)
		}
	}
	inc1, inc2 := grow[1][methodIncremental], grow[2][methodIncremental]
	if inc1.Version == 0 || inc2.Version != inc1.Version+1 || inc2.NewFiles >= inc2.Files || inc2.NewBytes >= inc2.FullBytes {
		t.Errorf("incremental versions: step 1 %+v, step 2 %+v; want the second to reuse files of the first", inc1, inc2)
	}
	for _, m := range []string{methodStrataFull, methodEtcdFull} {
		if a, b := grow[1][m], grow[2][m]; b.Bytes <= a.Bytes || b.CumBytes != a.Bytes+b.Bytes {
			t.Errorf("%s: step 1 %d bytes, step 2 %d bytes (cumulative %d); want a larger second snapshot", m, a.Bytes, b.Bytes, b.CumBytes)
		}
	}
	// Step 2 of grow, the last update step, and a files version of its
	// state if the incremental snapshot there was a log version.
	wantRestores := 6
	if rep.FilesAfterUpdate != nil {
		wantRestores = 7
	}
	if len(rep.Restores) != wantRestores {
		t.Fatalf("%d restores, want %d", len(rep.Restores), wantRestores)
	}
	for _, r := range rep.Restores {
		if r.Err != "" || r.Seconds <= 0 || r.StartSeconds <= 0 || r.Keys != 2*o.growKeys {
			t.Errorf("restore %s %s: %+v", r.Experiment, r.Method, r)
		}
	}
	md, err := os.ReadFile(filepath.Join(o.out, "backup.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"## Growing state", "## Large state, small updates", "% of a full version", "## Restore time by state size", "strata backup create"} {
		if !strings.Contains(string(md), s) {
			t.Errorf("backup.md lacks %q", s)
		}
	}
	for _, f := range []string{"backup.json", "backup-grow.png", "backup-update.png", "backup-restore.png"} {
		if st, err := os.Stat(filepath.Join(o.out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	// -render re-renders from the JSON.
	if err := run([]string{"backup", "-render", filepath.Join(o.out, "backup.json")}); err != nil {
		t.Errorf("backup -render: %v", err)
	}
}

// TestSmokeBackupUpdateOnly runs the update experiment alone, strata alone:
// the large state is loaded in step 0, whose base snapshots are not counted.
func TestSmokeBackupUpdateOnly(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is needed to build strata:", err)
	}
	o := smokeBKOptions()
	o.experiments, o.etcd, o.restoreEvery = []string{expUpdate}, false, 0
	o.out, o.workDir, o.quiet = t.TempDir(), t.TempDir(), true
	if bin := os.Getenv("STRATA_BENCH_ETCD"); bin != "" {
		o.etcdBin = bin
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rep, err := runBK(ctx, o, "go test -run TestSmokeBackupUpdateOnly", zap.NewNop())
	if err != nil {
		t.Fatalf("smoke run: %v", err)
	}
	steps, by := snapsOf(rep, expUpdate)
	if len(steps) != 3 || steps[0] != 0 || len(by[1]) != 2 {
		t.Fatalf("steps %v, step 1 %v: want 0, 1, 2 and two methods", steps, by[1])
	}
	if base, s1 := by[0][methodIncremental], by[1][methodIncremental]; base.CumBytes != 0 || s1.CumBytes != s1.Bytes || s1.Keys != o.baseKeys {
		t.Errorf("base %+v, step 1 %+v: step 0 is not counted", base, s1)
	}
	// The member's default policy: a files version at step 0, then log
	// versions on it, each uploading less than a full version, and the
	// last step's snapshots restored (strata's two, no etcd here) beside a
	// files version of the same state.
	base := by[0][methodIncremental]
	for _, step := range steps[1:] {
		if s := by[step][methodIncremental]; s.Kind != "log" || s.Base != base.Version || s.LogBytes <= 0 || s.Bytes <= 0 || s.Bytes*20 > s.FullBytes {
			t.Errorf("update step %d: %+v; want a log version on version %d uploading under 5%% of a full version", step, s, base.Version)
		}
	}
	if f := rep.FilesAfterUpdate; f == nil || f.Kind != "files" || f.Err != "" || len(rep.Restores) != 3 {
		t.Errorf("files version after the update: %+v, restores %+v; want one, restored beside the log version", f, rep.Restores)
	}
	md, err := os.ReadFile(filepath.Join(o.out, "backup.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), fmt.Sprintf("| log on %d |", base.Version)) || !strings.Contains(string(md), "| update-files | 2 |") {
		t.Errorf("backup.md does not show the log versions and the files version restored:\n%s", md)
	}
}
