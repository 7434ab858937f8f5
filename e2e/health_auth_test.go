package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/internal/testutil"
)

// TestEndpointHealthWithAuth runs `etcdctl endpoint health --cluster` on a
// cluster of three with auth on, on strata and on etcd (issue 14, item 7).
// As root, and as a user without permission on the health key, every
// member is healthy (strata said "Unable to fetch the alarm list" for the
// user: listing alarms is any user's in etcd, raising them root's). With
// no user, etcd refuses the member list itself ("user name is empty"), and
// so must strata (it answered it).
func TestEndpointHealthWithAuth(t *testing.T) {
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, f), Size: 3,
				Flags: append([]string{"--bcrypt-cost=4"}, clusterFlags...)})
			setupAuth(t, c.Client(t))
			for _, tc := range []struct {
				who        []string
				wantCode   int
				wantStderr string
			}{
				{who: []string{"--user", "root:rootpw"}},
				{who: []string{"--user", "alice:apw"}},
				{wantCode: 1, wantStderr: "failed to fetch endpoints from etcd cluster member list: etcdserver: user name is empty"},
			} {
				args := append([]string{"--endpoints=" + c.Endpoints()[0], "--command-timeout=5s"}, tc.who...)
				args = append(args, "endpoint", "health", "--cluster")
				res := testutil.RunToExit(t, 30*time.Second, "", nil, bins.Etcdctl, args...)
				healthy := strings.Count(res.Stdout+res.Stderr, "is healthy")
				wantHealthy := 3
				if tc.wantCode != 0 {
					wantHealthy = 0
				}
				if res.Code != tc.wantCode || healthy != wantHealthy || !strings.Contains(res.Stderr, tc.wantStderr) {
					t.Errorf("etcdctl %s: exit %d, %d healthy; want exit %d, %d healthy, stderr with %q\nstdout:\n%s\nstderr:\n%s",
						strings.Join(args, " "), res.Code, healthy, tc.wantCode, wantHealthy, tc.wantStderr, res.Stdout, res.Stderr)
				}
			}
		})
	}
}

// TestPromoteThroughFollowerWithAuth promotes a learner through a follower
// with auth on. Only the leader knows whether the learner has caught up, so
// the follower forwards the request, and the leader checks the caller
// again: the forward must carry the caller's token (it carried none, and
// the leader answered "user name is empty").
func TestPromoteThroughFollowerWithAuth(t *testing.T) {
	c := startTestCluster(t, 3, "--bcrypt-cost=4")
	learner := c.AddMember(true)
	follower := c.Members[followers(c, leaderIndex(t, c))[0]]
	setupAuth(t, c.Client(t))
	root, err := clientv3.New(clientv3.Config{Endpoints: []string{follower.Endpoint()}, Username: "root", Password: "rootpw",
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	deadline := time.Now().Add(faultTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := root.MemberPromote(ctx, learner.ID)
		cancel()
		if err == nil {
			break
		}
		// Refused while the learner catches up, as etcd refuses it.
		if !strings.Contains(err.Error(), "learner member which is in sync with leader") || time.Now().After(deadline) {
			t.Fatalf("promote %x as root through follower %s: %v", learner.ID, follower.Name(), err)
		}
		time.Sleep(100 * time.Millisecond) // retry interval
	}
}
