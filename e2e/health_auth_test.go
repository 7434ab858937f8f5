package e2e

import (
	"strings"
	"testing"
	"time"

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
