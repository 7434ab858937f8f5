package e2e

import (
	"context"
	"testing"
	"time"
)

// TestHarness checks the harness itself on both binaries: start, put,
// SIGKILL, restart on the same data dir, the put is still there, SIGTERM.
func TestHarness(t *testing.T) {
	t.Parallel()
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			p := start(t, f)
			cli := p.Client(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			put, err := cli.Put(ctx, "harness", "v1")
			if err != nil {
				t.Fatalf("put: %v", err)
			}
			p.Kill()
			p.Restart()
			got, err := cli.Get(ctx, "harness")
			if err != nil {
				t.Fatalf("get after restart: %v", err)
			}
			if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "v1" || got.Kvs[0].ModRevision != put.Header.Revision {
				t.Fatalf("after restart: got %v, want harness=v1 at mod revision %d", got.Kvs, put.Header.Revision)
			}
			p.Stop()
		})
	}
}
