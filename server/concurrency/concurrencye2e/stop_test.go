package concurrencye2e

import (
	"testing"
	"time"

	"github.com/strata-kv/strata/server/concurrency/v3electionpb"
	"github.com/strata-kv/strata/server/concurrency/v3lockpb"
)

// TestStopWithWaiters: a member stops promptly while a Lock waits and an
// Observe stream is open, and both callers get an error (the services'
// watches end with the watch hub, so the graceful stop need not wait for
// them).
func TestStopWithWaiters(t *testing.T) {
	p, cli := start(t, "strata")
	conn := dial(t, p)
	lc, ec := v3lockpb.NewLockClient(conn), v3electionpb.NewElectionClient(conn)
	ctx := ctxT(t, 60*time.Second)
	if _, err := lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("s"), Lease: grant(t, cli, 30)}); err != nil {
		t.Fatal(err)
	}
	waiter := async(func() (*v3lockpb.LockResponse, error) {
		return lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("s"), Lease: grant(t, cli, 30)})
	})
	eventually(t, "the waiter to queue", func() bool { return len(keysUnder(t, cli, "s/")) == 2 })
	obs, err := ec.Observe(ctx, &v3electionpb.LeaderRequest{Name: []byte("nobody")})
	if err != nil {
		t.Fatal(err)
	}
	observer := async(func() (*v3electionpb.LeaderResponse, error) { return obs.Recv() })

	began := time.Now()
	p.Stop() // fails the test if the member takes over 10 s
	t.Logf("stopped in %v", time.Since(began))
	for what, ch := range map[string]<-chan error{"lock": errOf(waiter), "observe": errOf(observer)} {
		select {
		case err := <-ch:
			if err == nil {
				t.Errorf("%s answered without error across the stop", what)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("%s still waiting 20 s after the member stopped", what)
		}
	}
}

// errOf forwards the error of an async call.
func errOf[T any](ch <-chan result[T]) <-chan error {
	out := make(chan error, 1)
	go func() { out <- (<-ch).err }()
	return out
}
