package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strata-kv/strata/internal/testutil"
)

// TestClusterIncrementalSnapshot: three members with log compaction on
// small segments. A follower is stopped while the others write past their
// logs' first index; on restart the leader must send it the compacted
// batches that cover its gap (an incremental snapshot), not the whole
// engine. Afterwards reads through it return what the leader returns
// (values, create and mod revisions, versions, revision) and HashKV agrees
// on every member. Then the follower is stopped for longer, until engine
// flushes have deleted the batches its gap needs: it must get a full
// snapshot. The bytes sent each way are logged (INCREMENTAL SNAPSHOT).
//
// The flags: the first engine flush (at 100+2000 applied entries) lets the
// first segment, which holds the bootstrap conf changes, be truncated so
// that later segments can be compacted; after that the log keeps batches
// for the last 2000 entries (--snapshot-catchup-entries), as long as the
// compactor (one pass a second) keeps ahead of that truncation: the
// writes during the short absence are paced for it.
func TestClusterIncrementalSnapshot(t *testing.T) {
	if os.Getenv("STRATA_E2E_CLUSTER") == "etcd" {
		t.Skip("strata's own log compaction and snapshots")
	}
	c := startTestCluster(t, 3, "--log-compaction", "--log-segment-size=32768",
		"--snapshot-count=100", "--snapshot-catchup-entries=2000")
	l := leaderIndex(t, c)
	cli := newClient(t, c.Members[l].Endpoint())
	// 1200 keys of 1 KiB: the state a full snapshot carries.
	putKeys(t, cli, 0, 1200, 1024, 0)
	round := 1
	for ; round <= 5; round++ {
		putKeys(t, cli, 0, 200, 100, round) // overwrites of 200 keys with small values
	}
	waitFor(t, "compacted batch files on the leader", func() bool {
		first, _, ok := batchRange(t, c.Members[l].DataDir())
		return ok && first > 0
	})

	// A short absence: the gap stays covered by batches.
	f := followers(c, l)[0]
	fm := c.Members[f]
	fIndex := appliedIndex(t, fm.Endpoint())
	fm.Kill()
	// Overwrites until the leader's log starts after the follower's last
	// entry.
	writeRoundsUntil(t, cli, &round, 300*time.Millisecond, func() bool {
		return metric(t, c.Members[l].Endpoint(), "strata_raftlog_first_index", "") > float64(fIndex+1)
	})
	var first, last uint64
	waitFor(t, "a whole view of the leader's batch files", func() bool {
		var ok bool
		first, last, ok = batchRange(t, c.Members[l].DataDir())
		return ok
	})
	t.Logf("follower %s stopped at index %d; the leader's batches cover %d..%d", fm.Name(), fIndex, first, last)
	if first > fIndex+1 {
		t.Fatalf("log truncation overtook log compaction: the batches start at %d, after the follower's %d", first, fIndex)
	}
	c.RestartMembers(f)
	waitCaughtUp(t, c, l, f)
	incSent := sumMetric(t, c, f, "strata_snapshot_sent_total", `kind="incremental"`)
	incBytes := sumMetric(t, c, f, "strata_snapshot_sent_bytes_total", `kind="incremental"`)
	if incSent < 1 || sumMetric(t, c, f, "strata_snapshot_sent_total", `kind="full"`) != 0 {
		t.Fatalf("after a short absence: %v incremental and %v full snapshots sent, want incremental only; follower output:\n%s",
			incSent, sumMetric(t, c, f, "strata_snapshot_sent_total", `kind="full"`), fm.CurrentOutput())
	}
	out := fm.CurrentOutput()
	if !strings.Contains(out, "installed incremental snapshot") {
		t.Fatalf("follower %s did not log \"installed incremental snapshot\":\n%s", fm.Name(), out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "received incremental snapshot") || strings.Contains(line, "installed incremental snapshot") {
			t.Logf("follower: %s", line)
		}
	}
	if got := metric(t, fm.Endpoint(), "strata_snapshot_received_total", `kind="incremental"`); got < 1 {
		t.Fatalf("follower counts %v incremental snapshots received", got)
	}
	fullNow := backupBytes(t, c.Members[l].Endpoint())
	t.Logf("INCREMENTAL SNAPSHOT: %.0f incremental snapshot(s), %.0f bytes; a full snapshot of the same state: %d bytes (%.1f%%)",
		incSent, incBytes, fullNow, 100*incBytes/float64(fullNow))
	sameReads(t, c.Members[l].Endpoint(), fm.Endpoint())
	sameHashKV(t, c)

	// A long absence: flushes delete the batches the gap needs. Killing
	// the follower now, with no write since its install, also checks
	// that the install was durable before its log restarted after the
	// snapshot: the engine's commits are not synced (its WAL is off), and
	// a restart would find entries missing between the engine and the log.
	fIndex = appliedIndex(t, fm.Endpoint())
	fm.Kill()
	writeRoundsUntil(t, cli, &round, 0, func() bool {
		first, _, ok := batchRange(t, c.Members[l].DataDir())
		return ok && first > fIndex+1 && metric(t, c.Members[l].Endpoint(), "strata_raftlog_first_index", "") > float64(fIndex+1)
	})
	c.RestartMembers(f)
	waitCaughtUp(t, c, l, f)
	fullSent := sumMetric(t, c, f, "strata_snapshot_sent_total", `kind="full"`)
	fullBytes := sumMetric(t, c, f, "strata_snapshot_sent_bytes_total", `kind="full"`)
	if fullSent < 1 {
		t.Fatalf("after a long absence no full snapshot was sent (%v incremental); leader output:\n%s",
			sumMetric(t, c, f, "strata_snapshot_sent_total", `kind="incremental"`), c.Members[l].CurrentOutput())
	}
	if out := c.Members[l].CurrentOutput(); !strings.Contains(out, "below the oldest compacted batch") &&
		!strings.Contains(out, "no compacted batch") {
		t.Errorf("the leader did not log why it sent a full snapshot (the member is below its batches)")
	}
	t.Logf("INCREMENTAL SNAPSHOT: fallback: %.0f full snapshot(s), %.0f bytes", fullSent, fullBytes)
	sameReads(t, c.Members[l].Endpoint(), fm.Endpoint())
	sameHashKV(t, c)
}

// putKeys writes keys k/0000.. [from, from+n) with values of size bytes
// (tagged with round), from 8 clients at once.
func putKeys(t *testing.T, cli *clientv3.Client, from, n, size, round int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := from + w; i < from+n; i += 8 {
				ctx, cancel := context.WithTimeout(context.Background(), faultTimeout)
				val := fmt.Sprintf("r%d-%s", round, strings.Repeat("x", size))
				_, err := cli.Put(ctx, fmt.Sprintf("k/%04d", i), val[:size])
				cancel()
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
		t.Fatalf("put: %v", err)
	}
}

// writeRoundsUntil overwrites 200 keys with small values, round after round,
// pause between rounds, until cond holds, for at most faultTimeout.
func writeRoundsUntil(t *testing.T, cli *clientv3.Client, round *int, pause time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(faultTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not reached after %d rounds of writes in %v", *round, faultTimeout)
		}
		putKeys(t, cli, 0, 200, 100, *round)
		*round++
		time.Sleep(pause)
	}
}

// waitFor polls cond until it holds or faultTimeout passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(faultTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after %v", what, faultTimeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// appliedIndex is a member's applied raft index.
func appliedIndex(t *testing.T, endpoint string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := newClient(t, endpoint).Status(ctx, endpoint)
	if err != nil {
		t.Fatalf("status of %s: %v", endpoint, err)
	}
	return st.RaftAppliedIndex
}

// waitCaughtUp waits until member f has applied what the leader l had
// applied when it was called.
func waitCaughtUp(t *testing.T, c *testutil.Cluster, l, f int) {
	t.Helper()
	want := appliedIndex(t, c.Members[l].Endpoint())
	waitFor(t, fmt.Sprintf("%s at index %d", c.Members[f].Name(), want), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		st, err := newClient(t, c.Members[f].Endpoint()).Status(ctx, c.Members[f].Endpoint())
		return err == nil && st.RaftAppliedIndex >= want
	})
}

// batchRange is the first and last index the compacted batch files in a
// member's log directory stand for (ok false if there are none or the
// live log could not be read whole).
func batchRange(t *testing.T, dataDir string) (first, last uint64, ok bool) {
	t.Helper()
	res := testutil.RunToExit(t, 30*time.Second, "", nil, binary(t, strata), "inspect", "log", "--data-dir", dataDir, "--json")
	if res.Code != 0 {
		return 0, 0, false // a file deleted or written under the inspection
	}
	var infos []struct {
		Compacted             bool
		FirstIndex, LastIndex uint64
	}
	if err := json.Unmarshal([]byte(res.Stdout), &infos); err != nil {
		t.Fatalf("strata inspect log --json: %v\n%s", err, res.Stdout)
	}
	for _, in := range infos {
		if !in.Compacted {
			continue
		}
		if !ok || in.FirstIndex < first {
			first = in.FirstIndex
		}
		last = max(last, in.LastIndex)
		ok = true
	}
	return first, last, ok
}

// metric reads one sample of a member's /metrics: name with exactly the
// labels given ("" for none), 0 if absent.
func metric(t *testing.T, endpoint, name, labels string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("metrics of %s: %v", endpoint, err)
	}
	defer resp.Body.Close()
	want := name
	if labels != "" {
		want += "{" + labels + "}"
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == want {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s = %q: %v", want, v, err)
			}
			return f
		}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return 0
}

// sumMetric adds a metric over every member but skip (the members that
// may have led).
func sumMetric(t *testing.T, c *testutil.Cluster, skip int, name, labels string) float64 {
	t.Helper()
	var sum float64
	for i, m := range c.Members {
		if i != skip {
			sum += metric(t, m.Endpoint(), name, labels)
		}
	}
	return sum
}

// backupBytes is the size of a member's backup (Maintenance.Snapshot):
// the full snapshot stream of its engine now, padded to 512 bytes, and a
// 32-byte digest.
func backupBytes(t *testing.T, endpoint string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rc, err := newClient(t, endpoint).Snapshot(ctx)
	if err != nil {
		t.Fatalf("snapshot of %s: %v", endpoint, err)
	}
	defer rc.Close()
	n, err := io.Copy(io.Discard, rc)
	if err != nil {
		t.Fatalf("snapshot of %s: %v", endpoint, err)
	}
	return n
}

// sameReads compares every key under k/ as the leader serves it
// (linearizable) and as a follower serves it (serializable, its own
// state): values, create and mod revisions, versions, and the revision.
func sameReads(t *testing.T, leader, follower string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	want, err := newClient(t, leader).Get(ctx, "k/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	got, err := newClient(t, follower).Get(ctx, "k/", clientv3.WithPrefix(), clientv3.WithSerializable())
	if err != nil {
		t.Fatal(err)
	}
	if got.Header.Revision != want.Header.Revision || len(got.Kvs) != len(want.Kvs) {
		t.Fatalf("follower: revision %d, %d keys; leader: revision %d, %d keys",
			got.Header.Revision, len(got.Kvs), want.Header.Revision, len(want.Kvs))
	}
	for i, kv := range want.Kvs {
		g := got.Kvs[i]
		if string(g.Key) != string(kv.Key) || string(g.Value) != string(kv.Value) || g.CreateRevision != kv.CreateRevision ||
			g.ModRevision != kv.ModRevision || g.Version != kv.Version || g.Lease != kv.Lease {
			t.Fatalf("key %s: follower %s c%d m%d v%d, leader %s c%d m%d v%d", kv.Key,
				g.Value[:min(8, len(g.Value))], g.CreateRevision, g.ModRevision, g.Version,
				kv.Value[:min(8, len(kv.Value))], kv.CreateRevision, kv.ModRevision, kv.Version)
		}
	}
}

// sameHashKV checks that every member's HashKV at the leader's revision
// is the same.
func sameHashKV(t *testing.T, c *testutil.Cluster) {
	t.Helper()
	rev := leaderRev(t, c.Members[leaderIndex(t, c)].Endpoint())
	want := hashKV(t, c.Members[0].Endpoint(), rev)
	for _, m := range c.Members[1:] {
		if got := hashKV(t, m.Endpoint(), rev); got != want {
			t.Errorf("HashKV at revision %d: %s %d, %s %d", rev, c.Members[0].Name(), want, m.Name(), got)
		}
	}
}
