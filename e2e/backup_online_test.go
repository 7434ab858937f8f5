package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/backup"
	"github.com/strata-kv/strata/internal/testutil"
)

// scrape returns the value of every unlabelled sample of the member's
// /metrics, by name.
func scrape(t *testing.T, endpoint string) map[string]float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape %s: %v", endpoint, err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") {
			continue
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			out[name] = v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("scrape %s: %v", endpoint, err)
	}
	return out
}

// restoreAndCompare restores version (0: the latest) of target into a new
// single-member cluster and checks that it answers want.
func restoreAndCompare(t *testing.T, target string, env []string, version uint64, want backupState) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, strata), Name: "r", Token: "restored"})
	res := testutil.RunToExit(t, 60*time.Second, "", env, binary(t, strata), "restore", "--from="+target,
		fmt.Sprintf("--version=%d", version), "--data-dir="+p.DataDir(), "--name=r", "--initial-cluster=r="+p.PeerURL(),
		"--initial-advertise-peer-urls="+p.PeerURL(), "--initial-cluster-token=restored")
	if res.Code != 0 {
		t.Fatalf("restore of %s: exit %d, stderr %s", target, res.Code, res.Stderr)
	}
	p.Launch()
	if err := p.WaitReady(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	got := readBackupState(t, ctx, p.Client(t), p.Endpoint())
	if got.rev != want.rev || got.hash != want.hash || strings.Join(got.kvs, "\n") != strings.Join(want.kvs, "\n") {
		t.Errorf("restored %s: revision %d, HashKV %d, %d keys; the live cluster answered %d, %d, %d",
			target, got.rev, got.hash, len(got.kvs), want.rev, want.hash, len(want.kvs))
	}
	p.Stop()
}

// TestBackupContinuous: three members started with the same
// --backup-target and --backup-interval take versions under load, only
// the leader (every manifest names it while it leads); the target is
// pruned to --backup-keep-last; the leader's /metrics show the versions
// (strata_backup_*, etcd_debugging_snap_save_total_duration_seconds) and
// the followers' none. Then `strata backup create --endpoints` asks a
// follower for a version of another target, which restores to what the
// cluster answered; with auth on, only root may ask.
func TestBackupContinuous(t *testing.T) {
	dir := t.TempDir()
	own := "file://" + filepath.Join(dir, "own")
	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, strata), Size: 3, Flags: []string{
		"--backup-target=" + own, "--backup-interval=300ms", "--backup-keep-last=2", "--bcrypt-cost=4"}})
	leader, err := c.WaitLeader(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cli := c.Client(t)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() { // load while the versions are taken
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := cli.Put(ctx, fmt.Sprintf("k%04d", i%500), strings.Repeat("v", 100+i%50)); err != nil {
				t.Errorf("put under backups: %v", err)
				return
			}
		}
	}()
	leaderURL := c.Members[leader].Endpoint()
	deadline := time.Now().Add(60 * time.Second)
	for scrape(t, leaderURL)["strata_backup_versions_total"] < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the leader took fewer than 3 versions in 60 s: %v", scrape(t, leaderURL))
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if now, err := c.WaitLeader(10 * time.Second); err != nil || now != leader {
		t.Skipf("leadership moved during the test (%d -> %d, %v): the leader-only check does not hold", leader, now, err)
	}

	tgt, err := backup.OpenTarget(ctx, own, backup.TargetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := backup.List(ctx, tgt)
	if err != nil {
		t.Fatal(err)
	}
	// Keep-last 2, and a version may land between the last prune and now.
	if len(list) < 2 || len(list) > 3 || list[len(list)-1].Version < 3 {
		t.Errorf("own target holds %d versions, the last %d; want 2 or 3 after keep-last 2, numbered from 3 up", len(list), list[len(list)-1].Version)
	}
	for _, m := range list {
		if uint64(m.MemberID) != c.Members[leader].ID {
			t.Errorf("version %d taken by member %x; the leader is %x", m.Version, m.MemberID, c.Members[leader].ID)
		}
	}
	if v := testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "backup", "verify", "--target="+own); v.Code != 0 {
		t.Errorf("verify of the own target: exit %d, %s %s", v.Code, v.Stdout, v.Stderr)
	}
	m := scrape(t, leaderURL)
	for _, name := range []string{"strata_backup_last_success_timestamp_seconds", "strata_backup_last_duration_seconds",
		"strata_backup_uploaded_bytes_total", "strata_backup_uploaded_files_total", "strata_backup_reused_files_total",
		"etcd_debugging_snap_save_total_duration_seconds_count"} {
		// bbolt's one file changes at every version (docs/backup.md,
		// "Every engine"): its versions reuse no file.
		if name == "strata_backup_reused_files_total" && testutil.Engine() == "bbolt" {
			continue
		}
		if m[name] <= 0 {
			t.Errorf("leader's %s = %v, want more than 0", name, m[name])
		}
	}
	if since := time.Since(time.Unix(int64(m["strata_backup_last_success_timestamp_seconds"]), 0)); since > time.Minute {
		t.Errorf("last success %s ago", since)
	}
	follower := (leader + 1) % 3
	if f := scrape(t, c.Members[follower].Endpoint()); f["strata_backup_versions_total"] != 0 || f["strata_backup_failures_total"] != 0 {
		t.Errorf("follower's versions %v, failures %v; want none", f["strata_backup_versions_total"], f["strata_backup_failures_total"])
	}

	// A version on request, from a follower, into another target.
	want := readBackupState(t, ctx, c.Client(t, c.Members[follower].Endpoint()), c.Members[follower].Endpoint())
	other := "file://" + filepath.Join(dir, "other")
	create := func(args ...string) testutil.Result {
		return testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata),
			append([]string{"backup", "create", "--endpoints=" + c.Members[follower].Endpoint(), "--target=" + other}, args...)...)
	}
	res := create()
	if prefix := fmt.Sprintf("version 1 of %s by member %x: ", other, c.Members[follower].ID); res.Code != 0 || !strings.HasPrefix(res.Stdout, prefix) {
		t.Fatalf("backup create --endpoints: exit %d, stdout %q, stderr %q; want %q...", res.Code, res.Stdout, res.Stderr, prefix)
	}
	restoreAndCompare(t, other, nil, 1, want)

	// With auth on, only root may ask.
	setupAuth(t, cli)
	// A linearizable read on the follower: it has applied AuthEnable.
	rootCli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.Members[follower].Endpoint()}, Username: "root", Password: "rootpw",
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer rootCli.Close()
	if _, err := rootCli.Get(ctx, "k0000"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{args: nil, wantErr: "user name is empty"},
		{args: []string{"--user=alice:apw"}, wantErr: "permission denied"},
		{args: []string{"--user=root:wrong"}, wantErr: "authentication failed"},
	} {
		if res := create(tc.args...); res.Code != 1 || !strings.Contains(res.Stderr, tc.wantErr) {
			t.Errorf("backup create %v with auth on: exit %d, stderr %q; want a refusal with %q", tc.args, res.Code, res.Stderr, tc.wantErr)
		}
	}
	if res := create("--user=root", "--password=rootpw"); res.Code != 0 || !strings.HasPrefix(res.Stdout, "version 2 ") {
		t.Errorf("backup create as root: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
}

// readBackupStateAt is readBackupState at an older revision: what the live
// member answers at rev (every key and HashKV there).
func readBackupStateAt(t *testing.T, ctx context.Context, cli *clientv3.Client, endpoint string, rev int64) backupState {
	t.Helper()
	resp, err := cli.Get(ctx, "", clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		t.Fatal(err)
	}
	st := backupState{rev: rev}
	for _, kv := range resp.Kvs {
		st.kvs = append(st.kvs, fmt.Sprintf("%s=%q c%d m%d v%d l%x", kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease))
	}
	h, err := cli.HashKV(ctx, endpoint, rev)
	if err != nil {
		t.Fatal(err)
	}
	st.hash = h.Hash
	return st
}

// TestBackupPointInTime: a member in continuous mode archives its raft log
// beside its versions; `strata restore --from URL --to-revision R` for R
// between two versions answers what the live member answered at R (keys,
// values, revisions, HashKV), and a revision past the archived log is
// refused.
func TestBackupPointInTime(t *testing.T) {
	target := "file://" + filepath.Join(t.TempDir(), "target")
	p := testutil.StartProcess(t, testutil.Options{Binary: binary(t, strata), Name: "src",
		Flags: []string{"--backup-target=" + target, "--backup-interval=300ms"}})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cli := p.Client(t)
	tgt, err := backup.OpenTarget(ctx, target, backup.TargetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := cli.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	var list []*backup.Manifest
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; len(list) < 3; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than 3 versions in 60 s: %d", len(list))
		}
		key := fmt.Sprintf("k%03d", i%97)
		var err error
		switch i % 5 {
		case 3:
			_, err = cli.Delete(ctx, fmt.Sprintf("k%03d", (i+50)%97))
		case 4:
			_, err = cli.Put(ctx, key, fmt.Sprint("leased-", i), clientv3.WithLease(lease.ID))
		default:
			_, err = cli.Put(ctx, key, fmt.Sprint("v", i))
		}
		if err != nil {
			t.Fatal(err)
		}
		if i%20 == 0 {
			if list, err = backup.List(ctx, tgt); err != nil {
				t.Fatal(err)
			}
		}
	}
	v1, v2 := list[0], list[1]
	if v2.Revision-v1.Revision < 2 {
		t.Fatalf("versions 1 and 2 at revisions %d and %d: nothing between them", v1.Revision, v2.Revision)
	}
	logs, err := backup.ArchivedLog(ctx, tgt)
	if err != nil || len(logs) == 0 || logs[0].First != v1.RaftIndex+1 || logs[len(logs)-1].Last < v2.RaftIndex {
		t.Fatalf("archived log %v (%v); want it from index %d past %d", logs, err, v1.RaftIndex+1, v2.RaftIndex)
	}
	out := testutil.RunToExit(t, 30*time.Second, "", nil, binary(t, strata), "backup", "list", "--target="+target)
	if wantLine := fmt.Sprintf("archived raft log (point-in-time restore): entries %d-", v1.RaftIndex+1); out.Code != 0 || !strings.Contains(out.Stdout, wantLine) {
		t.Errorf("backup list: exit %d, stdout %q; want a line %q...", out.Code, out.Stdout, wantLine)
	}
	if v := testutil.RunToExit(t, 30*time.Second, "", nil, binary(t, strata), "backup", "verify", "--target="+target); v.Code != 0 ||
		!strings.Contains(v.Stdout, "archived raft log: ") {
		t.Errorf("backup verify: exit %d, stdout %q, stderr %q; want the archived log checked", v.Code, v.Stdout, v.Stderr)
	}
	for _, rev := range []int64{v1.Revision + 1, (v1.Revision + v2.Revision) / 2, v2.Revision - 1} {
		want := readBackupStateAt(t, ctx, cli, p.Endpoint(), rev)
		restoreToRevision(t, target, rev, want)
	}
	res := testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "restore", "--from="+target, "--to-revision=1000000",
		"--data-dir="+filepath.Join(t.TempDir(), "none"))
	if res.Code != 1 || !strings.Contains(res.Stderr, "revision out of the restorable range") {
		t.Errorf("restore past the archived log: exit %d, stderr %q", res.Code, res.Stderr)
	}
}

// TestBackupPointInTimeToTime: a member in continuous mode samples when
// it applied what and archives its log every 300 ms after one version;
// `strata restore --from URL --to-time T` for T taken between later writes
// replays the archived log and answers what the live member answered at T
// (keys, values, revisions, HashKV); `backup list` shows the archive's
// time range; a time before the oldest version or after the archive's
// reach is refused, saying so; a damaged log object is named by verify and
// refused by restore.
func TestBackupPointInTimeToTime(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "target")
	target := "file://" + dir
	start := time.Now()
	// One version, taken on request below: the interval is far off, so
	// that every time restored is the version plus archived entries.
	p := testutil.StartProcess(t, testutil.Options{Binary: binary(t, strata), Name: "src",
		Flags: []string{"--backup-target=" + target, "--backup-interval=1h", "--backup-log-interval=300ms"}})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cli := p.Client(t)
	tgt, err := backup.OpenTarget(ctx, target, backup.TargetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	write := func(round int) {
		for i := range 30 {
			var err error
			if i%4 == 3 {
				_, err = cli.Delete(ctx, fmt.Sprintf("k%02d", (i+round)%11))
			} else {
				_, err = cli.Put(ctx, fmt.Sprintf("k%02d", (i*round)%11), fmt.Sprintf("r%d-%d", round, i))
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	// mark notes the time after a write round and what the member answers
	// then: the member samples its applied index once a second, so after
	// 1.5 s idle a sample at or before the mark shows the round applied.
	type mark struct {
		at   time.Time
		want backupState
	}
	markNow := func() mark {
		time.Sleep(1500 * time.Millisecond)
		m := mark{at: time.Now(), want: readBackupState(t, ctx, cli, p.Endpoint())}
		time.Sleep(200 * time.Millisecond)
		return m
	}
	write(1)
	if res := testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "backup", "create", "--endpoints="+p.Endpoint()); res.Code != 0 {
		t.Fatalf("backup create --endpoints: exit %d, stderr %s", res.Code, res.Stderr)
	}
	write(2)
	marks := []mark{markNow()}
	write(6)
	marks = append(marks, markNow())
	write(3)
	write(4)
	marks = append(marks, markNow())
	write(5)
	// Wait until the archive holds a sample after the last mark.
	var runs []backup.LogRun
	for deadline := time.Now().Add(60 * time.Second); len(runs) == 0 || !runs[len(runs)-1].To.After(marks[len(marks)-1].at); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no archived time sample after %s in 60 s: %+v", marks[len(marks)-1].at, runs)
		}
		if runs, err = backup.ArchivedRuns(ctx, tgt); err != nil {
			t.Fatal(err)
		}
	}
	out := testutil.RunToExit(t, 30*time.Second, "", nil, binary(t, strata), "backup", "list", "--target="+target)
	if wantLine := fmt.Sprintf("(%s to ", runs[0].From.Format(time.RFC3339Nano)); out.Code != 0 || !strings.Contains(out.Stdout, wantLine) {
		t.Errorf("backup list: exit %d, stdout %q; want the archive's time range %q...", out.Code, out.Stdout, wantLine)
	}
	for i, m := range marks {
		if i > 0 && m.want.rev == marks[i-1].want.rev {
			t.Fatalf("marks %d and %d at one revision %d", i-1, i, m.want.rev)
		}
		restoreToTime(t, target, m.at, m.want)
	}
	restore := func(at string) testutil.Result {
		return testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "restore", "--from="+target,
			"--to-time="+at, "--data-dir="+filepath.Join(t.TempDir(), "none"))
	}
	if res := restore(start.Add(-time.Minute).Format(time.RFC3339)); res.Code != 1 || !strings.Contains(res.Stderr, "is before the oldest version (version 1, created ") {
		t.Errorf("restore to before the first version: exit %d, stderr %q", res.Code, res.Stderr)
	}
	if res := restore(time.Now().Add(time.Hour).Format(time.RFC3339)); res.Code != 1 || !strings.Contains(res.Stderr, "is after the last archived sample: the archive reaches ") {
		t.Errorf("restore to an hour from now: exit %d, stderr %q", res.Code, res.Stderr)
	}
	if res := restore("yesterday"); res.Code != 2 || !strings.Contains(res.Stderr, "want an RFC 3339 time") {
		t.Errorf("restore to an unparsable time: exit %d, stderr %q", res.Code, res.Stderr)
	}

	// Damage the last byte (an entry's) of every log object.
	objs, err := filepath.Glob(filepath.Join(dir, "log", "*"))
	if err != nil || len(objs) == 0 {
		t.Fatalf("log objects: %v, %v", objs, err)
	}
	for _, o := range objs {
		raw, err := os.ReadFile(o)
		if err != nil {
			t.Fatal(err)
		}
		raw[len(raw)-1] ^= 1
		if err := os.WriteFile(o, raw, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if res := testutil.RunToExit(t, 30*time.Second, "", nil, binary(t, strata), "backup", "verify", "--target="+target); res.Code != 1 ||
		!strings.Contains(res.Stdout, "bad: log/") {
		t.Errorf("verify of damaged log objects: exit %d, stdout %q", res.Code, res.Stdout)
	}
	if res := restore(marks[0].at.Format(time.RFC3339Nano)); res.Code != 1 || !strings.Contains(res.Stderr, "corrupt") {
		t.Errorf("restore over damaged log objects: exit %d, stderr %q", res.Code, res.Stderr)
	}
}

// restoreToTime restores target to the time at into a new single-member
// cluster and checks that it answers want.
func restoreToTime(t *testing.T, target string, at time.Time, want backupState) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, strata), Name: "r", Token: "restored"})
	res := testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "restore", "--from="+target,
		"--to-time="+at.Format(time.RFC3339Nano), "--data-dir="+p.DataDir(), "--name=r", "--initial-cluster=r="+p.PeerURL(),
		"--initial-advertise-peer-urls="+p.PeerURL(), "--initial-cluster-token=restored")
	if res.Code != 0 || !strings.HasPrefix(res.Stdout, "restored the state at "+at.UTC().Format(time.RFC3339Nano)) ||
		!strings.Contains(res.Stdout, "then its archived log to index") {
		t.Fatalf("restore to %s: exit %d, stdout %q, stderr %s", at.Format(time.RFC3339Nano), res.Code, res.Stdout, res.Stderr)
	}
	p.Launch()
	if err := p.WaitReady(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	got := readBackupState(t, ctx, p.Client(t), p.Endpoint())
	if got.rev != want.rev || got.hash != want.hash || strings.Join(got.kvs, "\n") != strings.Join(want.kvs, "\n") {
		t.Errorf("restored to %s: revision %d, HashKV %d, %d keys; the live member answered revision %d, HashKV %d, %d keys",
			at.Format(time.RFC3339Nano), got.rev, got.hash, len(got.kvs), want.rev, want.hash, len(want.kvs))
	}
	p.Stop()
}

// restoreToRevision restores target to rev into a new single-member
// cluster and checks that it answers want.
func restoreToRevision(t *testing.T, target string, rev int64, want backupState) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, strata), Name: "r", Token: "restored"})
	res := testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "restore", "--from="+target,
		fmt.Sprintf("--to-revision=%d", rev), "--data-dir="+p.DataDir(), "--name=r", "--initial-cluster=r="+p.PeerURL(),
		"--initial-advertise-peer-urls="+p.PeerURL(), "--initial-cluster-token=restored")
	if res.Code != 0 || !strings.HasPrefix(res.Stdout, fmt.Sprintf("restored revision %d ", rev)) {
		t.Fatalf("restore to revision %d: exit %d, stdout %q, stderr %s", rev, res.Code, res.Stdout, res.Stderr)
	}
	p.Launch()
	if err := p.WaitReady(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	got := readBackupState(t, ctx, p.Client(t), p.Endpoint())
	if got.rev != want.rev || got.hash != want.hash || strings.Join(got.kvs, "\n") != strings.Join(want.kvs, "\n") {
		t.Errorf("restored to revision %d: revision %d, HashKV %d, %d keys; the live member answered revision %d, HashKV %d, %d keys",
			rev, got.rev, got.hash, len(got.kvs), want.rev, want.hash, len(want.kvs))
	}
	p.Stop()
}

// TestBackupMemberKilled: a member killed -9 (the failpoint
// backup/after-file-upload) while its continuous mode uploads its first
// version leaves a checkpoint in its staging directory and no version in
// the target; restarted, it removes the checkpoint, takes versions, and
// they verify and restore to what it answered.
func TestBackupMemberKilled(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "target")
	target := "file://" + dir
	p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, strata), Name: "src",
		Flags: []string{"--backup-target=" + target, "--backup-interval=300ms"},
		Env:   []string{"STRATA_FAILPOINTS=backup/after-file-upload=1"}})
	p.Launch()
	if _, ok := p.WaitExit(60 * time.Second); !ok {
		t.Fatal("the member did not die at its first upload within 60 s")
	}
	staged := func() []string {
		m, err := filepath.Glob(filepath.Join(p.DataDir(), "backup.tmp", "strata-backup-*"))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if len(staged()) == 0 {
		t.Fatalf("no checkpoint left in the staging directory by the killed member:\n%s", p.Output())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	tgt, err := backup.OpenTarget(ctx, target, backup.TargetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if list, err := backup.List(ctx, tgt); err != nil || len(list) != 0 {
		t.Fatalf("after the kill the target lists %d versions (%v); want none", len(list), err)
	}

	p.SetEnv()
	p.Restart()
	if left := staged(); len(left) != 0 {
		t.Errorf("the restarted member left %v", left)
	}
	cli := p.Client(t)
	for i := range 50 {
		if _, err := cli.Put(ctx, fmt.Sprintf("k%02d", i), fmt.Sprint("v", i)); err != nil {
			t.Fatal(err)
		}
	}
	rev := readBackupState(t, ctx, cli, p.Endpoint()).rev
	var v *backup.Manifest
	for deadline := time.Now().Add(60 * time.Second); v == nil || v.Revision < rev; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no version at revision %d or later within 60 s", rev)
		}
		if list, err := backup.List(ctx, tgt); err == nil && len(list) > 0 {
			v = list[len(list)-1]
		}
	}
	if res := testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "backup", "verify", "--target="+target); res.Code != 0 {
		t.Errorf("verify: exit %d, %s %s", res.Code, res.Stdout, res.Stderr)
	}
	restoreAndCompare(t, target, nil, v.Version, readBackupStateAt(t, ctx, cli, p.Endpoint(), v.Revision))
}

// TestBackupOnlineTLS: `strata backup create --endpoints https://...`
// carries the client URL's TLS (--cacert, --cert, --key) and, with auth
// on and --client-cert-auth, the certificate's common name is the caller:
// root's certificate may ask for a version, alice's may not, and a client
// without a certificate is refused.
func TestBackupOnlineTLS(t *testing.T) {
	ca := newTestCA(t, "ca")
	serverCert, serverKey := ca.issue(t, "server")
	rootCert, rootKey := ca.issue(t, "root")
	aliceCert, aliceKey := ca.issue(t, "alice")
	url := fmt.Sprintf("https://127.0.0.1:%d", testutil.FreePorts(t, 1)[0])
	p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, strata), Flags: []string{
		"--listen-client-urls=" + url, "--advertise-client-urls=" + url,
		"--cert-file=" + serverCert, "--key-file=" + serverKey, "--trusted-ca-file=" + ca.path,
		"--client-cert-auth", "--bcrypt-cost=4",
	}})
	p.Launch()
	root := tlsClient(t, url, ca, rootCert, rootKey)
	waitTLSReady(t, p, root)
	setupAuth(t, root)
	target := "file://" + filepath.Join(t.TempDir(), "target")
	create := func(args ...string) testutil.Result {
		return testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata),
			append([]string{"backup", "create", "--endpoints=" + url, "--target=" + target, "--command-timeout=10s"}, args...)...)
	}
	if res := create("--cacert="+ca.path, "--cert="+rootCert, "--key="+rootKey); res.Code != 0 || !strings.HasPrefix(res.Stdout, "version 1 ") {
		t.Errorf("as root by certificate: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	if res := create("--cacert="+ca.path, "--cert="+aliceCert, "--key="+aliceKey); res.Code != 1 || !strings.Contains(res.Stderr, "permission denied") {
		t.Errorf("as alice by certificate: exit %d, stderr %q; want permission denied", res.Code, res.Stderr)
	}
	if res := create("--cacert=" + ca.path); res.Code != 1 {
		t.Errorf("without a client certificate: exit %d, stdout %q; want a refusal", res.Code, res.Stdout)
	}
	if res := create("--cert="+rootCert, "--key="+rootKey); res.Code != 1 || !strings.Contains(res.Stderr, "certificate") {
		t.Errorf("without the CA (the system's roots do not know it): exit %d, stderr %q; want a certificate error", res.Code, res.Stderr)
	}
}
