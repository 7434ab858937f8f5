package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/strata-kv/strata/internal/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// crashKeys is the key space the writers share: small, so that keys are
// overwritten often and "the latest acknowledged put wins" is exercised.
const crashKeys = 64

// crashFlags make the server snapshot (flush the engine and truncate the
// log) often, so crashes land around flushes too, not only around appends.
var crashFlags = []string{"--snapshot-count=100"}

// ack is one acknowledged put.
type ack struct {
	key, value string
	rev        int64 // the response header's revision
}

// history is everything acknowledged so far and the highest revision ever
// observed, across all incarnations of one server.
//
// Concurrency: record from any writer goroutine; the checks run while no
// writer is running.
type history struct {
	mu       sync.Mutex
	acks     []ack
	checked  int   // acks[:checked] were verified after an earlier restart
	observed int64 // highest revision seen in any response
}

func (h *history) record(a ack) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.acks = append(h.acks, a)
	h.observed = max(h.observed, a.rev)
}

// writeUntil runs writers goroutines that put unique values into the key
// space until stop is closed, and returns how many puts were acknowledged.
// Failed puts are expected (the server dies under them) and ignored: only
// acknowledged puts carry a promise.
func writeUntil(cli *clientv3.Client, h *history, writers int, tag string, stop <-chan struct{}) int {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		acked int
	)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(len(tag))))
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("crash/%03d", rng.IntN(crashKeys))
				value := fmt.Sprintf("%s-w%d-%d", tag, w, seq)
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				resp, err := cli.Put(ctx, key, value)
				cancel()
				if err != nil {
					// Throttle the retry loop while the server is down.
					select {
					case <-stop:
						return
					case <-time.After(10 * time.Millisecond):
					}
					continue
				}
				h.record(ack{key: key, value: value, rev: resp.Header.Revision})
				mu.Lock()
				acked++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return acked
}

// verify checks, on a server that has just restarted, that:
//  1. no two acknowledged puts share a revision;
//  2. the current revision is at least every revision observed before;
//  3. every acknowledged put not yet checked (and a sample of older ones;
//     all of them if rng is nil) reads back at its revision with its value
//     and mod_revision;
//  4. the latest state of each key is its latest acknowledged put, or a
//     later write (unacknowledged writes may have landed).
func verify(t *testing.T, cli *clientv3.Client, h *history, rng *rand.Rand) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h.mu.Lock()
	defer h.mu.Unlock()

	byRev := map[int64]ack{}
	latest := map[string]ack{}
	for _, a := range h.acks {
		if other, dup := byRev[a.rev]; dup {
			t.Errorf("revision %d acknowledged twice: %q=%q and %q=%q", a.rev, other.key, other.value, a.key, a.value)
		}
		byRev[a.rev] = a
		if a.rev > latest[a.key].rev {
			latest[a.key] = a
		}
	}

	cur, err := cli.Get(ctx, "\x00", clientv3.WithFromKey())
	if err != nil {
		t.Fatalf("range after restart: %v", err)
	}
	if cur.Header.Revision < h.observed {
		t.Errorf("revision went backwards: %d after restart, %d observed before", cur.Header.Revision, h.observed)
	}
	h.observed = max(h.observed, cur.Header.Revision)
	state := map[string]int64{}
	values := map[string]string{}
	for _, kv := range cur.Kvs {
		state[string(kv.Key)] = kv.ModRevision
		values[string(kv.Key)] = string(kv.Value)
	}
	for k, a := range latest {
		mod, ok := state[k]
		switch {
		case !ok:
			t.Errorf("key %q missing after restart; last acknowledged %q at revision %d", k, a.value, a.rev)
		case mod < a.rev:
			t.Errorf("key %q at mod revision %d after restart, older than its acknowledged put %q at %d", k, mod, a.value, a.rev)
		case mod == a.rev && values[k] != a.value:
			t.Errorf("key %q at revision %d holds %q, acknowledged %q", k, mod, values[k], a.value)
		}
	}

	todo := append([]ack(nil), h.acks[h.checked:]...)
	if rng == nil {
		todo = h.acks
	} else {
		for range min(200, h.checked) {
			todo = append(todo, h.acks[rng.IntN(h.checked)])
		}
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		errs   []string
		queue  = make(chan ack)
		nCheck = 4
	)
	for range nCheck {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for a := range queue {
				resp, err := cli.Get(ctx, a.key, clientv3.WithRev(a.rev))
				var msg string
				switch {
				case err != nil:
					msg = fmt.Sprintf("get %q at revision %d: %v", a.key, a.rev, err)
				case len(resp.Kvs) != 1:
					msg = fmt.Sprintf("get %q at revision %d: %d kvs, want the acknowledged %q", a.key, a.rev, len(resp.Kvs), a.value)
				case string(resp.Kvs[0].Value) != a.value || resp.Kvs[0].ModRevision != a.rev:
					msg = fmt.Sprintf("get %q at revision %d: %q with mod_revision %d, want %q with mod_revision %d",
						a.key, a.rev, resp.Kvs[0].Value, resp.Kvs[0].ModRevision, a.value, a.rev)
				}
				if msg != "" {
					mu.Lock()
					errs = append(errs, msg)
					mu.Unlock()
				}
			}
		}()
	}
	for _, a := range todo {
		queue <- a
	}
	close(queue)
	wg.Wait()
	sort.Strings(errs)
	for i, e := range errs {
		if i == 20 {
			t.Errorf("... and %d more lost or wrong acknowledged puts", len(errs)-20)
			break
		}
		t.Error(e)
	}
	h.checked = len(h.acks)
}

// ctxPut puts k=v, failing the test if it is not acknowledged, and records
// the acknowledgement in h.
func ctxPut(t *testing.T, cli *clientv3.Client, k, v string, h *history) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Put(ctx, k, v)
	if err != nil {
		t.Fatalf("put %s: %v", k, err)
	}
	h.record(ack{key: k, value: v, rev: resp.Header.Revision})
}

// TestCrashKill kill -9s the server at random moments under concurrent
// writers, restarts it on the same data dir, and checks after every restart
// that every acknowledged put is there with its revision.
func TestCrashKill(t *testing.T) {
	t.Parallel()
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(seed, 0))
			p := start(t, f, crashFlags...)
			cli := p.Client(t)
			h := &history{}
			const rounds = 10
			for round := range rounds {
				stop := make(chan struct{})
				done := make(chan int)
				go func() { done <- writeUntil(cli, h, 4, fmt.Sprintf("r%d", round), stop) }()
				// The kill lands at a random instant of the write stream;
				// the sleep chooses when, it synchronises nothing.
				time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
				p.Kill()
				close(stop)
				acked := <-done
				p.Restart()
				verify(t, cli, h, rng)
				t.Logf("round %d: %d puts acknowledged, %d in total, revision %d", round, acked, len(h.acks), h.observed)
				if t.Failed() {
					return
				}
			}
			if len(h.acks) == 0 {
				t.Fatal("no put was ever acknowledged")
			}
		})
	}
}

// failpoints are strata's crash points (package internal/failpoint) and
// the pass at which each kills the process: late enough that the server
// has started and taken writes, early enough to fire within seconds.
var failpoints = []struct {
	name string
	pass int
}{
	{"raftlog/before-sync", 200},
	{"raftlog/after-sync", 200},
	{"engine/before-flush", 2},
	{"engine/after-flush", 2},
	{"apply/after-commit", 200},
}

// TestCrashFailpoints lets strata kill itself at each failpoint under
// concurrent writers, restarts it without the failpoint, and checks every
// acknowledged put.
func TestCrashFailpoints(t *testing.T) {
	t.Parallel()
	for _, fp := range failpoints {
		t.Run(fp.name, func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			rng := rand.New(rand.NewPCG(seed, 1))
			spec := fmt.Sprintf("STRATA_FAILPOINTS=%s=%d", fp.name, fp.pass)
			p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, strata), Flags: crashFlags})
			cli := p.Client(t)
			h := &history{}
			for round := range 2 {
				p.SetEnv(spec)
				p.Launch()
				if err := p.WaitReady(30 * time.Second); err != nil {
					// Dying at the failpoint before serving is a legitimate
					// crash too; anything else is not.
					if _, exited := p.WaitExit(0); !exited {
						t.Fatalf("round %d: with %s: %v", round, spec, err)
					}
				}
				stop := make(chan struct{})
				done := make(chan int)
				go func() { done <- writeUntil(cli, h, 4, fmt.Sprintf("%s-r%d", fp.name, round), stop) }()
				// Generous: on a loaded machine the flush points need a few
				// thousand puts; normally each fires within seconds.
				exitErr, exited := p.WaitExit(45 * time.Second)
				close(stop)
				acked := <-done
				if !exited {
					p.Kill()
					t.Fatalf("round %d: %s never fired in 45 s (%d puts acknowledged)", round, spec, acked)
				}
				if !isKilled(exitErr) {
					t.Errorf("round %d: with %s the process exited with %v, want death by SIGKILL", round, spec, exitErr)
				}
				p.SetEnv()
				p.Restart()
				verify(t, cli, h, rng)
				t.Logf("round %d: %d puts acknowledged before %s fired; revision %d", round, acked, fp.name, h.observed)
				p.Kill()
				if t.Failed() {
					return
				}
			}
		})
	}
}

// isKilled reports whether a process's Wait error says SIGKILL ended it.
func isKilled(err error) bool {
	var exitErr interface{ ExitCode() int }
	if !errors.As(err, &exitErr) {
		return false
	}
	return exitErr.ExitCode() == -1 && err.Error() == "signal: killed"
}
