package e2e

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestRemovedMemberStaysStopped: a member the cluster removed stops, and
// started again on its data directory (a supervisor restarting it) it stops
// again at once with etcd's "permanently removed" error. strata's restarted
// member started, found itself absent from a member list it had never been
// seen in, and idled for good: no leader, holding its ports (found by
// review).
func TestRemovedMemberStaysStopped(t *testing.T) {
	c := startTestCluster(t, 3)
	victim := c.Members[2]
	cli := c.Client(t, c.Endpoints()[:2]...)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		_, err := cli.MemberRemove(ctx, victim.ID)
		if err == nil {
			break
		}
		// Refused until every member has been connected for 5 s, as etcd
		// refuses it; the refusal changed nothing.
		if !strings.Contains(err.Error(), "unhealthy cluster") || ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond) // retry interval
	}
	const removed = "permanently removed from the cluster"
	if _, exited := victim.WaitExit(faultTimeout); !exited {
		t.Fatal("the removed member still runs")
	}
	if !strings.Contains(victim.Output(), removed) {
		t.Fatalf("the removed member stopped without saying it was removed; output:\n%s", victim.Output())
	}
	victim.Launch()
	if _, exited := victim.WaitExit(faultTimeout); !exited {
		t.Fatal("the removed member, started again, still runs")
	}
	if out := victim.CurrentOutput(); !strings.Contains(out, removed) {
		t.Fatalf("the removed member, started again, stopped without saying it was removed; output:\n%s", out)
	}
}
