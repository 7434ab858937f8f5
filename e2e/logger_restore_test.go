package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strata-kv/strata/backup"
	"github.com/strata-kv/strata/internal/testutil"
	"github.com/strata-kv/strata/logger"
)

// TestLoggerRestoreToRevision: a cluster of three with a logger joined; a
// backup version taken of a running member (no continuous mode, so the
// target archives no log); more writes (puts, deletes, a lease, a txn);
// then `strata restore --from URL --logger URL --to-revision R` rebuilds,
// from the version and the logger's Recover stream, exactly what the live
// cluster answered at R (keys, values, revisions, leases, HashKV), and
// --to-index restores the state after a raft index. Without --logger the
// target's archive, empty, is refused naming what it holds; a revision
// past what the logger holds committed is refused naming its range.
func TestLoggerRestoreToRevision(t *testing.T) {
	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, strata), Size: 3})
	cli := c.Client(t)
	defer cli.Close()
	lp := startLogger(t)
	addLoggerTo(t, c, lp)
	lp.Launch()
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	for i := range 30 {
		if _, err := cli.Put(ctx, fmt.Sprintf("k%02d", i), fmt.Sprint("v", i)); err != nil {
			t.Fatal(err)
		}
	}
	targetDir := filepath.Join(t.TempDir(), "target")
	target := "file://" + targetDir
	res := testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "backup", "create",
		"--endpoints="+c.Endpoints()[0], "--target="+target)
	if res.Code != 0 {
		t.Fatalf("backup create: exit %d, stdout %q, stderr %s", res.Code, res.Stdout, res.Stderr)
	}
	tgt, err := backup.OpenTarget(ctx, target, backup.TargetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := backup.List(ctx, tgt)
	if err != nil || len(list) != 1 {
		t.Fatalf("versions %v, %v; want one", list, err)
	}
	v := list[0]
	lease, err := cli.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		var err error
		switch i % 4 {
		case 1:
			_, err = cli.Delete(ctx, fmt.Sprintf("k%02d", i))
		case 2:
			_, err = cli.Put(ctx, fmt.Sprintf("leased%02d", i), "x", clientv3.WithLease(lease.ID))
		case 3:
			_, err = cli.Txn(ctx).If(clientv3.Compare(clientv3.Version(fmt.Sprintf("k%02d", i)), "=", 1)).
				Then(clientv3.OpPut(fmt.Sprintf("k%02d", i), "txn")).Commit()
		default:
			_, err = cli.Put(ctx, fmt.Sprintf("k%02d", i), fmt.Sprint("after", i))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	last, err := cli.Get(ctx, "k00")
	if err != nil {
		t.Fatal(err)
	}
	lastRev := last.Header.Revision
	st := lp.waitCommit(t, memberCommit(t, c), 30*time.Second)
	if st.FirstIndex > v.RaftIndex+1 {
		t.Fatalf("the logger holds from %d; the version is at index %d", st.FirstIndex, v.RaftIndex)
	}
	t.Logf("version %d at index %d, revision %d; the logger holds %d-%d committed; the cluster is at revision %d",
		v.Version, v.RaftIndex, v.Revision, st.FirstIndex, st.CommitIndex, lastRev)

	for _, rev := range []int64{v.Revision + 1, (v.Revision + lastRev) / 2, lastRev} {
		want := readBackupStateAt(t, ctx, cli, c.Endpoints()[0], rev)
		restoreFromLogger(t, target, lp.clientURL, fmt.Sprintf("--to-revision=%d", rev), fmt.Sprintf("restored revision %d ", rev), &want)
	}
	// An index: the member's state there is not asked (etcd answers by
	// revision); the restore must replay to exactly that index.
	idx := (v.RaftIndex + st.CommitIndex) / 2
	restoreFromLogger(t, target, lp.clientURL, fmt.Sprintf("--to-index=%d", idx),
		fmt.Sprintf("restored index %d (version %d of %s at raft index %d, revision %d, then the logger at %s to index %d;",
			idx, v.Version, target, v.RaftIndex, v.Revision, lp.clientURL, idx), nil)

	refusals := []struct {
		name, wantErr string
		args          []string
	}{
		{name: "the archive holds nothing", args: []string{fmt.Sprintf("--to-revision=%d", lastRev)},
			wantErr: "holds committed entries nothing"},
		{name: "past the logger's commit", args: []string{"--logger=" + lp.clientURL, fmt.Sprintf("--to-revision=%d", lastRev+1000)},
			wantErr: fmt.Sprintf("the logger at %s holds committed entries %d-", lp.clientURL, st.FirstIndex)},
		{name: "another cluster named", args: []string{"--logger=" + lp.clientURL, "--logger-cluster=1234", fmt.Sprintf("--to-revision=%d", lastRev)},
			wantErr: "the logger's cluster was named 1234"},
	}
	for _, tt := range refusals {
		res := testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata),
			append([]string{"restore", "--from=" + target, "--data-dir=" + filepath.Join(t.TempDir(), "none")}, tt.args...)...)
		if res.Code != 1 || !strings.Contains(res.Stderr, tt.wantErr) {
			t.Errorf("%s: exit %d, stderr %q; want exit 1 with %q", tt.name, res.Code, res.Stderr, tt.wantErr)
		}
	}
}

// restoreFromLogger restores target with the logger at loggerURL as the
// source of the entries (goal: --to-revision or --to-index) into a new
// single-member cluster, checks the output starts with wantOut and, if
// want is not nil, that the member answers want.
func restoreFromLogger(t *testing.T, target, loggerURL, goal, wantOut string, want *backupState) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, strata), Name: "r", Token: "restored"})
	res := testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "restore", "--from="+target,
		"--logger="+loggerURL, goal, "--data-dir="+p.DataDir(), "--name=r", "--initial-cluster=r="+p.PeerURL(),
		"--initial-advertise-peer-urls="+p.PeerURL(), "--initial-cluster-token=restored")
	if res.Code != 0 || !strings.HasPrefix(res.Stdout, wantOut) {
		t.Fatalf("restore %s: exit %d, stdout %q, stderr %s; want stdout starting %q", goal, res.Code, res.Stdout, res.Stderr, wantOut)
	}
	if want == nil {
		return
	}
	p.Launch()
	if err := p.WaitReady(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	got := readBackupState(t, ctx, p.Client(t), p.Endpoint())
	if got.rev != want.rev || got.hash != want.hash || strings.Join(got.kvs, "\n") != strings.Join(want.kvs, "\n") {
		t.Errorf("restored %s: revision %d, HashKV %d, keys\n%s\nthe live cluster answered revision %d, HashKV %d, keys\n%s",
			goal, got.rev, got.hash, strings.Join(got.kvs, "\n"), want.rev, want.hash, strings.Join(want.kvs, "\n"))
	}
	p.Stop()
}

// TestLoggerTruncateAtBackupVersion: members with --logger-truncate and a
// backup target ask the logger to truncate at the newest backup version's
// raft index, not at their engines' durable indexes (docs/logger.md,
// "Truncation at a backup version"): before the target holds a version the
// logger trims nothing, however far the members flushed; after one, it
// trims exactly at the version's index while the members' durable indexes
// are hundreds of entries past it; and a restore from that version with the
// logger's entries reaches the cluster's last revision.
func TestLoggerTruncateAtBackupVersion(t *testing.T) {
	target := "file://" + filepath.Join(t.TempDir(), "target")
	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, strata), Size: 3,
		Flags: []string{"--snapshot-count=100", "--snapshot-catchup-entries=10", "--logger-truncate", "--backup-target=" + target}})
	cli := c.Client(t)
	defer cli.Close()
	lp := startLogger(t)
	addLoggerTo(t, c, lp)
	lp.Launch()
	waitLoggerPublished(t, c, lp)
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	put := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if _, err := cli.Put(ctx, fmt.Sprintf("k/%03d", i), fmt.Sprint("v", i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	put(0, 300)
	lp.waitCommit(t, memberCommit(t, c), 30*time.Second)
	// Three of the members' one-second rounds, each past several engine
	// flushes (--snapshot-count=100): without a version nothing is asked.
	time.Sleep(3 * time.Second)
	if st, err := lp.status(); err != nil || len(st.Truncations) != 0 || st.FirstIndex != 1 {
		t.Fatalf("before any backup version: status %+v, %v; want no truncation request and the log from index 1", st, err)
	}

	res := testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "backup", "create", "--endpoints="+c.Endpoints()[0])
	if res.Code != 0 {
		t.Fatalf("backup create: exit %d, stdout %q, stderr %s", res.Code, res.Stdout, res.Stderr)
	}
	tgt, err := backup.OpenTarget(ctx, target, backup.TargetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := backup.List(ctx, tgt)
	if err != nil || len(list) != 1 {
		t.Fatalf("versions %v, %v; want one", list, err)
	}
	v := list[0]
	put(300, 600)
	commit := memberCommit(t, c)
	deadline := time.Now().Add(30 * time.Second)
	var st *logger.ClusterStatus
	for {
		st, err = lp.status()
		if err == nil && len(st.Truncations) == 3 && st.TruncationPoint == v.RaftIndex && st.FirstIndex == v.RaftIndex+1 {
			break
		}
		if err == nil && st.TruncationPoint > v.RaftIndex {
			t.Fatalf("the logger trimmed at %d, past the backup version's index %d: %+v", st.TruncationPoint, v.RaftIndex, st)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the logger never trimmed at the version's index %d: %+v, %v", v.RaftIndex, st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if commit < v.RaftIndex+300 {
		t.Fatalf("the cluster committed %d, the version is at %d: the test needs the members' durable indexes far past it", commit, v.RaftIndex)
	}
	t.Logf("version %d at index %d; cluster commit %d; the logger holds from %d", v.Version, v.RaftIndex, commit, st.FirstIndex)
	// The flushes after the version moved the durable indexes on; the
	// requests still name the version's index.
	time.Sleep(2 * time.Second)
	if st, err := lp.status(); err != nil || st.TruncationPoint != v.RaftIndex {
		t.Fatalf("later: status %+v, %v; want the truncation point to stay at %d", st, err, v.RaftIndex)
	}

	last, err := cli.Get(ctx, "k/000")
	if err != nil {
		t.Fatal(err)
	}
	lp.waitCommit(t, memberCommit(t, c), 30*time.Second)
	want := readBackupStateAt(t, ctx, cli, c.Endpoints()[0], last.Header.Revision)
	restoreFromLogger(t, target, lp.clientURL, fmt.Sprintf("--to-revision=%d", last.Header.Revision),
		fmt.Sprintf("restored revision %d ", last.Header.Revision), &want)
}
