package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-kv/strata/internal/testutil"
	"github.com/strata-kv/strata/logger"
)

// loggerProc is a `strata logger` process and its client.
type loggerProc struct {
	*testutil.Process
	dir, peerURL, clientURL string
	cli                     *logger.Client
}

func startLogger(t *testing.T) *loggerProc {
	t.Helper()
	return startLoggerWith(t)
}

// startLoggerWith is startLogger with more flags for `strata logger`.
func startLoggerWith(t *testing.T, flags ...string) *loggerProc {
	t.Helper()
	ports := testutil.FreePorts(t, 2)
	lp := &loggerProc{
		dir:       filepath.Join(t.TempDir(), "logger.data"),
		peerURL:   fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
		clientURL: fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
	}
	lp.Process = testutil.NewProcess(t, testutil.Options{
		Binary: binary(t, strata), Name: "logger", DataDir: lp.dir,
		Command: append([]string{"logger", "--data-dir=" + lp.dir, "--listen-peer-urls=" + lp.peerURL,
			"--advertise-peer-urls=" + lp.peerURL, "--listen-client-urls=" + lp.clientURL}, flags...),
	})
	cli, err := logger.Dial(lp.clientURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	lp.cli = cli
	return lp
}

// status returns the logger's status of its only cluster, or an error.
func (lp *loggerProc) status() (*logger.ClusterStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	sts, err := lp.cli.Status(ctx, 0)
	if err != nil {
		return nil, err
	}
	if len(sts) != 1 {
		return nil, fmt.Errorf("logger serves %d clusters", len(sts))
	}
	return sts[0], nil
}

// waitCommit waits until the logger holds committed entries up to index.
func (lp *loggerProc) waitCommit(t *testing.T, index uint64, timeout time.Duration) *logger.ClusterStatus {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st, err := lp.status()
		if err == nil && st.CommitIndex >= index {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("logger did not reach commit index %d in %v: status %+v, error %v", index, timeout, st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (lp *loggerProc) recover(t *testing.T, cid, first, last uint64) ([]*raftpb.Entry, error) {
	t.Helper()
	var out []*raftpb.Entry
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := lp.cli.Recover(ctx, cid, first, last, func(ents []*raftpb.Entry) error {
		out = append(out, ents...)
		return nil
	})
	return out, err
}

// memberCommit is the commit index the cluster reports (etcd's Status
// RaftIndex is strata's commit index).
func memberCommit(t *testing.T, c *testutil.Cluster) uint64 {
	t.Helper()
	cli := c.Client(t)
	defer cli.Close()
	var highest uint64
	for _, ep := range c.Endpoints() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := cli.Status(ctx, ep)
		cancel()
		if err == nil && st.RaftIndex > highest {
			highest = st.RaftIndex
		}
	}
	if highest == 0 {
		t.Fatal("no member answered Status")
	}
	return highest
}

func runStrata(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(binary(t, strata), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// TestLogger runs a cluster of three strata members and one logger joined
// as a learner: the logger's log equals the members' committed entries,
// kill -9 under load loses nothing it acknowledged and it catches up, the
// cluster serves writes with the logger SIGSTOPped, and Recover refuses
// what the logger does not hold.
func TestLogger(t *testing.T) {
	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, strata), Size: 3})
	cli := c.Client(t)
	defer cli.Close()
	lp := startLogger(t)

	// The operator adds the logger as a learner, then joins it.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var addErr error
	for {
		_, addErr = cli.MemberAddAsLearner(ctx, []string{lp.peerURL})
		if addErr == nil || !strings.Contains(addErr.Error(), "unhealthy cluster") || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if addErr != nil {
		t.Fatalf("member add --learner: %v", addErr)
	}
	out, err := runStrata(t, "logger", "join", "--data-dir="+lp.dir, "--name=L1",
		"--advertise-peer-urls="+lp.peerURL, "--endpoints="+strings.Join(c.Endpoints(), ","))
	if err != nil {
		t.Fatalf("strata logger join: %v\n%s", err, out)
	}
	t.Logf("join: %s", strings.TrimSpace(out))
	if out, err := runStrata(t, "logger", "join", "--data-dir="+lp.dir, "--name=L1",
		"--advertise-peer-urls="+lp.peerURL, "--endpoints="+c.Endpoints()[0]); err == nil || !strings.Contains(out, "already joined") {
		t.Errorf("second join: %v, %q; want a refusal naming the cluster already joined", err, out)
	}
	lp.Launch()
	for i := 0; i < 20; i++ {
		if _, err := cli.Put(context.Background(), fmt.Sprintf("before/%d", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	st := lp.waitCommit(t, memberCommit(t, c), 30*time.Second)
	cid := st.ClusterID
	t.Logf("logger joined cluster %x as %x: %+v", cid, st.MemberID, st)
	if st.FirstIndex != 1 || len(st.Gaps) != 0 {
		t.Fatalf("logger holds from %d with gaps %v; want the whole log from 1 (the leader truncated nothing)", st.FirstIndex, st.Gaps)
	}

	// Writes under load; kill -9 the logger in the middle and restart it.
	var (
		wg      sync.WaitGroup
		stop    = make(chan struct{})
		writeMu sync.Mutex
		writes  int
		werr    error
	)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := cli.Put(ctx, fmt.Sprintf("load/%d/%d", w, i), strings.Repeat("x", 100))
				cancel()
				writeMu.Lock()
				if err != nil && werr == nil {
					werr = err
				}
				writes++
				writeMu.Unlock()
			}
		}(w)
	}
	time.Sleep(time.Second)
	before, err := lp.status()
	if err != nil {
		t.Fatal(err)
	}
	lp.Kill()
	// What it acknowledged is on disk: its log, read offline, holds at
	// least what Status reported held (durable) before the kill.
	out, err = runStrata(t, "inspect", "log", "--entries", "--data-dir="+filepath.Join(lp.dir, "clusters", fmt.Sprintf("%x", cid)))
	if err != nil {
		t.Fatalf("inspect the killed logger's log: %v\n%s", err, out)
	}
	var offline struct {
		Entries []struct {
			Index uint64 `json:"index"`
		} `json:"entries"`
	}
	if err := json.Unmarshal([]byte(out), &offline); err != nil {
		t.Fatal(err)
	}
	if n := len(offline.Entries); n == 0 || offline.Entries[n-1].Index < before.LastIndex {
		t.Fatalf("after kill -9 the logger's log ends at %v, but it held %d before", offline.Entries[max(n-1, 0):], before.LastIndex)
	}
	time.Sleep(500 * time.Millisecond)
	lp.Launch()
	time.Sleep(time.Second)

	// SIGSTOP: the cluster keeps serving writes (the logger is no voter).
	lp.Pause()
	paused := time.Now()
	for i := 0; i < 50; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_, err := cli.Put(ctx, fmt.Sprintf("paused/%d", i), "v")
		cancel()
		if err != nil {
			lp.Resume()
			t.Fatalf("put %d with the logger SIGSTOPped: %v", i, err)
		}
	}
	t.Logf("50 puts with the logger stopped took %v", time.Since(paused))
	lp.Resume()
	close(stop)
	wg.Wait()
	if werr != nil {
		t.Fatalf("a write under load failed: %v", werr)
	}
	t.Logf("%d writes under load", writes)

	// It catches up with everything committed.
	commit := memberCommit(t, c)
	st = lp.waitCommit(t, commit, 60*time.Second)
	t.Logf("caught up: %+v", st)
	ents, err := lp.recover(t, cid, 1, commit)
	if err != nil {
		t.Fatalf("recover [1, %d]: %v", commit, err)
	}
	if uint64(len(ents)) != commit {
		t.Fatalf("recover [1, %d] returned %d entries", commit, len(ents))
	}

	// Refusals.
	tests := []struct {
		name        string
		first, last uint64
		want        codes.Code
	}{
		{name: "first > last", first: 10, last: 5, want: codes.InvalidArgument},
		{name: "first 0", first: 0, last: 5, want: codes.InvalidArgument},
		{name: "past the commit index", first: 1, last: st.CommitIndex + 1000, want: codes.OutOfRange},
	}
	for _, tt := range tests {
		_, err := lp.recover(t, cid, tt.first, tt.last)
		if status.Code(err) != tt.want {
			t.Errorf("%s: recover [%d, %d]: %v, want %v", tt.name, tt.first, tt.last, err, tt.want)
		}
	}
	if out, err := runStrata(t, "logger", "recover", "--endpoint="+lp.clientURL, fmt.Sprintf("--cluster=%x", cid),
		"--first=1", fmt.Sprintf("--last=%d", st.CommitIndex+1000)); err == nil || !strings.Contains(out, "OutOfRange") {
		t.Errorf("strata logger recover past the commit index: %v, %q", err, out)
	}
	if out, err := runStrata(t, "logger", "status", "--endpoint="+lp.clientURL); err != nil || !strings.Contains(out, fmt.Sprintf("%x", cid)) {
		t.Errorf("strata logger status: %v\n%s", err, out)
	}

	// The logger's log equals a member's committed entries: stop a
	// follower and read its log offline.
	lead, err := c.WaitLeader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	f := (lead + 1) % 3
	c.Members[f].Stop()
	out, err = runStrata(t, "inspect", "log", "--entries", "--data-dir="+c.Members[f].DataDir())
	if err != nil {
		t.Fatalf("inspect member log: %v\n%s", err, out)
	}
	var member struct {
		HardState struct {
			Commit uint64 `json:"commit"`
		} `json:"hard_state"`
		Entries []struct {
			Index uint64 `json:"index"`
			Term  uint64 `json:"term"`
			Type  int32  `json:"type"`
			Data  []byte `json:"data"`
		} `json:"entries"`
	}
	if err := json.Unmarshal([]byte(out), &member); err != nil {
		t.Fatal(err)
	}
	compared := 0
	for _, me := range member.Entries {
		if me.Index > member.HardState.Commit || me.Index > uint64(len(ents)) || me.Index == 0 {
			continue
		}
		le := ents[me.Index-1]
		if le.GetIndex() != me.Index || le.GetTerm() != me.Term || int32(le.GetType()) != me.Type || !bytes.Equal(le.GetData(), me.Data) {
			t.Fatalf("entry %d differs: logger (term %d, type %d, %d bytes), member (term %d, type %d, %d bytes)",
				me.Index, le.GetTerm(), le.GetType(), len(le.GetData()), me.Term, me.Type, len(me.Data))
		}
		compared++
	}
	if compared < writes/2 {
		t.Fatalf("compared only %d entries with the member's log (%d writes)", compared, writes)
	}
	t.Logf("the logger's entries equal member %s's committed entries over %d indexes", c.Members[f].Name(), compared)

	// Truncate: one voter of three trims nothing, two trim at the lower
	// index; a member the cluster does not have is refused.
	ml, err := cli.MemberList(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var voters []uint64
	for _, m := range ml.Members {
		if !m.IsLearner {
			voters = append(voters, m.ID)
		}
	}
	if len(voters) != 3 {
		t.Fatalf("voters %v", voters)
	}
	truncate := func(member, index uint64) (string, error) {
		return runStrata(t, "logger", "truncate", "--endpoint="+lp.clientURL, fmt.Sprintf("--cluster=%x", cid),
			fmt.Sprintf("--member=%x", member), fmt.Sprintf("--index=%d", index))
	}
	if out, err := truncate(voters[0], 100); err != nil || !strings.Contains(out, "truncation point is 0") {
		t.Fatalf("truncate from one voter: %v, %q", err, out)
	}
	if st, err := lp.status(); err != nil || st.FirstIndex != 1 {
		t.Fatalf("after a truncate from one voter of three: %+v, %v", st, err)
	}
	if out, err := truncate(voters[1], 50); err != nil || !strings.Contains(out, "truncation point is 50") {
		t.Fatalf("truncate from a second voter: %v, %q", err, out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := lp.status()
		if err == nil && st.FirstIndex == 51 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the logger did not truncate at 50: %+v, %v", st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := lp.recover(t, cid, 1, 60); status.Code(err) != codes.OutOfRange {
		t.Fatalf("recover of a truncated range: %v", err)
	}
	if got, err := lp.recover(t, cid, 51, commit); err != nil || uint64(len(got)) != commit-50 {
		t.Fatalf("recover [51, %d] after the truncation: %d entries, %v", commit, len(got), err)
	}
	if out, err := truncate(0xdead, 10); err == nil || !strings.Contains(out, "not a voter") {
		t.Fatalf("truncate from a member the cluster does not have: %v, %q", err, out)
	}
}

// TestLoggerGap stops the logger while the members compact their logs past
// what it holds: the leader then sends it a snapshot, the logger records
// the gap, holds the log only after it, and refuses Recover below it.
func TestLoggerGap(t *testing.T) {
	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, strata), Size: 3,
		Flags: []string{"--snapshot-count=200", "--snapshot-catchup-entries=10"}})
	cli := c.Client(t)
	defer cli.Close()
	lp := startLogger(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		_, err := cli.MemberAddAsLearner(ctx, []string{lp.peerURL})
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "unhealthy cluster") || ctx.Err() != nil {
			t.Fatalf("member add --learner: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out, err := runStrata(t, "logger", "join", "--data-dir="+lp.dir, "--name=L1",
		"--advertise-peer-urls="+lp.peerURL, "--endpoints="+c.Endpoints()[0]); err != nil {
		t.Fatalf("strata logger join: %v\n%s", err, out)
	}
	lp.Launch()
	st := lp.waitCommit(t, memberCommit(t, c), 30*time.Second)
	cid, heldBefore := st.ClusterID, st.LastIndex

	lp.Kill()
	for i := 0; i < 1000; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := cli.Put(ctx, fmt.Sprintf("k/%d", i), "v")
		cancel()
		if err != nil {
			t.Fatalf("put %d with the logger down: %v", i, err)
		}
	}
	lp.Launch()
	commit := memberCommit(t, c)
	st = lp.waitCommit(t, commit, 60*time.Second)
	if len(st.Gaps) == 0 {
		t.Fatalf("the logger caught up without a gap (%+v): the members did not compact their logs past %d", st, heldBefore)
	}
	g := st.Gaps[len(st.Gaps)-1]
	t.Logf("gap: %v; status %+v", g, st)
	if g.SnapshotIndex <= heldBefore || st.FirstIndex != g.SnapshotIndex+1 {
		t.Fatalf("gap at %d, first index %d; want a snapshot past %d and the log held from after it", g.SnapshotIndex, st.FirstIndex, heldBefore)
	}
	if _, err := lp.recover(t, cid, 1, commit); status.Code(err) != codes.OutOfRange || !strings.Contains(err.Error(), "never received") {
		t.Fatalf("recover [1, %d] across the gap: %v, want OutOfRange naming the gap", commit, err)
	}
	// Entries written after the snapshot are held and served.
	for i := 0; i < 10; i++ {
		if _, err := cli.Put(context.Background(), fmt.Sprintf("after/%d", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	commit = memberCommit(t, c)
	lp.waitCommit(t, commit, 30*time.Second)
	ents, err := lp.recover(t, cid, st.FirstIndex, commit)
	if err != nil || uint64(len(ents)) != commit-st.FirstIndex+1 {
		t.Fatalf("recover [%d, %d] after the gap: %d entries, %v", st.FirstIndex, commit, len(ents), err)
	}
}

// addLoggerTo adds lp to cluster c as a learner and joins it as L1.
func addLoggerTo(t *testing.T, c *testutil.Cluster, lp *loggerProc) {
	t.Helper()
	addNamedLoggerTo(t, c, lp, "L1")
}

// addNamedLoggerTo adds lp to cluster c as a learner and joins it as name.
func addNamedLoggerTo(t *testing.T, c *testutil.Cluster, lp *loggerProc, name string) {
	t.Helper()
	cli := c.Client(t)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		_, err := cli.MemberAddAsLearner(ctx, []string{lp.peerURL})
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "unhealthy cluster") || ctx.Err() != nil {
			t.Fatalf("member add --learner: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out, err := runStrata(t, "logger", "join", "--data-dir="+lp.dir, "--name="+name,
		"--advertise-peer-urls="+lp.peerURL, "--endpoints="+c.Endpoints()[0]); err != nil {
		t.Fatalf("strata logger join: %v\n%s", err, out)
	}
}

// TestLoggerTwoClusters has one logger serve two clusters of three on one
// peer URL (streams routed by cluster ID): a cluster joined while the
// logger runs is served within a second, each cluster's log is complete,
// and a second logger on the same data directory is refused.
func TestLoggerTwoClusters(t *testing.T) {
	a := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, strata), Size: 3})
	b := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, strata), Size: 3})
	lp := startLogger(t)
	addLoggerTo(t, a, lp)
	lp.Launch()
	addLoggerTo(t, b, lp) // joined while the logger runs
	for i, c := range []*testutil.Cluster{a, b} {
		cli := c.Client(t)
		for j := 0; j < 100; j++ {
			if _, err := cli.Put(context.Background(), fmt.Sprintf("c%d/%d", i, j), "v"); err != nil {
				t.Fatal(err)
			}
		}
		cli.Close()
	}
	commits := map[uint64]uint64{}
	for _, c := range []*testutil.Cluster{a, b} {
		cli := c.Client(t)
		ml, err := cli.MemberList(context.Background())
		cli.Close()
		if err != nil {
			t.Fatal(err)
		}
		commits[ml.Header.ClusterId] = memberCommit(t, c)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		sts, err := lp.cli.Status(ctx, 0)
		cancel()
		done := err == nil && len(sts) == 2
		for _, st := range sts {
			if st.CommitIndex < commits[st.ClusterID] {
				done = false
			}
		}
		if done {
			for _, st := range sts {
				ents, err := lp.recover(t, st.ClusterID, 1, commits[st.ClusterID])
				if err != nil || uint64(len(ents)) != commits[st.ClusterID] {
					t.Fatalf("recover [1, %d] of cluster %x: %d entries, %v", commits[st.ClusterID], st.ClusterID, len(ents), err)
				}
				t.Logf("cluster %x: %+v", st.ClusterID, st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the logger did not catch up with both clusters (%v): %+v, %v", commits, sts, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	ports := testutil.FreePorts(t, 2)
	out, err := runStrata(t, "logger", "--data-dir="+lp.dir, fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", ports[0]),
		fmt.Sprintf("--listen-client-urls=http://127.0.0.1:%d", ports[1]))
	if err == nil || !strings.Contains(out, "in use by another process") {
		t.Fatalf("a second logger on the same data directory: %v, %q", err, out)
	}
}
