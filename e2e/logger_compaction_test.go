package e2e

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strata-kv/strata/backup"
	"github.com/strata-kv/strata/internal/testutil"
)

// diskBytes is what the files under dir occupy on disk (allocated blocks).
func diskBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		} else {
			n += info.Size()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLoggerLogCompaction: a cluster of three with two loggers, L1 with
// log compaction (--log-compaction --log-compaction-batch=200 --history
// latest) and L2 without, the same segment size; a backup version taken
// early; then many overwrites of few keys. L1's data directory (log,
// batches and compaction state) takes a fraction of L2's on disk, and its
// Status says how much it compacted. `strata restore --from --logger L1
// --to-revision R` at the cluster's last revision reproduces the live
// cluster's keys and revisions exactly, `--to-index` at the end of a batch
// gives what the same restore from L2 (plain entries) gives, and an index
// strictly inside a batch is refused naming the batch.
func TestLoggerLogCompaction(t *testing.T) {
	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, strata), Size: 3})
	cli := c.Client(t)
	defer cli.Close()
	segment := "--log-segment-size=262144"
	l1 := startLoggerWith(t, "--log-compaction", "--log-compaction-batch=200", "--history=latest", segment)
	addNamedLoggerTo(t, c, l1, "L1")
	l1.Launch()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Second)
	defer cancel()
	// The second logger is added once the first has published (a logger
	// not yet published counts as an ordinary learner).
	waitLoggerPublished(t, c, l1)
	l2 := startLoggerWith(t, segment)
	addNamedLoggerTo(t, c, l2, "L2")
	l2.Launch()

	for i := range 20 {
		if _, err := cli.Put(ctx, fmt.Sprintf("k%d", i%10), fmt.Sprint("before ", i)); err != nil {
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

	// Many overwrites of ten keys, a lease and a delete among them.
	lease, err := cli.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	value := strings.Repeat("v", 1000)
	const writers, perWriter = 16, 600
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				var err error
				switch {
				case w == 0 && i == perWriter/2:
					_, err = cli.Delete(ctx, "k3")
				case w == 1 && i%100 == 0:
					_, err = cli.Put(ctx, "leased", fmt.Sprint(i), clientv3.WithLease(lease.ID))
				default:
					_, err = cli.Put(ctx, fmt.Sprintf("k%d", (w+i)%10), fmt.Sprintf("%d-%d %s", w, i, value))
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	head, err := cli.Get(ctx, "k0")
	if err != nil {
		t.Fatal(err)
	}
	lastRev := head.Header.Revision
	commit := memberCommit(t, c)
	l2.waitCommit(t, commit, 60*time.Second)
	st1 := l1.waitCommit(t, commit, 60*time.Second)
	// Batches of 200 up to the last full one before the commit index.
	deadline := time.Now().Add(60 * time.Second)
	for st1.CompactedLast+200 <= commit {
		if time.Now().After(deadline) {
			t.Fatalf("L1 compacted up to %d of %d: %+v", st1.CompactedLast, commit, st1)
		}
		time.Sleep(100 * time.Millisecond)
		if st1, err = l1.status(); err != nil {
			t.Fatal(err)
		}
	}
	st2, err := l2.status()
	if err != nil {
		t.Fatal(err)
	}
	d1, d2 := diskBytes(t, l1.dir), diskBytes(t, l2.dir)
	t.Logf("L1 (compaction): %d bytes on disk; status: log %d bytes, batches %d-%d: %d entries in %d batches, %d records, %d bytes (%s)",
		d1, st1.Bytes, st1.CompactedFirst, st1.CompactedLast, st1.CompactedEntries, st1.CompactedBatches, st1.CompactedRecords, st1.CompactedBytes, st1.Compaction)
	t.Logf("L2 (none): %d bytes on disk; status: log %d bytes, first %d, commit %d", d2, st2.Bytes, st2.FirstIndex, st2.CommitIndex)
	if st1.Compaction != "on" || st1.CompactedFirst != 1 || st1.FirstIndex != 1 || st1.CompactedBatches == 0 ||
		st1.CompactedEntries != st1.CompactedLast || st1.CompactedRecords*5 > st1.CompactedEntries {
		t.Errorf("L1 status %+v: want compaction on, batches from 1, at most a record per five entries", st1)
	}
	if st2.Compaction != "off" || st2.CompactedBatches != 0 {
		t.Errorf("L2 status %+v: want compaction off, no batches", st2)
	}
	if d1*4 > d2 {
		t.Errorf("L1's data directory takes %d bytes, L2's %d: want at most a quarter", d1, d2)
	}
	if held1, held2 := st1.Bytes+st1.CompactedBytes, st2.Bytes; held1*5 > held2 {
		t.Errorf("L1's log holds %d bytes, L2's %d: want at most a fifth", held1, held2)
	}

	// The live cluster's state at its last revision, from L1.
	want := readKVsAt(t, ctx, cli, lastRev)
	got := restoreKVs(t, target, l1.clientURL, fmt.Sprintf("--to-revision=%d", lastRev))
	if got != want {
		t.Errorf("restored from L1 to revision %d:\n%s\nthe live cluster answered:\n%s", lastRev, got, want)
	}
	// An index at the end of a batch: as from L2's plain entries.
	idx := st1.CompactedLast - 200
	if idx <= v.RaftIndex {
		t.Fatalf("batch end %d is not after the version's index %d", idx, v.RaftIndex)
	}
	from1 := restoreKVs(t, target, l1.clientURL, fmt.Sprintf("--to-index=%d", idx))
	from2 := restoreKVs(t, target, l2.clientURL, fmt.Sprintf("--to-index=%d", idx))
	if from1 != from2 {
		t.Errorf("restored to index %d from L1:\n%s\nfrom L2:\n%s", idx, from1, from2)
	}
	// Strictly inside a batch: refused, naming it.
	res = testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "restore", "--from="+target,
		"--logger="+l1.clientURL, fmt.Sprintf("--to-index=%d", idx+100), "--data-dir="+filepath.Join(t.TempDir(), "none"))
	if wantErr := fmt.Sprintf("holds entries %d-%d as one compacted batch", idx+1, idx+200); res.Code != 1 || !strings.Contains(res.Stderr, wantErr) {
		t.Errorf("restore to an index inside a batch: exit %d, stderr %q; want exit 1 with %q", res.Code, res.Stderr, wantErr)
	}
}

// readKVsAt is the cluster's keys (value, create and mod revision,
// version, lease) at rev, and rev.
func readKVsAt(t *testing.T, ctx context.Context, cli *clientv3.Client, rev int64) string {
	t.Helper()
	resp, err := cli.Get(ctx, "", clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "revision %d\n", rev)
	for _, kv := range resp.Kvs {
		fmt.Fprintf(&b, "%s=%.40q c%d m%d v%d l%x\n", kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease)
	}
	return b.String()
}

// restoreKVs restores target with the logger at loggerURL to goal into a
// new single-member cluster and returns its keys and revision (readKVsAt).
func restoreKVs(t *testing.T, target, loggerURL, goal string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, strata), Name: "r", Token: "restored"})
	res := testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "restore", "--from="+target,
		"--logger="+loggerURL, goal, "--data-dir="+p.DataDir(), "--name=r", "--initial-cluster=r="+p.PeerURL(),
		"--initial-advertise-peer-urls="+p.PeerURL(), "--initial-cluster-token=restored")
	if res.Code != 0 {
		t.Fatalf("restore %s from %s: exit %d, stdout %q, stderr %s", goal, loggerURL, res.Code, res.Stdout, res.Stderr)
	}
	p.Launch()
	if err := p.WaitReady(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	cli := p.Client(t)
	defer cli.Close()
	resp, err := cli.Get(ctx, "k0")
	if err != nil {
		t.Fatal(err)
	}
	return readKVsAt(t, ctx, cli, resp.Header.Revision)
}
