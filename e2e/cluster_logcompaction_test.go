package e2e

import (
	"testing"
	"time"
)

// TestClusterLogCompaction runs three members with log compaction on small
// segments (so batches are written while the workload runs), kills a
// follower and restarts it while the others write on, and kills and
// restarts the leader: every member must end at the same HashKV, and the
// workload's history must check out (stopAndCheck).
func TestClusterLogCompaction(t *testing.T) {
	c := startTestCluster(t, 3, "--log-compaction", "--log-segment-size=8192",
		"--snapshot-count=300", "--snapshot-catchup-entries=10")
	w := startWorkload(t, c)
	w.waitAcks(t, 100, faultTimeout)
	// The members compact their logs while the workload runs. Counted by
	// each member's strata_raftlog_compactions_total (batch files written
	// since start): the files themselves come and go (engine flushes let
	// the log drop the batches the engine holds), and a member whose
	// batch lived between two looks at its directory went unseen.
	compacted := map[string]bool{}
	deadline := time.Now().Add(faultTimeout)
	for len(compacted) < len(c.Members) && time.Now().Before(deadline) {
		for _, m := range c.Members {
			if metric(t, m.Endpoint(), "strata_raftlog_compactions_total", "") > 0 {
				compacted[m.Name()] = true
			}
		}
		w.waitAcks(t, 10, faultTimeout)
	}
	if len(compacted) < len(c.Members) {
		t.Errorf("only %v wrote compacted batch files", compacted)
	}
	l := leaderIndex(t, c)
	f := followers(c, l)[0]
	c.Members[f].Kill()
	w.waitAcks(t, 300, faultTimeout)
	c.RestartMembers(f)
	w.waitAcks(t, 100, faultTimeout)
	c.Members[l].Kill()
	w.waitAcks(t, 100, faultTimeout)
	c.RestartMembers(l)
	w.waitAcks(t, 100, faultTimeout)
	w.stopAndCheck(t, c.Members)

	rev := leaderRev(t, c.Members[leaderIndex(t, c)].Endpoint())
	want := hashKV(t, c.Members[0].Endpoint(), rev)
	for _, m := range c.Members[1:] {
		if got := hashKV(t, m.Endpoint(), rev); got != want {
			t.Errorf("HashKV at revision %d: %s %d, %s %d", rev, c.Members[0].Name(), want, m.Name(), got)
		}
	}
}
