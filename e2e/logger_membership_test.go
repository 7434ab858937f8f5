package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/strata-kv/strata/internal/testutil"
)

// TestLoggerMembership: a logger joined to a cluster of three publishes its
// name and marked client URL through raft, so that `etcdctl member list`
// shows it as a learner with its name, and `etcdctl member promote` of it
// is refused (FailedPrecondition) on the leader and on a follower alike.
func TestLoggerMembership(t *testing.T) {
	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, strata), Size: 3})
	lp := startLogger(t)
	addLoggerTo(t, c, lp)
	lp.Launch()
	st := lp.waitCommit(t, memberCommit(t, c), 30*time.Second)
	id := fmt.Sprintf("%x", st.MemberID)

	ctl := func(endpoint string, args ...string) testutil.Result {
		t.Helper()
		full := append([]string{"--endpoints=" + endpoint, "--command-timeout=5s"}, args...)
		return testutil.RunToExit(t, 20*time.Second, "", nil, bins.Etcdctl, full...)
	}
	// The attributes arrive through raft: wait for them, bounded.
	marked := lp.clientURL + "/strata-logger"
	deadline := time.Now().Add(20 * time.Second)
	var line string
	for {
		res := ctl(c.Endpoints()[0], "member", "list")
		if res.Code != 0 {
			t.Fatalf("etcdctl member list: %d %s", res.Code, res.Stderr)
		}
		line = ""
		for _, l := range strings.Split(res.Stdout, "\n") {
			if strings.HasPrefix(l, id+",") {
				line = l
			}
		}
		if strings.Contains(line, "L1") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("member list never showed the logger %s with its name: %q\n%s", id, line, res.Stdout)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// etcdctl's simple format: ID, status, name, peer URLs, client URLs, is learner.
	if want := id + ", started, L1, " + lp.peerURL + ", " + marked + ", true"; line != want {
		t.Fatalf("member list line %q, want %q", line, want)
	}
	// The marked client URL still reaches the logger API.
	if out, err := runStrata(t, "logger", "status", "--endpoint="+marked); err != nil || !strings.Contains(out, fmt.Sprintf("%x", st.ClusterID)) {
		t.Fatalf("strata logger status --endpoint %s: %v\n%s", marked, err, out)
	}
	for _, ep := range c.Endpoints() {
		res := ctl(ep, "member", "promote", id)
		if res.Code == 0 || !strings.Contains(res.Stderr, "FailedPrecondition") ||
			!strings.Contains(res.Stderr, "can not promote a strata logger member") {
			t.Fatalf("member promote of the logger at %s: exit %d, %q; want FailedPrecondition naming the logger", ep, res.Code, res.Stderr)
		}
	}
	res := ctl(c.Endpoints()[0], "member", "list")
	if !strings.Contains(res.Stdout, id+", started, L1, "+lp.peerURL+", "+marked+", true") {
		t.Fatalf("after the refused promotions the logger is no longer a learner:\n%s", res.Stdout)
	}
}
