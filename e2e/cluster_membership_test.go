package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/strata-kv/strata/internal/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestClusterMembershipUnderLoad changes the membership four times while
// the workload runs: a learner is added and promoted once caught up, a
// follower is removed, a voter is added directly, and the leader is
// removed. The history is checked on the three members left.
func TestClusterMembershipUnderLoad(t *testing.T) {
	c := startTestCluster(t, 3)
	w := startWorkload(t, c)
	w.waitAcks(t, 20, faultTimeout)
	cli := c.Client(t)

	learner := c.AddMember(true)
	if got := memberState(t, cli, learner.ID); got != "learner" {
		t.Fatalf("added learner %s is %s in the member list", learner.Name(), got)
	}
	promoteWhenReady(t, cli, learner.ID)
	if got := memberState(t, cli, learner.ID); got != "voter" {
		t.Fatalf("promoted %s is %s in the member list", learner.Name(), got)
	}
	w.waitAcks(t, 20, faultTimeout)

	l := leaderIndex(t, c)
	f := followers(c, l)[0]
	t.Logf("removed follower %s exited by itself: %v", c.Members[f].Name(), c.RemoveMember(f))
	w.waitAcks(t, 20, faultTimeout)

	voter := c.AddMember(false)
	w.waitAcks(t, 20, faultTimeout)

	l = leaderIndex(t, c)
	t0 := time.Now()
	t.Logf("removed leader %s exited by itself: %v", c.Members[l].Name(), c.RemoveMember(l))
	recovery(t, c, w, "leader removal", t0, l, f)
	w.waitAcks(t, 20, faultTimeout)

	var left []*testutil.Member
	for i, m := range c.Members {
		if i != l && i != f {
			left = append(left, m)
		}
	}
	if n := len(memberList(t, cli).Members); n != 3 {
		t.Errorf("member list has %d members after two adds and two removes from three; want 3", n)
	}
	if !slices.Contains(left, voter) || !slices.Contains(left, learner) {
		t.Fatalf("internal: added members missing from %v", left)
	}
	w.stopAndCheck(t, left)
}

// memberList returns the cluster's members, bounded.
func memberList(t *testing.T, cli *clientv3.Client) *clientv3.MemberListResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatalf("member list: %v", err)
	}
	return resp
}

// memberState is "learner", "voter" or "absent" for id in the member list.
func memberState(t *testing.T, cli *clientv3.Client, id uint64) string {
	t.Helper()
	for _, m := range memberList(t, cli).Members {
		if m.ID == id {
			if m.IsLearner {
				return "learner"
			}
			return "voter"
		}
	}
	return "absent"
}

// promoteWhenReady retries MemberPromote (refused while the learner is
// behind, as etcd refuses it) until it succeeds or faultTimeout passes.
func promoteWhenReady(t *testing.T, cli *clientv3.Client, id uint64) {
	t.Helper()
	deadline := time.Now().Add(faultTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := cli.MemberPromote(ctx, id)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("promote %x: still refused after %v: %v", id, faultTimeout, err)
		}
		t.Logf("promote %x: %v (retrying)", id, err)
		time.Sleep(100 * time.Millisecond) // retry interval
	}
}

// TestClusterRemoveSelfAnswers asks a member to remove itself. The removal
// commits and the member stops, but the client must get the answer first:
// etcd delays a removed member's stop by a second for that. A client that
// sees an error for a change that happened retries it, and gets "member
// not found".
func TestClusterRemoveSelfAnswers(t *testing.T) {
	c := startTestCluster(t, 3)
	m := c.AddMember(false)
	cli := c.Client(t, m.Endpoint())
	// A linearizable read through the new member means it has applied
	// everything up to a recent commit, its own addition included.
	if err := m.WaitReady(faultTimeout); err != nil {
		t.Fatalf("added member %s: %v", m.Name(), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var err error
	for {
		_, err = cli.MemberRemove(ctx, m.ID)
		// etcd refuses changes until the new member has been connected for
		// 5 s; that refusal changed nothing, so retry it.
		if err == nil || !strings.Contains(err.Error(), "unhealthy cluster") || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // retry interval
	}
	if err != nil {
		t.Errorf("member remove of %s asked of itself: %v", m.Name(), err)
	}
	if got := memberState(t, c.Client(t, c.Endpoints()[:3]...), m.ID); got != "absent" {
		t.Errorf("after member remove, %s is %s in the member list", m.Name(), got)
	}
}
