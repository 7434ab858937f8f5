package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/strata-kv/strata/internal/testutil"
)

// TestLearnerStatus: a learner says so in its Status (etcdctl endpoint
// status's IS LEARNER) and fails /readyz's non_learner check, on strata as
// on etcd, so that load balancers keep clients off it. strata's Status
// always said false and its /readyz passed (found by review).
func TestLearnerStatus(t *testing.T) {
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, f), Size: 1, Flags: clusterFlags})
			learner := c.AddMember(true)
			cli := c.Client(t)
			for _, tc := range []struct {
				m       *testutil.Member
				learner bool
			}{{c.Members[0], false}, {learner, true}} {
				var isLearner bool
				deadline := time.Now().Add(faultTimeout)
				for {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					st, err := cli.Status(ctx, tc.m.Endpoint())
					cancel()
					if err == nil {
						isLearner = st.IsLearner
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("status of %s: %v", tc.m.Name(), err)
					}
					time.Sleep(100 * time.Millisecond)
				}
				if isLearner != tc.learner {
					t.Errorf("status of %s: IsLearner %v, want %v", tc.m.Name(), isLearner, tc.learner)
				}
				code, body := httpDo(t, http.MethodGet, tc.m.Endpoint()+"/readyz?verbose", "")
				if ready := code == http.StatusOK; ready == tc.learner {
					t.Errorf("/readyz of %s: %d %q; want ready %v", tc.m.Name(), code, body, !tc.learner)
				}
			}
		})
	}
}
