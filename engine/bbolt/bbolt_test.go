package bbolt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/engine/enginetest"
)

// testMmap keeps the tests' mappings small (many engines run at once).
const testMmap = 64 << 20

func open(t *testing.T, dir string, opts Options) *Engine {
	t.Helper()
	if opts.InitialMmapSize == 0 {
		opts.InitialMmapSize = testMmap
	}
	e, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return e
}

// optionSets are the configurations every behavioural test runs under: the
// default (flushes only when asked), a one-byte overlay (every commit is
// frozen and flushed in the background, so reads cross frozen overlays
// and the file), and synced commits.
var optionSets = []struct {
	name string
	opts Options
}{
	{name: "default", opts: Options{}},
	{name: "tiny-overlay", opts: Options{MemBytes: 1}},
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
// the engine, a batch and a snapshot taken earlier, while overlays are
// frozen and flushed underneath.
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
	opts.MemBytes = max(opts.MemBytes, int64(rng.IntN(4096)))
	e := open(t, t.TempDir(), opts)
	defer e.Close()
	key := func() string { return fmt.Sprintf("k%02d", rng.IntN(60)) }
	state := map[string]string{}
	var snap engine.Snapshot
	var snapState map[string]string
	for i := uint64(1); i <= 150; i++ {
		b := e.NewBatch()
		next := maps.Clone(state)
		for range 1 + rng.IntN(6) {
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
		check(t, rng, fmt.Sprintf("batch %d before commit", i), b, next)
		if err := b.Commit(i); err != nil {
			t.Fatal(err)
		}
		state = next
		check(t, rng, fmt.Sprintf("engine after batch %d", i), e, state)
		if snap != nil {
			check(t, rng, "snapshot", snap, snapState)
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
		}
	}
	if snap != nil {
		_ = snap.Close()
	}
}

// check compares r with the model: every key's Get, a full scan both ways,
// and a few bounded scans with seeks and direction changes.
func check(t *testing.T, rng *rand.Rand, what string, r engine.Reader, m map[string]string) {
	t.Helper()
	if got := scan(t, r); !maps.Equal(got, m) {
		t.Fatalf("%s: scan = %v, want %v", what, got, m)
	}
	for i := range 60 {
		k := fmt.Sprintf("k%02d", i)
		v, err := r.Get([]byte(k))
		w, ok := m[k]
		if ok != (err == nil) || (ok && string(v) != w) || (!ok && !errors.Is(err, engine.ErrNotFound)) {
			t.Fatalf("%s: Get(%s) = %q, %v; want %q, %v", what, k, v, err, w, ok)
		}
	}
	keys := slices.Sorted(maps.Keys(m))
	lo, hi := fmt.Sprintf("k%02d", rng.IntN(60)), fmt.Sprintf("k%02d", rng.IntN(61))
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
	}
	slices.Reverse(back)
	if !slices.Equal(back, want) {
		t.Fatalf("%s: [%s, %s) backwards = %v, want %v", what, lo, hi, back, want)
	}
	// A seek, then steps with a change of direction.
	at := fmt.Sprintf("k%02d", rng.IntN(60))
	i, _ := slices.BinarySearch(want, at) // first >= at
	pos := i
	ok := it.SeekGE([]byte(at))
	for step := range 6 {
		if (pos < len(want)) != ok || (ok && string(it.Key()) != want[pos]) {
			t.Fatalf("%s: [%s, %s) SeekGE(%s) step %d at %q (valid %v), want index %d of %v", what, lo, hi, at, step, it.Key(), ok, pos, want)
		}
		if !ok {
			break
		}
		if step%3 == 2 {
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
// applied index it reads back.
//
// A power cut cannot be simulated in-process by a crashable file system,
// since bbolt writes through the operating system's files. It does not
// need one: the engine writes its file only in bbolt transactions under
// flushMu, each committed with bbolt's fsyncs, so with flushMu held the
// file holds only synced state, and a copy of it is what a power cut at
// that instant leaves. A cut during a flush's commit, after its pages were
// written but before its meta page reached the disk, is simulated on such
// a copy by invalidating the newest meta page: bbolt then opens at the
// previous commit, whose pages the unfinished one never overwrites.
func TestPowerCut(t *testing.T) {
	tests := []struct {
		name       string
		opts       Options
		flushEvery int // explicit Flush on average every flushEvery batches; 0: never
		tornMeta   bool
		compact    bool // CompactAll now and then: the file is replaced
	}{
		{name: "explicit-flushes", opts: Options{}, flushEvery: 15},
		{name: "background-flushes", opts: Options{MemBytes: 8 << 10}},
		{name: "both", opts: Options{MemBytes: 16 << 10}, flushEvery: 30},
		{name: "torn-last-commit", opts: Options{MemBytes: 8 << 10}, flushEvery: 20, tornMeta: true},
		{name: "sync-commits", opts: Options{SyncCommits: true}},
		{name: "compactions", opts: Options{MemBytes: 8 << 10}, flushEvery: 30, compact: true},
	}
	for _, tc := range tests {
		for seed := uint64(1); seed <= 2; seed++ {
			t.Run(fmt.Sprintf("%s/seed=%d", tc.name, seed), func(t *testing.T) {
				powerCut(t, seed, tc.opts, tc.flushEvery, tc.tornMeta, tc.compact)
			})
		}
	}
}

func powerCut(t *testing.T, seed uint64, opts Options, flushEvery int, tornMeta, compact bool) {
	rng := rand.New(rand.NewPCG(seed, 7))
	e := open(t, filepath.Join(t.TempDir(), "db"), opts)
	defer e.Close()
	states := []map[string]string{{}} // states[i]: data after batch i
	value := make([]byte, 300)
	cuts, fellBack := 0, 0
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
			if err := e.CompactAll(); err != nil {
				t.Fatal(err)
			}
		}
		if rng.IntN(25) != 0 {
			continue
		}
		cuts++
		dir, d := cut(t, e)
		if opts.SyncCommits && d != i {
			t.Fatalf("with synced commits, durable at batch %d = %d", i, d)
		}
		var torn string
		if tornMeta {
			// Torn on a second copy, before anything opens the first
			// (an open may commit a transaction of its own).
			torn = t.TempDir()
			copyFile(t, filepath.Join(dir, FileName), filepath.Join(torn, FileName))
			tearNewestMeta(t, filepath.Join(torn, FileName))
		}
		a := reopen(t, dir, i, states)
		if a < d || a > i {
			t.Fatalf("after a cut at batch %d: applied %d, want in [durable %d, %d]", i, a, d, i)
		}
		if tornMeta {
			a2 := reopen(t, torn, i, states)
			if a2 > a {
				t.Fatalf("with the newest commit torn, applied %d above the whole file's %d", a2, a)
			}
			if a2 < a {
				fellBack++
			}
		}
	}
	if cuts == 0 || e.DurableIndex() == 0 {
		t.Fatalf("%d cuts, durable %d: the test cut nothing or never flushed", cuts, e.DurableIndex())
	}
	if tornMeta && fellBack == 0 {
		t.Fatalf("no torn commit fell back to an older one in %d cuts", cuts)
	}
	t.Logf("%d cuts, %d fell back to the previous commit, final durable %d", cuts, fellBack, e.DurableIndex())
}

// cut copies the engine's file as a power cut now would leave it, and
// returns the copy's directory and the durable index reported before it.
func cut(t *testing.T, e *Engine) (string, uint64) {
	t.Helper()
	e.flushMu.Lock()
	defer e.flushMu.Unlock()
	d := e.DurableIndex()
	dir := t.TempDir()
	copyFile(t, e.path, filepath.Join(dir, FileName))
	return dir, d
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

// reopen opens the copy in dir, checks that its data is the state after
// the batch of its applied index (at most last), and returns that index.
func reopen(t *testing.T, dir string, last uint64, states []map[string]string) uint64 {
	t.Helper()
	r := open(t, dir, Options{})
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

// tearNewestMeta invalidates the checksum of the meta page with the
// highest transaction ID (bbolt's meta: 16-byte page header, then magic,
// version, page size, flags, root bucket (16), freelist, pgid, txid,
// checksum; native byte order).
func tearNewestMeta(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var hdr [80]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
		t.Fatal(err)
	}
	pageSize := int64(binary.LittleEndian.Uint32(hdr[24:]))
	var txids [2]uint64
	for i := range txids {
		if _, err := f.ReadAt(hdr[:], int64(i)*pageSize); err != nil {
			t.Fatal(err)
		}
		txids[i] = binary.LittleEndian.Uint64(hdr[64:])
	}
	newest := int64(0)
	if txids[1] > txids[0] {
		newest = 1
	}
	if _, err := f.WriteAt([]byte("torn!torn"), newest*pageSize+72); err != nil {
		t.Fatal(err)
	}
}

// TestInstallSnapshot exports one engine, stages the keys through a
// SnapshotWriter and installs them into another that holds unflushed and
// flushed state of its own: afterwards it holds exactly the export, also
// after a reopen, a snapshot taken before the install still reads the
// old state, and a corrupt staged file is refused with the engine left as
// it was.
func TestInstallSnapshot(t *testing.T) {
	src := open(t, t.TempDir(), Options{})
	defer src.Close()
	b := src.NewBatch()
	for i := range 50 {
		_ = b.Set(fmt.Appendf(nil, "k%02d", i), fmt.Appendf(nil, "src%d", i))
	}
	if err := b.Commit(40); err != nil {
		t.Fatal(err)
	}
	dstDir := t.TempDir()
	dst := open(t, dstDir, Options{MemBytes: 512})
	for i := uint64(1); i <= 10; i++ {
		b := dst.NewBatch()
		_ = b.Set(fmt.Appendf(nil, "k%02d", 60+i), []byte("old"))
		_ = b.Set(fmt.Appendf(nil, "k%02d", i), []byte("old"))
		if err := b.Commit(i); err != nil {
			t.Fatal(err)
		}
	}
	old := scan(t, dst)
	before := dst.NewSnapshot()

	stage := func(name string, corrupt bool) string {
		path := filepath.Join(t.TempDir(), name)
		w, err := dst.NewSnapshotWriter(path)
		if err != nil {
			t.Fatal(err)
		}
		x, err := src.NewExportView()
		if err != nil {
			t.Fatal(err)
		}
		defer x.Close()
		if x.AppliedIndex() != 40 {
			t.Fatalf("export view at %d, want 40", x.AppliedIndex())
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
			_, _ = f.WriteAt([]byte("X"), 40)
			_ = f.Close()
		}
		return path
	}

	if _, err := dst.InstallSnapshot(stage("bad", true)); err == nil {
		t.Fatal("a corrupt staged file was installed")
	}
	if got := scan(t, dst); !maps.Equal(got, old) || dst.AppliedIndex() != 10 {
		t.Fatalf("after a refused install: applied %d, data changed: %v", dst.AppliedIndex(), !maps.Equal(got, old))
	}
	idx, err := dst.InstallSnapshot(stage("good", false))
	if err != nil {
		t.Fatal(err)
	}
	want := scan(t, src)
	if idx != 40 || dst.AppliedIndex() != 40 || dst.DurableIndex() != 40 {
		t.Fatalf("install returned %d, applied %d, durable %d; want 40", idx, dst.AppliedIndex(), dst.DurableIndex())
	}
	if got := scan(t, dst); !maps.Equal(got, want) {
		t.Fatalf("after install: %v, want %v", got, want)
	}
	if got := scan(t, before); !maps.Equal(got, old) {
		t.Fatalf("snapshot taken before the install changed")
	}
	_ = before.Close()
	b = dst.NewBatch()
	_ = b.Set([]byte("k99"), []byte("new"))
	if err := b.Commit(41); err != nil {
		t.Fatal(err)
	}
	want["k99"] = "new"
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	dst = open(t, dstDir, Options{})
	defer dst.Close()
	if got := scan(t, dst); !maps.Equal(got, want) || dst.AppliedIndex() != 41 {
		t.Fatalf("after reopen: applied %d, data %v", dst.AppliedIndex(), got)
	}
}

// TestKeyLimits: bbolt's key limits are refused when written, not when a
// flush meets them.
func TestKeyLimits(t *testing.T) {
	e := open(t, t.TempDir(), Options{})
	defer e.Close()
	b := e.NewBatch()
	defer b.Close()
	for _, k := range [][]byte{nil, make([]byte, 32769)} {
		if err := b.Set(k, []byte("v")); err == nil {
			t.Errorf("Set of a %d-byte key succeeded", len(k))
		}
	}
	if !b.Empty() {
		t.Error("refused writes made the batch non-empty")
	}
}

// TestConcurrentReadersSeeWholeBatches runs readers (scans, snapshots,
// point reads) against a writer whose every batch sets all keys to its own
// index, while overlays are frozen and flushed in the background and,
// now and then, a snapshot is installed or the file compacted and swapped:
// every view must show all keys
// equal (one whole batch or install, never a mix) and never older than
// a view taken before it by the same reader.
func TestConcurrentReadersSeeWholeBatches(t *testing.T) {
	const keys = 20
	e := open(t, t.TempDir(), Options{MemBytes: 2 << 10})
	defer e.Close()
	stageDir := t.TempDir()
	done := make(chan struct{})
	errs := make(chan error, 4)
	for r := range 3 {
		go func() {
			var last uint64
			for {
				select {
				case <-done:
					errs <- nil
					return
				default:
				}
				// Reader 0 scans the engine, 1 a snapshot, 2 an
				// uncommitted batch.
				var rd engine.Reader = e
				var closer io.Closer
				switch r {
				case 1:
					snap := e.NewSnapshot()
					rd, closer = snap, snap
				case 2:
					b := e.NewBatch()
					rd, closer = b, b
				}
				it := rd.NewIter([]byte("k"), []byte("l"))
				var vals []string
				for ok := it.First(); ok; ok = it.Next() {
					vals = append(vals, string(it.Value()))
				}
				err := it.Close()
				if closer != nil {
					_ = closer.Close()
				}
				if err != nil {
					errs <- err
					return
				}
				if len(vals) != 0 && (len(vals) != keys || slices.ContainsFunc(vals, func(v string) bool { return v != vals[0] })) {
					errs <- fmt.Errorf("reader %d saw a mixed view: %v", r, vals)
					return
				}
				if len(vals) > 0 {
					n, err := strconv.ParseUint(vals[0], 10, 64)
					if err != nil {
						errs <- fmt.Errorf("reader %d: value %q: %w", r, vals[0], err)
						return
					}
					if n < last {
						errs <- fmt.Errorf("reader %d went back from %d to %d", r, last, n)
						return
					}
					last = n
				}
			}
		}()
	}
	value := func(i uint64) []byte { return fmt.Appendf(nil, "%08d", i) }
	for i := uint64(1); i <= 600; i++ {
		if i%100 == 50 {
			if err := e.CompactAll(); err != nil {
				t.Fatal(err)
			}
		}
		if i%150 == 0 {
			// Install a snapshot at i: every key at i.
			path := filepath.Join(stageDir, fmt.Sprint(i))
			w, err := e.NewSnapshotWriter(path)
			if err != nil {
				t.Fatal(err)
			}
			_ = w.Add(engine.AppliedIndexKey, encodeIndex(i))
			for k := range keys {
				_ = w.Add(fmt.Appendf(nil, "k%02d", k), value(i))
			}
			if err := w.Finish(); err != nil {
				t.Fatal(err)
			}
			if _, err := e.InstallSnapshot(path); err != nil {
				t.Fatal(err)
			}
			continue
		}
		b := e.NewBatch()
		for k := range keys {
			_ = b.Set(fmt.Appendf(nil, "k%02d", k), value(i))
		}
		if err := b.Commit(i); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestCompactAll: after most keys are deleted, CompactAll shrinks the file;
// a snapshot and an iterator opened before it keep reading the old file,
// commits during and after it land, and everything survives a reopen.
func TestCompactAll(t *testing.T) {
	dir := t.TempDir()
	e := open(t, dir, Options{})
	value := make([]byte, 1000)
	want := map[string]string{}
	for i := range 20 {
		b := e.NewBatch()
		for j := range 100 {
			k := fmt.Sprintf("k%02d%03d", i, j)
			_ = b.Set([]byte(k), value)
			want[k] = string(value)
		}
		if err := b.Commit(uint64(i + 1)); err != nil {
			t.Fatal(err)
		}
	}
	// Written to the file, so that deleting them leaves free pages there.
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	b := e.NewBatch()
	if err := b.DeleteRange([]byte("k01"), []byte("k20")); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(21); err != nil {
		t.Fatal(err)
	}
	for k := range want {
		if k >= "k01" {
			delete(want, k)
		}
	}
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	before := e.DiskSize()
	snap := e.NewSnapshot()
	it := e.NewIter([]byte("k"), []byte("l"))
	if !it.First() {
		t.Fatal("iterator before CompactAll is empty")
	}
	if err := e.CompactAll(); err != nil {
		t.Fatal(err)
	}
	after := e.DiskSize()
	if after >= before/2 {
		t.Fatalf("CompactAll: %d bytes before, %d after", before, after)
	}
	n := 1
	for it.Next() {
		n++
	}
	if err := it.Close(); err != nil || n != len(want) {
		t.Fatalf("iterator across CompactAll read %d keys (%v), want %d", n, err, len(want))
	}
	if got := scan(t, snap); !maps.Equal(got, want) {
		t.Fatalf("snapshot across CompactAll: %d keys, want %d", len(got), len(want))
	}
	_ = snap.Close()
	b = e.NewBatch()
	_ = b.Set([]byte("knew"), []byte("x"))
	if err := b.Commit(22); err != nil {
		t.Fatal(err)
	}
	want["knew"] = "x"
	if got := scan(t, e); !maps.Equal(got, want) {
		t.Fatalf("after CompactAll: %d keys, want %d", len(got), len(want))
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open(t, dir, Options{})
	defer e.Close()
	if got := scan(t, e); !maps.Equal(got, want) || e.AppliedIndex() != 22 {
		t.Fatalf("reopened after CompactAll at %d with %d keys, want 22 and %d", e.AppliedIndex(), len(got), len(want))
	}
	t.Logf("%d bytes before CompactAll, %d after", before, after)
}

// TestReadAfterClose: reads after Close fail instead of waiting for a file
// that will never come back.
func TestReadAfterClose(t *testing.T) {
	e := open(t, filepath.Join(t.TempDir(), "a", "b"), Options{})
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Get([]byte("k")); !errors.Is(err, errClosedEngine) {
		t.Fatalf("Get after Close: %v", err)
	}
	it := e.NewIter(nil, nil)
	if it.First() || !errors.Is(it.Close(), errClosedEngine) {
		t.Fatal("iterator after Close")
	}
}

// TestIteratorWalk drives one iterator through long random sequences of
// positioning calls (First, Last, SeekGE, SeekLT, Next, Prev) over data
// spread across every layer a read merges (the file, a frozen overlay, the
// overlay, a batch's own writes, with deletions in each hiding keys below
// them) and checks each answer against a sorted list.
func TestIteratorWalk(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 11))
			e := open(t, t.TempDir(), Options{})
			defer e.Close()
			m := map[string]string{}
			key := func() string { return fmt.Sprintf("k%02d", rng.IntN(40)) }
			write := func(b engine.Batch, i int) {
				for range 15 {
					k := key()
					if rng.IntN(3) == 0 {
						_ = b.Delete([]byte(k))
						delete(m, k)
					} else {
						v := fmt.Sprintf("%s@%d", k, i)
						_ = b.Set([]byte(k), []byte(v))
						m[k] = v
					}
				}
			}
			// Layer by layer: the file, a frozen overlay, the overlay.
			for i := range 3 {
				b := e.NewBatch()
				write(b, i)
				if err := b.Commit(uint64(i + 1)); err != nil {
					t.Fatal(err)
				}
				switch i {
				case 0:
					if err := e.Flush(); err != nil {
						t.Fatal(err)
					}
				case 1:
					e.mu.Lock()
					e.freezeLocked() // frozen, not flushed: the flusher is not kicked
					e.mu.Unlock()
				}
			}
			b := e.NewBatch()
			defer b.Close()
			write(b, 3)
			keys := slices.Sorted(maps.Keys(m))
			lo, hi := key(), key()
			if hi < lo {
				lo, hi = hi, lo
			}
			var want []string
			for _, k := range keys {
				if k >= lo && k < hi {
					want = append(want, k)
				}
			}
			for _, r := range []engine.Reader{b} {
				it := r.NewIter([]byte(lo), []byte(hi))
				pos := -1 // index into want; -1 or len(want): invalid
				for step := range 300 {
					var ok bool
					var what string
					switch op := rng.IntN(6); {
					case op == 0:
						what, ok = "First", it.First()
						pos = 0
					case op == 1:
						what, ok = "Last", it.Last()
						pos = len(want) - 1
					case op == 2:
						k := key()
						what, ok = "SeekGE "+k, it.SeekGE([]byte(k))
						pos, _ = slices.BinarySearch(want, k)
					case op == 3:
						k := key()
						what, ok = "SeekLT "+k, it.SeekLT([]byte(k))
						i, _ := slices.BinarySearch(want, k)
						pos = i - 1
					case op == 4 && pos >= 0 && pos < len(want):
						what, ok = "Next", it.Next()
						pos++
					case op == 5 && pos >= 0 && pos < len(want):
						what, ok = "Prev", it.Prev()
						pos--
					default:
						continue
					}
					valid := pos >= 0 && pos < len(want)
					if ok != valid || it.Valid() != valid {
						t.Fatalf("step %d %s in [%s, %s): valid %v, want %v (want %v)", step, what, lo, hi, ok, valid, want)
					}
					if valid && (string(it.Key()) != want[pos] || string(it.Value()) != m[want[pos]]) {
						t.Fatalf("step %d %s in [%s, %s): at %s=%s, want %s=%s", step, what, lo, hi, it.Key(), it.Value(), want[pos], m[want[pos]])
					}
					if !valid {
						pos = -1
					}
				}
				if err := it.Close(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
