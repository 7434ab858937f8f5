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
