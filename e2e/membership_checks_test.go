package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/strata-kv/strata/internal/testutil"
)

// TestMembershipStrictReconfigLikeEtcd drives the strict reconfiguration
// check where strata used to differ from etcd (issue 14, item 7), on both
// servers: a cluster of one accepts a new voter (the way a cluster is
// restored from one member), and a member cut off from its peers refuses
// even a learner with "etcdserver: unhealthy cluster".
func TestMembershipStrictReconfigLikeEtcd(t *testing.T) {
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Run("add a voter to a cluster of one", func(t *testing.T) {
				c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, f), Size: 1, Flags: clusterFlags})
				cli := c.Client(t)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				resp, err := cli.MemberAdd(ctx, []string{"http://127.0.0.1:1"})
				if err != nil {
					t.Fatalf("member add to a cluster of one: %v", err)
				}
				if n := len(resp.Members); n != 2 {
					t.Errorf("member add answered %d members, want 2", n)
				}
			})
			t.Run("a member cut off refuses a learner", func(t *testing.T) {
				c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, f), Size: 3, Flags: clusterFlags})
				c.Isolate(2)
				cli := c.Client(t, c.Members[2].Endpoint())
				// Once it has no leader, the member has long seen its peer
				// connections cut (the proxies close them at once).
				deadline := time.Now().Add(faultTimeout)
				for {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					st, err := cli.Status(ctx, c.Members[2].Endpoint())
					cancel()
					if err == nil && st.Leader == 0 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("isolated member still reports a leader after %v (%v)", faultTimeout, err)
					}
					time.Sleep(50 * time.Millisecond) // poll interval
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_, err := cli.MemberAddAsLearner(ctx, []string{"http://127.0.0.1:1"})
				if err == nil || !strings.Contains(err.Error(), "etcdserver: unhealthy cluster") {
					t.Fatalf("learner added through a member cut off from its peers: %v, want etcdserver: unhealthy cluster", err)
				}
			})
		})
	}
}
