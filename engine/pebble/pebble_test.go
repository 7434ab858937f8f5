package pebble

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/engine/enginetest"
)

func openMem(t *testing.T, fs vfs.FS, opts Options) *Engine {
	t.Helper()
	opts.FS = fs
	e, err := Open("db", opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return e
}

// scan returns every non-reserved key and value in the reader.
func scan(t *testing.T, r engine.Reader) map[string]string {
	t.Helper()
	out := map[string]string{}
	it := r.NewIter([]byte("k"), []byte("l"))
	for ok := it.First(); ok; ok = it.Next() {
		out[string(it.Key())] = string(it.Value())
	}
	if err := it.Close(); err != nil {
		t.Fatalf("iterate: %v", err)
	}
	return out
}

func TestBatchReadsOwnWritesAndSnapshotIsolation(t *testing.T) {
	e := openMem(t, vfs.NewMem(), Options{})
	defer e.Close()

	b := e.NewBatch()
	if err := b.Set([]byte("k1"), []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if v, err := b.Get([]byte("k1")); err != nil || string(v) != "v1" {
		t.Fatalf("batch Get = %q, %v; want v1", v, err)
	}
	if _, err := e.Get([]byte("k1")); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("engine Get before commit: err = %v, want ErrNotFound", err)
	}
	if err := b.Commit(5); err != nil {
		t.Fatal(err)
	}
	snap := e.NewSnapshot()
	defer snap.Close()

	b = e.NewBatch()
	_ = b.Set([]byte("k2"), []byte("v2"))
	_ = b.Delete([]byte("k1"))
	if got := scan(t, b); !maps.Equal(got, map[string]string{"k2": "v2"}) {
		t.Fatalf("batch scan = %v", got)
	}
	if err := b.Commit(4); err == nil {
		t.Fatal("commit with a lower applied index succeeded")
	}
	b.Close()
	b = e.NewBatch()
	_ = b.DeleteRange([]byte("k"), []byte("l"))
	_ = b.Set([]byte("k3"), []byte("v3"))
	if err := b.Commit(6); err != nil {
		t.Fatal(err)
	}
	if got := scan(t, e); !maps.Equal(got, map[string]string{"k3": "v3"}) {
		t.Fatalf("engine scan = %v", got)
	}
	if got := scan(t, snap); !maps.Equal(got, map[string]string{"k1": "v1"}) {
		t.Fatalf("snapshot scan = %v", got)
	}
	if e.AppliedIndex() != 6 {
		t.Fatalf("AppliedIndex = %d, want 6", e.AppliedIndex())
	}
}

// TestBatchReadsSeeLaterCommits: a batch's point reads go through an
// iterator it keeps, whose view of the engine is fixed when it is made; a
// batch committed meanwhile (engine.Batch reads see the engine as it is) or
// a snapshot installed must show in the next read.
func TestBatchReadsSeeLaterCommits(t *testing.T) {
	e := openMem(t, vfs.NewMem(), Options{})
	defer e.Close()
	b := e.NewBatch()
	defer b.Close()
	if _, err := b.Get([]byte("k1")); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("Get(k1) before any commit: %v, want ErrNotFound", err)
	}
	other := e.NewBatch()
	if err := other.Set([]byte("k1"), []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if err := other.Commit(1); err != nil {
		t.Fatal(err)
	}
	if v, err := b.Get([]byte("k1")); err != nil || string(v) != "v1" {
		t.Fatalf("Get(k1) after another batch committed it = %q, %v; want v1", v, err)
	}
}

func TestFlushAdvancesDurableAndCheckpoint(t *testing.T) {
	fs := vfs.NewMem()
	e := openMem(t, fs, Options{})
	b := e.NewBatch()
	_ = b.Set([]byte("ka"), []byte("1"))
	if err := b.Commit(7); err != nil {
		t.Fatal(err)
	}
	if d := e.DurableIndex(); d != 0 {
		t.Fatalf("DurableIndex before flush = %d, want 0", d)
	}
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	if d := e.DurableIndex(); d != 7 {
		t.Fatalf("DurableIndex after flush = %d, want 7", d)
	}
	b = e.NewBatch()
	_ = b.Set([]byte("kb"), []byte("2"))
	if err := b.Commit(8); err != nil {
		t.Fatal(err)
	}
	idx, err := e.Checkpoint("cp")
	if err != nil {
		t.Fatal(err)
	}
	if idx != 8 {
		t.Fatalf("Checkpoint index = %d, want 8", idx)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	cp, err := Open("cp", Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	if cp.AppliedIndex() != 8 || cp.DurableIndex() != 8 {
		t.Fatalf("checkpoint applied/durable = %d/%d, want 8/8", cp.AppliedIndex(), cp.DurableIndex())
	}
	if got := scan(t, cp); !maps.Equal(got, map[string]string{"ka": "1", "kb": "2"}) {
		t.Fatalf("checkpoint scan = %v", got)
	}
}

// TestCrashPrefix checks the single-logging contract: after a power cut at
// any instant, the engine holds exactly the batches up to the applied index
// it reads back, and that index is at least the DurableIndex reported
// before the cut.
func TestCrashPrefix(t *testing.T) {
	for _, wal := range []bool{false, true} {
		for seed := uint64(1); seed <= 4; seed++ {
			t.Run(fmt.Sprintf("wal=%v/seed=%d", wal, seed), func(t *testing.T) {
				crashPrefix(t, seed, wal)
			})
		}
	}
}

func crashPrefix(t *testing.T, seed uint64, wal bool) {
	rng := rand.New(rand.NewPCG(seed, seed))
	fs := vfs.NewCrashableMem()
	e := openMem(t, fs, Options{EnableWAL: wal, memTableSize: 256 << 10})
	states := []map[string]string{{}} // states[i]: data after batch i
	value := make([]byte, 512)
	crashes := 0
	for i := uint64(1); i <= 600; i++ {
		st := maps.Clone(states[i-1])
		b := e.NewBatch()
		for range 1 + rng.IntN(8) {
			k := fmt.Sprintf("k%03d", rng.IntN(200))
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
		if rng.IntN(60) == 0 {
			if err := e.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		if rng.IntN(40) != 0 {
			continue
		}
		crashes++
		d := e.DurableIndex()
		clone := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: rng.IntN(3) * 50, RNG: rand.New(rand.NewPCG(seed, i))})
		r := openMem(t, clone, Options{EnableWAL: wal})
		a := r.AppliedIndex()
		if a < d || a > i {
			t.Fatalf("after crash at batch %d: applied %d, want in [durable %d, %d]", i, a, d, i)
		}
		if wal && a != i {
			t.Fatalf("with the WAL on, applied after crash = %d, want %d", a, i)
		}
		if got := scan(t, r); !maps.Equal(got, states[a]) {
			t.Fatalf("after crash at batch %d: data differs from batch %d's state", i, a)
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if e.DurableIndex() == 0 && !wal {
		t.Errorf("DurableIndex never advanced")
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d crashes, final durable %d", crashes, e.durable.Load())
}

func TestOpenOnDisk(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	e, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := e.NewBatch()
	_ = b.Set([]byte("kx"), []byte("y"))
	if err := b.Commit(3); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e, err = Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if e.AppliedIndex() != 3 || e.DurableIndex() != 3 {
		t.Fatalf("applied/durable after clean reopen = %d/%d, want 3/3", e.AppliedIndex(), e.DurableIndex())
	}
	if e.DiskSize() <= 0 {
		t.Fatalf("DiskSize = %d", e.DiskSize())
	}
	if err := e.CompactAll(); err != nil {
		t.Fatal(err)
	}
}

// TestAutomaticFlushRaisesDurable checks that Pebble's own memtable flushes
// raise D without an explicit Flush, and never past what a crash keeps.
func TestAutomaticFlushRaisesDurable(t *testing.T) {
	fs := vfs.NewCrashableMem()
	e := openMem(t, fs, Options{memTableSize: 256 << 10})
	value := make([]byte, 4096)
	var d uint64
	for i := uint64(1); i <= 400; i++ {
		b := e.NewBatch()
		_ = b.Set(fmt.Appendf(nil, "k%04d", i), value)
		if err := b.Commit(i); err != nil {
			t.Fatal(err)
		}
		d = e.DurableIndex()
		if d > i {
			t.Fatalf("DurableIndex %d above applied %d", d, i)
		}
	}
	if d == 0 {
		t.Fatal("DurableIndex never advanced through automatic flushes")
	}
	r := openMem(t, fs.CrashClone(vfs.CrashCloneCfg{}), Options{})
	defer r.Close()
	if a := r.AppliedIndex(); a < d {
		t.Fatalf("after crash applied %d < durable %d", a, d)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestConformance(t *testing.T) {
	for _, wal := range []bool{false, true} {
		t.Run(fmt.Sprintf("wal=%v", wal), func(t *testing.T) {
			enginetest.Run(t, func(t *testing.T, dir string) engine.Engine {
				e, err := Open(dir, Options{EnableWAL: wal, CacheSize: 1 << 20})
				if err != nil {
					t.Fatal(err)
				}
				return e
			})
		})
	}
}

// TestReadOnly: a read-only engine reads what was committed, refuses
// writes, does not exist unless created before, and changes no file, not
// even on Close.
func TestReadOnly(t *testing.T) {
	fs := vfs.NewMem()
	if _, err := Open("db", Options{FS: fs, ReadOnly: true}); err == nil {
		t.Fatal("a read-only open of a missing engine succeeded")
	}
	e := openMem(t, fs, Options{})
	b := e.NewBatch()
	if err := b.Set([]byte("k1"), []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(7); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	files := func() map[string]int64 {
		names, err := fs.List("db")
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int64{}
		for _, n := range names {
			st, err := fs.Stat(fs.PathJoin("db", n))
			if err != nil {
				t.Fatal(err)
			}
			out[n] = st.Size()
		}
		return out
	}
	before := files()
	ro := openMem(t, fs, Options{ReadOnly: true})
	if got := scan(t, ro); got["k1"] != "v1" || ro.AppliedIndex() != 7 {
		t.Errorf("read-only engine holds %v at applied index %d, want k1=v1 at 7", got, ro.AppliedIndex())
	}
	wb := ro.NewBatch()
	if err := wb.Set([]byte("k2"), []byte("v2")); err != nil {
		t.Fatal(err)
	}
	if err := wb.Commit(8); err == nil {
		t.Error("a read-only engine committed a batch")
	}
	if err := ro.Close(); err != nil {
		t.Fatalf("close read-only: %v", err)
	}
	if after := files(); !maps.Equal(before, after) {
		t.Errorf("a read-only open changed the files: before %v, after %v", before, after)
	}
}
