package concurrencye2e

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/strata-kv/strata/internal/testutil"
)

// contenders and rounds size the contention tests: every contender has its
// own client (its own connection and session) and takes the lock or the
// leadership rounds times.
const (
	contenders = 6
	rounds     = 5
)

// TestMutexContention: concurrency.Mutex from several clients at once.
// Mutual exclusion holds (a counter read and written back without a
// transaction inside the critical section loses no increment, and no two
// holders overlap), and every waiter eventually gets the lock.
func TestMutexContention(t *testing.T) {
	p, cli := start(t, "strata")
	if _, err := cli.Put(ctxT(t, 10*time.Second), "counter", "0"); err != nil {
		t.Fatal(err)
	}
	var holders atomic.Int32
	err := runContenders(t, p, func(ctx context.Context, c *clientv3.Client, s *concurrency.Session, id int) error {
		m := concurrency.NewMutex(s, "mutex")
		for range rounds {
			if err := m.Lock(ctx); err != nil {
				return fmt.Errorf("lock: %w", err)
			}
			if n := holders.Add(1); n != 1 {
				return fmt.Errorf("%d holders at once", n)
			}
			// A read-modify-write that only the lock makes safe.
			if err := increment(ctx, c, "counter"); err != nil {
				return err
			}
			holders.Add(-1)
			if err := m.Unlock(ctx); err != nil {
				return fmt.Errorf("unlock: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctxT(t, 10*time.Second), "counter")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(resp.Kvs[0].Value), fmt.Sprint(contenders*rounds); got != want {
		t.Errorf("counter = %s after %d locked increments, want %s", got, contenders*rounds, want)
	}
}

// TestElectionContention: concurrency.Election from several clients at
// once. One leader at a time, the leader the service reports is the one
// that won, every campaigner is elected every round, and an observer sees
// every leadership.
func TestElectionContention(t *testing.T) {
	p, cli := start(t, "strata")
	obsSession, err := concurrency.NewSession(cli)
	if err != nil {
		t.Fatal(err)
	}
	obsCtx, stopObserving := context.WithCancel(context.Background())
	defer stopObserving()
	observed := make(chan string, contenders*rounds*2)
	go func() {
		for resp := range concurrency.NewElection(obsSession, "leader").Observe(obsCtx) {
			observed <- string(resp.Kvs[0].Value)
		}
		close(observed)
	}()

	var leaders atomic.Int32
	err = runContenders(t, p, func(ctx context.Context, c *clientv3.Client, s *concurrency.Session, id int) error {
		e := concurrency.NewElection(s, "leader")
		for r := range rounds {
			val := fmt.Sprintf("c%d-r%d", id, r)
			if err := e.Campaign(ctx, val); err != nil {
				return fmt.Errorf("campaign: %w", err)
			}
			if n := leaders.Add(1); n != 1 {
				return fmt.Errorf("%d leaders at once", n)
			}
			resp, err := e.Leader(ctx)
			if err != nil {
				return fmt.Errorf("leader: %w", err)
			}
			if got := string(resp.Kvs[0].Value); got != val {
				return fmt.Errorf("leader is %q while %q leads", got, val)
			}
			leaders.Add(-1)
			if err := e.Resign(ctx); err != nil {
				return fmt.Errorf("resign: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A last campaign marks the end. The observer may miss a leader whose
	// whole term fell between two of its reads (etcd's Observe reports the
	// leaders it finds, not every one), but it must see the last, and
	// before it only proclaimed values, each contender's in round order.
	final := concurrency.NewElection(obsSession, "leader")
	if err := final.Campaign(ctxT(t, 10*time.Second), "final"); err != nil {
		t.Fatal(err)
	}
	lastRound := map[int]int{}
	timeout := time.After(20 * time.Second)
	for n := 0; ; n++ {
		var v string
		select {
		case v = <-observed:
		case <-timeout:
			t.Fatalf("observer did not see the final leader in 20 s (saw %d before)", n)
		}
		if v == "final" {
			if n == 0 {
				t.Errorf("observer saw no contender lead")
			}
			break
		}
		var c, r int
		if _, err := fmt.Sscanf(v, "c%d-r%d", &c, &r); err != nil || c >= contenders || r >= rounds {
			t.Fatalf("observer saw %q, which nobody proclaimed", v)
		}
		if prev, ok := lastRound[c]; ok && r <= prev {
			t.Errorf("observer saw contender %d's round %d after its round %d", c, r, prev)
		}
		lastRound[c] = r
	}
}

// runContenders runs fn on contenders goroutines, each with its own client
// and session, and returns the first error; every contender must finish
// within 60 s.
func runContenders(t *testing.T, p *testutil.Process, fn func(ctx context.Context, c *clientv3.Client, s *concurrency.Session, id int) error) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, contenders)
	for id := range contenders {
		c := p.Client(t)
		s, err := concurrency.NewSession(c, concurrency.WithTTL(10))
		if err != nil {
			t.Fatalf("session: %v", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer s.Close()
			if err := fn(ctx, c, s, id); err != nil {
				errs <- fmt.Errorf("contender %d: %w", id, err)
				cancel()
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}
