package e2e

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strata-kv/strata/internal/testutil"
)

// Lease tests wait for wall-clock time to pass where time is what they
// test (expiry, keepalive, remaining TTL); every other wait is a bounded
// poll.

// leaseKeys returns the sorted keys a TimeToLive reports.
func leaseKeys(resp *clientv3.LeaseTimeToLiveResponse) []string {
	var keys []string
	for _, k := range resp.Keys {
		keys = append(keys, string(k))
	}
	slices.Sort(keys)
	return keys
}

// waitCount polls until the keys under prefix number want, or fails the
// test after timeout.
func waitCount(t *testing.T, cli *clientv3.Client, prefix string, want int64, timeout time.Duration) *clientv3.GetResponse {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
		cancel()
		if err == nil && resp.Count == want {
			return resp
		}
		if time.Now().After(deadline) {
			t.Fatalf("keys under %q: want %d within %v; last answer %v, %v", prefix, want, timeout, resp, err)
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
}

// TestLeaseExpiry: expiry deletes every attached key in one revision, and
// TimeToLive, Leases and KeepAliveOnce answer as etcd's.
func TestLeaseExpiry(t *testing.T) {
	t.Parallel()
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			cli := start(t, f).Client(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// The test flags make etcd's minimum TTL 1 s: 0 is raised to it.
			if g, err := cli.Grant(ctx, 0); err != nil || g.TTL != 1 {
				t.Fatalf("grant TTL 0: %v, %v; want TTL 1", g, err)
			}
			g, err := cli.Grant(ctx, 3)
			if err != nil || g.TTL != 3 || g.ID == 0 {
				t.Fatalf("grant: %v, %v", g, err)
			}
			for _, k := range []string{"x/a", "x/b", "x/c"} {
				if _, err := cli.Put(ctx, k, "v", clientv3.WithLease(g.ID)); err != nil {
					t.Fatal(err)
				}
			}
			last, err := cli.Put(ctx, "x/d", "v")
			if err != nil {
				t.Fatal(err)
			}
			ttl, err := cli.TimeToLive(ctx, g.ID, clientv3.WithAttachedKeys())
			if err != nil {
				t.Fatal(err)
			}
			if ttl.GrantedTTL != 3 || ttl.TTL < 1 || ttl.TTL > 3 || !slices.Equal(leaseKeys(ttl), []string{"x/a", "x/b", "x/c"}) {
				t.Fatalf("TimeToLive = TTL %d granted %d keys %q", ttl.TTL, ttl.GrantedTTL, leaseKeys(ttl))
			}
			ls, err := cli.Leases(ctx)
			if err != nil || !slices.ContainsFunc(ls.Leases, func(s clientv3.LeaseStatus) bool { return s.ID == g.ID }) {
				t.Fatalf("Leases = %v, %v; want it to list %x", ls, err, g.ID)
			}

			got := waitCount(t, cli, "x/", 1, 15*time.Second)
			if string(got.Kvs[0].Key) != "x/d" {
				t.Fatalf("left after expiry: %q", got.Kvs[0].Key)
			}
			if got.Header.Revision != last.Header.Revision+1 {
				t.Fatalf("revision after expiry %d, want %d: three keys deleted in one revision", got.Header.Revision, last.Header.Revision+1)
			}
			ttl, err = cli.TimeToLive(ctx, g.ID)
			if err != nil || ttl.TTL != -1 {
				t.Fatalf("TimeToLive of an expired lease: %v, %v; want TTL -1", ttl, err)
			}
			if _, err := cli.KeepAliveOnce(ctx, g.ID); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
				t.Fatalf("KeepAliveOnce of an expired lease: %v", err)
			}
		})
	}
}

// TestLeaseKeepAliveAndRevoke: a kept-alive lease outlives its TTL; revoke
// deletes its keys in one revision and ends the keepalive.
func TestLeaseKeepAliveAndRevoke(t *testing.T) {
	t.Parallel()
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			cli := start(t, f).Client(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			g, err := cli.Grant(ctx, 2)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"k/1", "k/2"} {
				if _, err := cli.Put(ctx, k, "v", clientv3.WithLease(g.ID)); err != nil {
					t.Fatal(err)
				}
			}
			kctx, kcancel := context.WithCancel(ctx)
			defer kcancel()
			ch, err := cli.KeepAlive(kctx, g.ID)
			if err != nil {
				t.Fatal(err)
			}
			renewed := 0
			hold := time.After(5 * time.Second) // 2.5 TTLs
		holding:
			for {
				select {
				case r, ok := <-ch:
					if !ok {
						t.Fatal("keepalive channel closed while holding the lease")
					}
					if r.TTL != 2 {
						t.Fatalf("keepalive answered TTL %d, want 2", r.TTL)
					}
					renewed++
				case <-hold:
					break holding
				}
			}
			if renewed < 3 {
				t.Fatalf("%d keepalive answers in 5 s of a 2 s lease", renewed)
			}
			before := waitCount(t, cli, "k/", 2, 5*time.Second)

			rv, err := cli.Revoke(ctx, g.ID)
			if err != nil {
				t.Fatal(err)
			}
			if rv.Header.Revision != before.Header.Revision+1 {
				t.Fatalf("revoke at revision %d, want %d", rv.Header.Revision, before.Header.Revision+1)
			}
			waitCount(t, cli, "k/", 0, 5*time.Second)
			if _, err := cli.Revoke(ctx, g.ID); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
				t.Fatalf("second revoke: %v, want %v", err, rpctypes.ErrLeaseNotFound)
			}
			if _, err := cli.Grant(ctx, 9000000001); !errors.Is(err, rpctypes.ErrLeaseTTLTooLarge) {
				t.Fatalf("grant of a too large TTL: %v", err)
			}
			closed := time.After(10 * time.Second)
			for open := true; open; {
				select {
				case _, open = <-ch:
				case <-closed:
					t.Fatal("keepalive channel still open 10 s after revoke")
				}
			}
		})
	}
}

// TestLeaseRestartKeepsRemainingTTL: after a restart the lease counts down
// from the last checkpoint (plus an election timeout), not from its full
// TTL, and it still has its keys.
func TestLeaseRestartKeepsRemainingTTL(t *testing.T) {
	t.Parallel()
	p := start(t, strata)
	cli := p.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	g, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "r", "v", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	// A checkpoint every 5 s: one was taken at least 4 s after the grant,
	// so at most 56 s are recorded.
	time.Sleep(9 * time.Second)
	p.Kill()
	p.Restart()
	ttl, err := cli.TimeToLive(ctx, g.ID, clientv3.WithAttachedKeys())
	if err != nil {
		t.Fatal(err)
	}
	// At most 56 s checkpointed, plus 0.25 s of election timeout.
	if ttl.TTL < 40 || ttl.TTL > 56 || !slices.Equal(leaseKeys(ttl), []string{"r"}) {
		t.Fatalf("after restart: TTL %d keys %q; want 40..56 (not the full 60) and [r]", ttl.TTL, leaseKeys(ttl))
	}
}

// TestLeaseCluster: keepalive and TimeToLive through a follower reach the
// leader; the remaining TTL survives a leader change.
func TestLeaseCluster(t *testing.T) {
	t.Parallel()
	c := testutil.StartCluster(t, testutil.ClusterOptions{
		Binary: binary(t, strata),
		Size:   3,
		Flags:  []string{"--heartbeat-interval=25", "--election-timeout=250"},
	})
	leader, err := c.WaitLeader(20 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	follower := (leader + 1) % 3
	fcli := c.Client(t, c.Members[follower].Endpoint())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	g, err := fcli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fcli.Put(ctx, "c", "v", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	ka, err := fcli.KeepAliveOnce(ctx, g.ID)
	if err != nil || ka.TTL != 60 {
		t.Fatalf("keepalive through a follower: %v, %v", ka, err)
	}
	ttl, err := fcli.TimeToLive(ctx, g.ID, clientv3.WithAttachedKeys())
	if err != nil || ttl.TTL < 58 || !slices.Equal(leaseKeys(ttl), []string{"c"}) {
		t.Fatalf("TimeToLive through a follower: %v, %v", ttl, err)
	}

	// A checkpoint every 5 s: one was taken at least 4 s after the grant,
	// so at most 56 s are recorded.
	time.Sleep(9 * time.Second)
	c.Members[leader].Kill()
	if _, err := c.WaitLeader(20*time.Second, leader); err != nil {
		t.Fatal(err)
	}
	// Whichever survivor leads, the follower's client reaches it.
	ttl, err = fcli.TimeToLive(ctx, g.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ttl.TTL < 40 || ttl.TTL > 56 {
		t.Fatalf("after a leader change: TTL %d, want 40..56 (the checkpointed remaining, not the full 60)", ttl.TTL)
	}
}
