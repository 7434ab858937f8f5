package hybridlog

import (
	"fmt"
	"maps"
	"sync/atomic"
	"testing"
	"time"

	"github.com/strata-kv/strata/engine/appendlog"
)

// hangGuard turns a wait that never ends into a failure. It is not a
// latency bound: what TestCommitsDuringCompactAll asserts is that work
// completes while CompactAll is held, which it may be for ever.
const hangGuard = time.Minute

// TestCommitsDuringCompactAll holds CompactAll at each point of its work
// and, while it is held, commits as the applier does (a batch that reads a
// key of the stable region and one of memory, writes, deletes, commits),
// iterates on another goroutine and flushes; each must complete while
// CompactAll is still held, and the engine must then hold every write,
// also after a reopen. The points: its flush's region is in the stable
// region and not yet evicted; the stable region's merge has cut; the merge
// is pointing the key directory at its copies. Before the fix the batch's
// read waited at the first (a view took flushMu, which a flush holds while
// it writes its whole region: 1.34 s for a 60 MB region) and at the last
// (the merge held the stable region's mu for its whole swap).
func TestCommitsDuringCompactAll(t *testing.T) {
	for _, point := range []string{"flush-written", "merge-cut", "merge-swap"} {
		t.Run(point, func(t *testing.T) {
			var armed atomic.Bool
			reached, release := make(chan struct{}), make(chan struct{})
			hold := func(p string) {
				if p == point && armed.CompareAndSwap(true, false) {
					close(reached)
					<-release
				}
			}
			opts := Options{Stable: appendlog.Options{MergeMinBytes: -1, MergeHook: func(p appendlog.MergePoint) {
				switch p {
				case appendlog.MergeAfterCut:
					hold("merge-cut")
				case appendlog.MergeSwap:
					hold("merge-swap")
				}
			}}}
			opts.afterFlushWrite = func() { hold("flush-written") }
			dir := t.TempDir()
			e := open(t, dir, opts)
			want := map[string]string{}
			idx := uint64(0)
			commit := func(e *Engine, sets map[string]string, dels ...string) error {
				b := e.NewBatch()
				for k, v := range sets {
					_ = b.Set([]byte(k), []byte(v))
					want[k] = v
				}
				for _, k := range dels {
					_ = b.Delete([]byte(k))
					delete(want, k)
				}
				idx++
				return b.Commit(idx)
			}
			keys := func(from, to int, v string) map[string]string {
				m := map[string]string{}
				for i := from; i < to; i++ {
					m[fmt.Sprintf("k%02d", i)] = v
				}
				return m
			}
			// k00-k19 and then new values of k00-k09 in the stable region
			// (garbage for the merge), k10-k14 in memory.
			for _, m := range []map[string]string{keys(0, 20, "a"), keys(0, 10, "b")} {
				if err := commit(e, m); err != nil {
					t.Fatal(err)
				}
				if err := e.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			if err := commit(e, keys(10, 15, "c")); err != nil {
				t.Fatal(err)
			}

			armed.Store(true)
			compacted := make(chan error, 1)
			go func() { compacted <- e.CompactAll() }()
			<-reached
			// run runs fn on its own goroutine and waits for it while
			// CompactAll is held; a hang releases CompactAll and fails.
			run := func(what string, fn func() error) {
				t.Helper()
				done := make(chan error, 1)
				go func() { done <- fn() }()
				select {
				case err := <-done:
					if err != nil {
						t.Fatalf("%s while CompactAll is held at %s: %v", what, point, err)
					}
				case <-time.After(hangGuard):
					close(release)
					<-done
					<-compacted
					_ = e.Close()
					t.Fatalf("%s waited for CompactAll held at %s", what, point)
				}
			}
			run("the applier's batch", func() error {
				b := e.NewBatch()
				defer b.Close()
				for k, v := range map[string]string{"k15": "a", "k10": "c"} {
					if got, err := b.Get([]byte(k)); err != nil || string(got) != v {
						return fmt.Errorf("batch reads %s = %q, %v; want %q", k, got, err, v)
					}
				}
				_ = b.Set([]byte("k15"), []byte("d"))
				_ = b.Delete([]byte("k00"))
				want["k15"] = "d"
				delete(want, "k00")
				idx++
				return b.Commit(idx)
			})
			run("an iterator", func() error {
				if got := scan(t, e); !maps.Equal(got, want) {
					return fmt.Errorf("scan %v, want %v", got, want)
				}
				return nil
			})
			if point != "flush-written" { // Flush waits for the flush held
				run("Flush", e.Flush)
			}
			run("a commit", func() error { return commit(e, map[string]string{"k01": "e"}) })
			close(release)
			if err := <-compacted; err != nil {
				t.Fatalf("CompactAll: %v", err)
			}
			if got := scan(t, e); !maps.Equal(got, want) {
				t.Fatalf("after CompactAll: scan %v, want %v", got, want)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			e = open(t, dir, Options{})
			defer e.Close()
			if got := scan(t, e); !maps.Equal(got, want) || e.AppliedIndex() != idx {
				t.Fatalf("after a reopen: scan %v at %d, want %v at %d", got, e.AppliedIndex(), want, idx)
			}
		})
	}
}
