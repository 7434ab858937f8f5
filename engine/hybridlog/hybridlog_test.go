package hybridlog

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/engine/appendlog"
	"github.com/strata-kv/strata/engine/enginetest"
)

func open(t *testing.T, dir string, opts Options) *Engine {
	t.Helper()
	e, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return e
}

// optionSets are the configurations every behavioural test runs under: the
// default (memory holds everything until Flush), a tiny memory budget (every
// few commits seal, flush in the background and evict, and commits stall),
// tiny stable files (the stable region rotates and merges), and synced
// commits.
var optionSets = []struct {
	name string
	opts Options
}{
	{name: "default", opts: Options{}},
	{name: "tiny-memory", opts: Options{MemBytes: 512}},
	{name: "tiny-stable-files", opts: Options{MemBytes: 2 << 10, Stable: appendlog.Options{MaxFileBytes: 1 << 10, MergeMinBytes: 1}}},
	{name: "sync-commits", opts: Options{SyncCommits: true}},
}

func TestConformance(t *testing.T) {
	for _, tc := range optionSets {
		t.Run(tc.name, func(t *testing.T) {
			enginetest.Run(t, func(t *testing.T, dir string) engine.Engine {
				return open(t, dir, tc.opts)
			})
		})
	}
}

// scan returns every non-reserved key and value the reader holds.
func scan(t *testing.T, r engine.Reader) map[string]string {
	t.Helper()
	out := map[string]string{}
	it := r.NewIter([]byte("k"), []byte("l"))
	for ok, n := it.First(), 0; ok; ok, n = it.Next(), n+1 {
		if n > 1e6 {
			t.Fatal("scan does not end") // a broken iterator, not a hung test
		}
		out[string(it.Key())] = string(it.Value())
	}
	if err := it.Close(); err != nil {
		t.Fatalf("iterate: %v", err)
	}
	return out
}

// TestModel applies random batches (sets, deletes, range deletions) and
// checks every read path against a map after each: point reads, forward
// and backward scans with bounds, seeks and direction changes, through
// the engine, a batch and a snapshot taken earlier, while records are
// sealed, flushed and evicted, the stable region merges, and the engine is
// reopened.
func TestModel(t *testing.T) {
	for _, tc := range optionSets {
		for seed := uint64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprintf("%s/seed=%d", tc.name, seed), func(t *testing.T) {
				model(t, seed, tc.opts)
			})
		}
	}
}

func model(t *testing.T, seed uint64, opts Options) {
	rng := rand.New(rand.NewPCG(seed, 0))
	dir := t.TempDir()
	e := open(t, dir, opts)
	defer func() { _ = e.Close() }()
	// Enough keys that a scan crosses several of an iterator's refills.
	const nkeys = 200
	key := func() string { return fmt.Sprintf("k%03d", rng.IntN(nkeys)) }
	state := map[string]string{}
	var snap engine.Snapshot
	var snapState map[string]string
	for i := uint64(1); i <= 200; i++ {
		b := e.NewBatch()
		next := maps.Clone(state)
		for range 1 + rng.IntN(8) {
			switch k := key(); rng.IntN(6) {
			case 0:
				_ = b.Delete([]byte(k))
				delete(next, k)
			case 1:
				end := key()
				if end < k {
					k, end = end, k
				}
				if err := b.DeleteRange([]byte(k), []byte(end)); err != nil {
					t.Fatal(err)
				}
				for mk := range next {
					if mk >= k && mk < end {
						delete(next, mk)
					}
				}
			default:
				v := fmt.Sprintf("v%d", i)
				_ = b.Set([]byte(k), []byte(v))
				next[k] = v
			}
		}
		check(t, rng, fmt.Sprintf("batch %d before commit", i), b, next, nkeys)
		if err := b.Commit(i); err != nil {
			t.Fatal(err)
		}
		state = next
		check(t, rng, fmt.Sprintf("engine after batch %d", i), e, state, nkeys)
		if snap != nil {
			check(t, rng, "snapshot", snap, snapState, nkeys)
		}
		switch rng.IntN(20) {
		case 0:
			if err := e.Flush(); err != nil {
				t.Fatal(err)
			}
			if d := e.DurableIndex(); d != i {
				t.Fatalf("durable after Flush at %d = %d", i, d)
			}
		case 1:
			if snap != nil {
				_ = snap.Close()
			}
			snap, snapState = e.NewSnapshot(), maps.Clone(state)
		case 2:
			if err := e.CompactAll(); err != nil {
				t.Fatal(err)
			}
		case 3:
			if snap != nil {
				_ = snap.Close()
				snap = nil
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			e = open(t, dir, opts)
			if a := e.AppliedIndex(); a != i {
				t.Fatalf("reopened at %d, want %d", a, i)
			}
			check(t, rng, fmt.Sprintf("reopened after batch %d", i), e, state, nkeys)
		}
	}
	if snap != nil {
		_ = snap.Close()
	}
}

// check compares r with the model: every key's Get, a full scan both ways,
// and a bounded scan with a seek and direction changes.
func check(t *testing.T, rng *rand.Rand, what string, r engine.Reader, m map[string]string, nkeys int) {
	t.Helper()
	if got := scan(t, r); !maps.Equal(got, m) {
		t.Fatalf("%s: scan = %v, want %v", what, got, m)
	}
	for i := range nkeys {
		k := fmt.Sprintf("k%03d", i)
		v, err := r.Get([]byte(k))
		w, ok := m[k]
		if ok != (err == nil) || (ok && string(v) != w) || (!ok && !errors.Is(err, engine.ErrNotFound)) {
			t.Fatalf("%s: Get(%s) = %q, %v; want %q, %v", what, k, v, err, w, ok)
		}
	}
	keys := slices.Sorted(maps.Keys(m))
	lo, hi := fmt.Sprintf("k%03d", rng.IntN(nkeys)), fmt.Sprintf("k%03d", rng.IntN(nkeys+1))
	if rng.IntN(4) == 0 {
		lo = "k" // most of the keys: several refills
	}
	var want []string
	for _, k := range keys {
		if k >= lo && k < hi {
			want = append(want, k)
		}
	}
	it := r.NewIter([]byte(lo), []byte(hi))
	defer it.Close()
	var back []string
	for ok := it.Last(); ok; ok = it.Prev() {
		if back = append(back, string(it.Key())); len(back) > len(want) {
			t.Fatalf("%s: [%s, %s) backwards: %v, more than %v", what, lo, hi, back, want)
		}
		if got := string(it.Value()); got != m[string(it.Key())] {
			t.Fatalf("%s: backwards at %s: value %q, want %q", what, it.Key(), got, m[string(it.Key())])
		}
	}
	slices.Reverse(back)
	if !slices.Equal(back, want) {
		t.Fatalf("%s: [%s, %s) backwards = %v, want %v", what, lo, hi, back, want)
	}
	// A seek, then steps with changes of direction.
	at := fmt.Sprintf("k%03d", rng.IntN(nkeys))
	i, _ := slices.BinarySearch(want, at) // first >= at
	pos := i
	ok := it.SeekGE([]byte(at))
	for step := range 12 {
		if (pos < len(want)) != ok || (ok && string(it.Key()) != want[pos]) {
			t.Fatalf("%s: [%s, %s) SeekGE(%s) step %d at %q (valid %v), want index %d of %v", what, lo, hi, at, step, it.Key(), ok, pos, want)
		}
		if !ok {
			break
		}
		if step%4 == 3 {
			ok = it.Prev()
			pos--
			if pos < 0 {
				if ok {
					t.Fatalf("%s: Prev past the first key is valid", what)
				}
				break
			}
		} else {
			ok = it.Next()
			pos++
		}
	}
}

// TestPowerCut checks durability rules 2-4 on this engine: after a power
// cut, no batch at or below the durable index reported before the cut is
// lost, and the engine holds exactly the state after the batch whose
// applied index it reads back (a prefix point).
//
// Memory holds nothing a restart keeps; the cut is the stable region's
// (appendlog.CrashCopy with flushMu held, so no flush is in flight): each
// of its files up to the length known to be synced, then nothing, a torn
// prefix, garbage, zeros or a damaged byte of the rest (appendlog.Tear).
func TestPowerCut(t *testing.T) {
	tests := []struct {
		name       string
		opts       Options
		flushEvery int // explicit Flush on average every flushEvery batches; 0: never
		compact    bool
	}{
		{name: "explicit-flushes", opts: Options{}, flushEvery: 15},
		{name: "background-flushes", opts: Options{MemBytes: 4 << 10, Stable: appendlog.Options{MaxFileBytes: 8 << 10, MergeMinBytes: -1}}},
		{name: "both", opts: Options{MemBytes: 8 << 10, Stable: appendlog.Options{MaxFileBytes: 8 << 10, MergeMinBytes: -1}}, flushEvery: 30},
		{name: "merges", opts: Options{MemBytes: 4 << 10, Stable: appendlog.Options{MaxFileBytes: 4 << 10, MergeMinBytes: 1}}, flushEvery: 30, compact: true},
		{name: "sync-commits", opts: Options{SyncCommits: true}},
	}
	for _, tc := range tests {
		for seed := uint64(1); seed <= 2; seed++ {
			t.Run(fmt.Sprintf("%s/seed=%d", tc.name, seed), func(t *testing.T) {
				powerCut(t, seed, tc.opts, tc.flushEvery, tc.compact)
			})
		}
	}
}

func powerCut(t *testing.T, seed uint64, opts Options, flushEvery int, compact bool) {
	rng := rand.New(rand.NewPCG(seed, 7))
	e := open(t, filepath.Join(t.TempDir(), "db"), opts)
	defer e.Close()
	states := []map[string]string{{}} // states[i]: data after batch i
	value := strings.Repeat("x", 300)
	var held engine.Snapshot // keeps merged files around for a while
	cuts, lostSome := 0, 0
	for i := uint64(1); i <= 400; i++ {
		st := maps.Clone(states[i-1])
		b := e.NewBatch()
		for range 1 + rng.IntN(6) {
			k := fmt.Sprintf("k%03d", rng.IntN(150))
			if rng.IntN(5) == 0 {
				_ = b.Delete([]byte(k))
				delete(st, k)
				continue
			}
			v := fmt.Sprintf("%d:%s", i, value[:rng.IntN(len(value))])
			_ = b.Set([]byte(k), []byte(v))
			st[k] = v
		}
		if err := b.Commit(i); err != nil {
			t.Fatal(err)
		}
		states = append(states, st)
		if flushEvery > 0 && rng.IntN(flushEvery) == 0 {
			if err := e.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		if compact && rng.IntN(40) == 0 {
			if held != nil {
				_ = held.Close()
			}
			held = e.NewSnapshot()
			if err := e.CompactAll(); err != nil {
				t.Fatal(err)
			}
		}
		if rng.IntN(20) != 0 {
			continue
		}
		cuts++
		mode := rng.IntN(appendlog.TearModes)
		dir, d := cut(t, e, rng, mode)
		if opts.SyncCommits && d != i {
			t.Fatalf("with synced commits, durable at batch %d = %d", i, d)
		}
		a := reopen(t, dir, i, states)
		if a < d || a > i {
			t.Fatalf("after a cut (mode %d) at batch %d: applied %d, want in [durable %d, %d]", mode, i, a, d, i)
		}
		if a < i {
			lostSome++
		}
	}
	if held != nil {
		_ = held.Close()
	}
	if cuts == 0 || e.DurableIndex() == 0 {
		t.Fatalf("%d cuts, durable %d: the test cut nothing or never synced", cuts, e.DurableIndex())
	}
	if !opts.SyncCommits && flushEvery == 0 && lostSome == 0 {
		t.Fatalf("no cut of %d lost an unsynced batch: the test does not tear", cuts)
	}
	t.Logf("%d cuts, %d lost unsynced batches, final durable %d", cuts, lostSome, e.DurableIndex())
}

// cut copies the engine's directory as a power cut now could leave it and
// returns the copy's directory and the durable index reported before it.
func cut(t *testing.T, e *Engine, rng *rand.Rand, mode int) (string, uint64) {
	t.Helper()
	e.flushMu.Lock()
	defer e.flushMu.Unlock()
	dst := t.TempDir()
	if err := os.Mkdir(filepath.Join(dst, StableDir), 0o700); err != nil {
		t.Fatal(err)
	}
	d, err := e.stable.CrashCopy(filepath.Join(dst, StableDir), appendlog.Tear(rng, mode))
	if err != nil {
		t.Fatal(err)
	}
	return dst, d
}

// reopen opens the copy in dir, checks that its data is the state after
// the batch of its applied index (at most last), and returns that index.
func reopen(t *testing.T, dir string, last uint64, states []map[string]string) uint64 {
	t.Helper()
	r := open(t, dir, Options{Stable: appendlog.Options{MergeMinBytes: -1}})
	defer r.Close()
	a := r.AppliedIndex()
	if a > last {
		t.Fatalf("reopened at %d, above the last batch %d", a, last)
	}
	if d := r.DurableIndex(); d != a {
		t.Fatalf("reopened with durable %d != applied %d", d, a)
	}
	if got := scan(t, r); !maps.Equal(got, states[a]) {
		t.Fatalf("reopened at %d: data is not the state after batch %d", a, a)
	}
	return a
}

// TestInstallSnapshot exports one engine, stages it through a
// SnapshotWriter and installs it into another that holds unsynced and
// synced state of its own: afterwards it holds exactly the export, also
// after a reopen, a snapshot taken before still reads the old state, and
// a corrupt staged file is refused with the engine left as it was.
func TestInstallSnapshot(t *testing.T) {
	src := open(t, t.TempDir(), Options{})
	defer src.Close()
	want := map[string]string{}
	b := src.NewBatch()
	for i := range 3000 {
		k, v := fmt.Sprintf("k%05d", i), fmt.Sprintf("value-%d-%s", i, strings.Repeat("s", i%400))
		_ = b.Set([]byte(k), []byte(v))
		want[k] = v
	}
	if err := b.Commit(77); err != nil {
		t.Fatal(err)
	}
	dstDir := t.TempDir()
	dst := open(t, dstDir, Options{MemBytes: 1 << 10, Stable: appendlog.Options{MaxFileBytes: 1 << 10}})
	defer func() { _ = dst.Close() }()
	for i := uint64(1); i <= 20; i++ {
		b := dst.NewBatch()
		_ = b.Set([]byte(fmt.Sprintf("kold%d", i)), []byte("old"))
		if err := b.Commit(i); err != nil {
			t.Fatal(err)
		}
	}
	old := dst.NewSnapshot()
	defer old.Close()
	oldState := scan(t, old)

	stage := func(corrupt bool) string {
		x, err := src.NewExportView()
		if err != nil {
			t.Fatal(err)
		}
		defer x.Close()
		path := filepath.Join(t.TempDir(), "staged")
		w, err := dst.NewSnapshotWriter(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := x.ForEach(w.Add); err != nil {
			t.Fatal(err)
		}
		if err := w.Finish(); err != nil {
			t.Fatal(err)
		}
		if corrupt {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt([]byte("!"), 5000); err != nil {
				t.Fatal(err)
			}
			_ = f.Close()
		}
		return path
	}
	if _, err := dst.InstallSnapshot(stage(true)); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("corrupt staged file: err = %v, want corruption", err)
	}
	if got := scan(t, dst); !maps.Equal(got, oldState) || dst.AppliedIndex() != 20 {
		t.Fatalf("after a refused install the engine changed (applied %d)", dst.AppliedIndex())
	}
	a, err := dst.InstallSnapshot(stage(false))
	if err != nil {
		t.Fatal(err)
	}
	if a != 77 || dst.AppliedIndex() != 77 || dst.DurableIndex() != 77 {
		t.Fatalf("install returned %d, applied %d, durable %d; want 77", a, dst.AppliedIndex(), dst.DurableIndex())
	}
	if got := scan(t, dst); !maps.Equal(got, want) {
		t.Fatalf("after install: %d keys, want %d", len(got), len(want))
	}
	if got := scan(t, old); !maps.Equal(got, oldState) {
		t.Fatal("a snapshot taken before the install changed")
	}
	b = dst.NewBatch()
	_ = b.Set([]byte("k-after"), []byte("1"))
	want["k-after"] = "1"
	if err := b.Commit(78); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	dst = open(t, dstDir, Options{})
	if got := scan(t, dst); !maps.Equal(got, want) || dst.AppliedIndex() != 78 {
		t.Fatalf("after reopen: %d keys (want %d), applied %d", len(got), len(want), dst.AppliedIndex())
	}
}

// TestConcurrentReadersSeeWholeBatches: readers on other goroutines
// (Get, iterators, snapshots) never see part of a batch while the applier
// commits, seals, flushes, evicts and merges, and Flush runs on another
// goroutine. Every batch writes the same value under every key.
func TestConcurrentReadersSeeWholeBatches(t *testing.T) {
	e := open(t, t.TempDir(), Options{MemBytes: 2 << 10, Stable: appendlog.Options{MaxFileBytes: 2 << 10, MergeMinBytes: 1}})
	defer e.Close()
	const nkeys = 20
	stop := make(chan struct{})
	errs := make(chan error, 5)
	var wg sync.WaitGroup
	for r := range 3 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				var rd engine.Reader = e
				var snap engine.Snapshot
				if r == 1 {
					snap = e.NewSnapshot()
					rd = snap
				}
				seen := map[string]bool{}
				it := rd.NewIter([]byte("k"), []byte("l"))
				for ok := it.First(); ok; ok = it.Next() {
					seen[string(it.Value())] = true
				}
				err := it.Close()
				if snap != nil {
					_ = snap.Close()
				}
				if err == nil && len(seen) > 1 {
					err = fmt.Errorf("an iterator saw values %v of different batches", slices.Sorted(maps.Keys(seen)))
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// A flusher on its own goroutine: the durable index never falls and
	// never passes the applied index.
	wg.Go(func() {
		var last uint64
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := e.Flush(); err != nil {
				errs <- err
				return
			}
			d := e.DurableIndex()
			if a := e.AppliedIndex(); d < last || d > a {
				errs <- fmt.Errorf("durable index %d after %d, applied %d", d, last, a)
				return
			}
			last = d
		}
	})
	for i := uint64(1); i <= 300; i++ {
		b := e.NewBatch()
		for k := range nkeys {
			_ = b.Set([]byte(fmt.Sprintf("k%02d", k)), []byte(fmt.Sprint(i)))
		}
		if err := b.Commit(i); err != nil {
			t.Fatal(err)
		}
		if i%100 == 0 {
			if err := e.CompactAll(); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
}

// TestReadAfterClose: reads after Close fail instead of touching closed
// files, and views taken before Close stay readable until closed.
func TestReadAfterClose(t *testing.T) {
	e := open(t, t.TempDir(), Options{})
	b := e.NewBatch()
	_ = b.Set([]byte("k1"), []byte("v"))
	if err := b.Commit(1); err != nil {
		t.Fatal(err)
	}
	snap := e.NewSnapshot()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Get([]byte("k1")); err == nil {
		t.Fatal("Get after Close succeeded")
	}
	if it := e.NewIter(nil, nil); it.First() || it.Close() == nil {
		t.Fatal("iterator after Close works")
	}
	if v, err := snap.Get([]byte("k1")); err != nil || string(v) != "v" {
		t.Fatalf("snapshot taken before Close: %q, %v", v, err)
	}
	_ = snap.Close()
	if err := e.Flush(); err == nil {
		t.Fatal("Flush after Close succeeded")
	}
}

// TestInPlaceUpdates: writes to a key whose record is in the mutable
// region update it in place (no new record); a view seals the region, so
// the next write appends and the view keeps the old value; a flush evicts
// the records and reads then come from the stable region.
func TestInPlaceUpdates(t *testing.T) {
	e := open(t, t.TempDir(), Options{})
	defer e.Close()
	put := func(i uint64, v string) {
		t.Helper()
		b := e.NewBatch()
		_ = b.Set([]byte("k1"), []byte(v))
		if err := b.Commit(i); err != nil {
			t.Fatal(err)
		}
	}
	records := func() uint64 {
		e.mu.RLock()
		defer e.mu.RUnlock()
		return e.mu.tail
	}
	put(1, "a")
	n := records() // k1 and the applied index key
	for i := uint64(2); i <= 50; i++ {
		put(i, fmt.Sprint("v", i))
	}
	if got := records(); got != n {
		t.Fatalf("%d records after 49 updates in the mutable region, want %d (in place)", got, n)
	}
	snap := e.NewSnapshot()
	defer snap.Close()
	put(51, "after-seal")
	if got := records(); got != n+2 {
		t.Fatalf("%d records after a write past the seal, want %d (a new record each for k1 and the applied index)", got, n+2)
	}
	if v, _ := snap.Get([]byte("k1")); string(v) != "v50" {
		t.Fatalf("snapshot reads %q, want v50", v)
	}
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	e.mu.RLock()
	inMem := len(e.mu.index)
	e.mu.RUnlock()
	if inMem != 0 {
		t.Fatalf("%d keys in memory after Flush, want 0 (evicted)", inMem)
	}
	if v, err := e.Get([]byte("k1")); err != nil || string(v) != "after-seal" {
		t.Fatalf("Get after eviction = %q, %v", v, err)
	}
	if v, _ := snap.Get([]byte("k1")); string(v) != "v50" {
		t.Fatalf("snapshot after the flush reads %q, want v50", v)
	}
}
