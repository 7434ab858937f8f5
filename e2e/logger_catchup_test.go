package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strata-kv/strata/internal/testutil"
)

// TestLoggerCatchUp: a member wiped and re-added catches up from the
// logger (issue 12). A cluster of three with a logger joined from the start
// (--logger-retention: the logger holds the whole log from index 1) writes
// until the leader's log no longer starts at 1, so that a member with an
// empty log needs a snapshot from the leader. A follower is removed, its
// data directory deleted, and a new member is added with
// --catch-up-logger: it copies the logger's committed log into its own
// before raft starts, and the leader sends it only the entries after it:
// no snapshot is sent (strata_snapshot_sent_total on every member,
// strata_snapshot_received_total on the new one), and it serves the same
// keys, revisions and HashKV as the leader. Then a learner added without
// the flag gets a snapshot from the leader (the control: the same cluster
// does send one to an empty member). Before the control, the re-added
// member is killed while the leader's log moves past its last entry, and
// restarted: it copies the entries it missed from the logger, and again
// no snapshot is sent.
func TestLoggerCatchUp(t *testing.T) {
	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, strata), Size: 3,
		Flags: []string{"--snapshot-count=100", "--snapshot-catchup-entries=20", "--logger-retention"}})
	lp := startLogger(t)
	addLoggerTo(t, c, lp)
	lp.Launch()
	lp.waitCommit(t, memberCommit(t, c), 30*time.Second)
	// Until the logger has published its marked client URL, no member
	// knows it as a logger and --logger-retention holds nothing for it.
	waitLoggerPublished(t, c, lp)
	l := leaderIndex(t, c)
	cli := newClient(t, c.Members[l].Endpoint())
	round := 0
	writeRoundsUntil(t, cli, &round, 0, func() bool {
		return metric(t, c.Members[l].Endpoint(), "strata_raftlog_first_index", "") > 1
	})
	st := lp.waitCommit(t, memberCommit(t, c), 30*time.Second)
	if st.FirstIndex != 1 || len(st.Gaps) != 0 {
		t.Fatalf("the logger holds from %d, gaps %v; the test needs the whole log", st.FirstIndex, st.Gaps)
	}
	leaderFirst := metric(t, c.Members[l].Endpoint(), "strata_raftlog_first_index", "")
	t.Logf("after %d rounds of writes the leader's log starts at %v; the logger holds 1-%d", round, leaderFirst, st.CommitIndex)

	// Remove a follower and wipe its data directory.
	f := followers(c, l)[0]
	c.RemoveMember(f)
	if err := os.RemoveAll(c.Members[f].DataDir()); err != nil {
		t.Fatal(err)
	}
	live := []*testutil.Member{}
	for i, m := range c.Members {
		if i != f {
			live = append(live, m)
		}
	}
	snapshotsSent := func() float64 {
		var n float64
		for _, m := range live {
			n += metric(t, m.Endpoint(), "strata_snapshot_sent_total", `kind="full"`) +
				metric(t, m.Endpoint(), "strata_snapshot_sent_total", `kind="incremental"`)
		}
		return n
	}
	sentBefore := snapshotsSent()
	putKeys(t, cli, 0, 200, 100, round)
	round++

	// Re-add it, empty, with --catch-up-logger.
	m := c.PrepareMember()
	m.SetEnv("ETCD_CATCH_UP_LOGGER=" + lp.clientURL)
	id, initial := memberAdd(t, c, m)
	c.JoinMember(m, id, initial)
	live = append(live, m)
	putKeys(t, cli, 0, 200, 100, round)
	round++
	waitCaughtUp(t, c, l, len(c.Members)-1)
	if sent := snapshotsSent() - sentBefore; sent != 0 {
		t.Errorf("%v snapshots sent while the member caught up from the logger; leader output:\n%s", sent, c.Members[l].CurrentOutput())
	}
	if got := metric(t, m.Endpoint(), "strata_snapshot_received_total", `kind="full"`) +
		metric(t, m.Endpoint(), "strata_snapshot_received_total", `kind="incremental"`); got != 0 {
		t.Errorf("the new member received %v snapshots", got)
	}
	out := m.CurrentOutput()
	if !strings.Contains(out, "caught up from the logger") {
		t.Errorf("the new member did not log \"caught up from the logger\":\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "caught up from the logger") {
			t.Logf("new member: %s", line)
		}
	}
	sameReads(t, c.Members[l].Endpoint(), m.Endpoint())
	rev := leaderRev(t, c.Members[l].Endpoint())
	if want, got := hashKV(t, c.Members[l].Endpoint(), rev), hashKV(t, m.Endpoint(), rev); got != want {
		t.Errorf("HashKV at revision %d: leader %d, new member %d", rev, want, got)
	}

	// A member down while the leader's log moved past its last entry
	// copies what it missed from the logger when it restarts, and again
	// gets no snapshot (kill -9: its log and HardState as they were).
	mi := len(c.Members) - 1
	downAt := metric(t, m.Endpoint(), "strata_raftlog_last_index", "")
	m.Kill()
	live = live[:len(live)-1]
	writeRoundsUntil(t, cli, &round, 0, func() bool {
		return metric(t, c.Members[l].Endpoint(), "strata_raftlog_first_index", "") > downAt+1
	})
	lp.waitCommit(t, memberCommit(t, c), 30*time.Second)
	sentBefore = snapshotsSent()
	c.RestartMembers(mi)
	live = append(live, m)
	putKeys(t, cli, 0, 200, 100, round)
	round++
	waitCaughtUp(t, c, l, mi)
	if sent := snapshotsSent() - sentBefore; sent != 0 {
		t.Errorf("%v snapshots sent to a member restarted with --catch-up-logger after the leader's log passed its last index %v; leader output:\n%s",
			sent, downAt, c.Members[l].CurrentOutput())
	}
	if out := m.CurrentOutput(); !strings.Contains(out, "caught up from the logger") {
		t.Errorf("the restarted member did not log \"caught up from the logger\":\n%s", out)
	}
	sameReads(t, c.Members[l].Endpoint(), m.Endpoint())
	rev = leaderRev(t, c.Members[l].Endpoint())
	if want, got := hashKV(t, c.Members[l].Endpoint(), rev), hashKV(t, m.Endpoint(), rev); got != want {
		t.Errorf("HashKV at revision %d after the restart: leader %d, restarted member %d", rev, want, got)
	}

	// The control: an empty learner without the flag gets a snapshot.
	sentBefore = snapshotsSent()
	ln := c.AddMember(true)
	waitCaughtUp(t, c, l, len(c.Members)-1)
	if sent := snapshotsSent() - sentBefore; sent < 1 {
		t.Errorf("no snapshot sent to a learner added without --catch-up-logger (the leader's log starts at %v)", leaderFirst)
	}
	if strings.Contains(ln.CurrentOutput(), "caught up from the logger") {
		t.Error("a member without --catch-up-logger caught up from the logger")
	}
}

// memberAdd asks the cluster to add the prepared member m as a voter and
// returns its ID and the --initial-cluster it starts with.
func memberAdd(t *testing.T, c *testutil.Cluster, m *testutil.Member) (uint64, string) {
	t.Helper()
	cli := c.Client(t)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var resp *clientv3.MemberAddResponse
	var err error
	for {
		resp, err = cli.MemberAdd(ctx, []string{m.PeerURL()})
		if err == nil || !strings.Contains(err.Error(), "unhealthy cluster") || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("member add %s: %v", m.PeerURL(), err)
	}
	var initial []string
	for _, mm := range resp.Members {
		name := mm.Name
		if mm.ID == resp.Member.ID {
			name = m.Name()
		}
		for _, u := range mm.PeerURLs {
			initial = append(initial, name+"="+u)
		}
	}
	return resp.Member.ID, strings.Join(initial, ",")
}

// TestLoggerCatchUpRunning: a running member cut off from its peers (its
// peer URL blackholed) while the leader's log moves past its last entry,
// started with --catch-up-logger, takes the missing committed entries from
// the logger when the leader's snapshot arrives, and refuses the snapshot
// (docs/logger.md, "A running member behind"): it receives no snapshot,
// logs the catch-up, and then serves the leader's keys, revisions and
// HashKV.
func TestLoggerCatchUpRunning(t *testing.T) {
	lp := startLogger(t)
	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, strata), Size: 3,
		Flags: []string{"--snapshot-count=100", "--snapshot-catchup-entries=20", "--catch-up-logger=" + lp.clientURL}})
	addLoggerTo(t, c, lp)
	lp.Launch()
	lp.waitCommit(t, memberCommit(t, c), 30*time.Second)
	l := leaderIndex(t, c)
	cli := newClient(t, c.Members[l].Endpoint())
	round := 0
	putKeys(t, cli, 0, 200, 100, round)
	round++
	f := followers(c, l)[0]
	m := c.Members[f]
	received := func() float64 {
		return metric(t, m.Endpoint(), "strata_snapshot_received_total", `kind="full"`) +
			metric(t, m.Endpoint(), "strata_snapshot_received_total", `kind="incremental"`)
	}
	receivedBefore := received()
	downAt := metric(t, m.Endpoint(), "strata_raftlog_last_index", "")
	m.Proxy.Blackhole()
	writeRoundsUntil(t, cli, &round, 0, func() bool {
		return metric(t, c.Members[l].Endpoint(), "strata_raftlog_first_index", "") > downAt+1
	})
	leaderFirst := metric(t, c.Members[l].Endpoint(), "strata_raftlog_first_index", "")
	st := lp.waitCommit(t, uint64(metric(t, c.Members[l].Endpoint(), "strata_raftlog_last_index", "")), 30*time.Second)
	if float64(st.FirstIndex) > downAt+1 {
		t.Fatalf("the logger holds from %d; the member stopped at %v", st.FirstIndex, downAt)
	}
	t.Logf("member %s cut off at index %v; the leader's log now starts at %v; the logger holds %d-%d",
		m.Name(), downAt, leaderFirst, st.FirstIndex, st.CommitIndex)
	m.Proxy.Heal()
	putKeys(t, cli, 0, 200, 100, round)
	waitCaughtUp(t, c, l, f)
	if got := received() - receivedBefore; got != 0 {
		t.Errorf("the member received %v snapshots; its output:\n%s", got, m.CurrentOutput())
	}
	if out := m.CurrentOutput(); !strings.Contains(out, "caught up from the logger instead of the leader's snapshot") {
		t.Errorf("the member did not log its catch-up from the logger:\n%s", out)
	} else {
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "caught up from the logger instead") {
				t.Logf("member: %s", line)
			}
		}
	}
	sameReads(t, c.Members[l].Endpoint(), m.Endpoint())
	rev := leaderRev(t, c.Members[l].Endpoint())
	if want, got := hashKV(t, c.Members[l].Endpoint(), rev), hashKV(t, m.Endpoint(), rev); got != want {
		t.Errorf("HashKV at revision %d: leader %d, caught-up member %d", rev, want, got)
	}
}
