package concurrencye2e

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strata-kv/strata/internal/testutil"
	"github.com/strata-kv/strata/server/concurrency/v3lockpb"
)

// TestLockServiceCluster: on three members, a lock held through one
// follower's service and awaited through the other's is handed over after
// the leader is killed; then lockers on the two survivors contend and
// mutual exclusion holds.
func TestLockServiceCluster(t *testing.T) {
	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: bins.Strata, Size: 3})
	leader, err := c.WaitLeader(20 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var followers []*testutil.Member
	for i, m := range c.Members {
		if i != leader {
			followers = append(followers, m)
		}
	}
	ctx := ctxT(t, 60*time.Second)
	clients := [2]v3lockpb.LockClient{}
	for i, f := range followers {
		clients[i] = v3lockpb.NewLockClient(dial(t, f.Process))
	}
	cli := followers[0].Client(t)

	held, err := clients[0].Lock(ctx, &v3lockpb.LockRequest{Name: []byte("c"), Lease: grant(t, cli, 30)})
	if err != nil {
		t.Fatalf("lock through a follower: %v", err)
	}
	waiter := async(func() (*v3lockpb.LockResponse, error) {
		return clients[1].Lock(ctx, &v3lockpb.LockRequest{Name: []byte("c"), Lease: grant(t, cli, 30)})
	})
	eventually(t, "the waiter to queue", func() bool { return len(keysUnder(t, cli, "c/")) == 2 })
	c.Members[leader].Kill()
	if _, err := c.WaitLeader(20*time.Second, leader); err != nil {
		t.Fatal(err)
	}
	pending(t, "lock held across a leader change", waiter)
	if _, err := clients[0].Unlock(ctx, &v3lockpb.UnlockRequest{Key: held.Key}); err != nil {
		t.Fatalf("unlock after the leader change: %v", err)
	}
	got := await(t, "lock awaited across a leader change", waiter)
	if _, err := clients[1].Unlock(ctx, &v3lockpb.UnlockRequest{Key: got.Key}); err != nil {
		t.Fatal(err)
	}

	var holders atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		lc := clients[i%2]
		lease := grant(t, cli, 30)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 {
				resp, err := lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("c"), Lease: lease})
				if err != nil {
					errs <- fmt.Errorf("locker %d: lock: %w", i, err)
					return
				}
				if n := holders.Add(1); n != 1 {
					errs <- fmt.Errorf("locker %d: %d holders at once", i, n)
				}
				// A read-modify-write that only the lock makes safe.
				if err := increment(ctx, cli, "c-counter"); err != nil {
					errs <- fmt.Errorf("locker %d: %w", i, err)
				}
				holders.Add(-1)
				if _, err := lc.Unlock(context.WithoutCancel(ctx), &v3lockpb.UnlockRequest{Key: resp.Key}); err != nil {
					errs <- fmt.Errorf("locker %d: unlock: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	resp, err := cli.Get(ctx, "c-counter")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "12" {
		t.Errorf("counter after 12 locked increments: %v, %v; want 12", resp, err)
	}
}

// increment reads a decimal counter (absent: 0) and writes it back plus
// one, without a transaction.
func increment(ctx context.Context, cli *clientv3.Client, key string) error {
	resp, err := cli.Get(ctx, key)
	if err != nil {
		return err
	}
	n := 0
	if len(resp.Kvs) == 1 {
		if n, err = strconv.Atoi(string(resp.Kvs[0].Value)); err != nil {
			return fmt.Errorf("counter %q: %w", resp.Kvs[0].Value, err)
		}
	}
	_, err = cli.Put(ctx, key, strconv.Itoa(n+1))
	return err
}
