package pebble

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/strata-kv/strata/engine"
)

// TestBatchReadsAgainstModel drives batches of sets, deletes, range
// deletions and reads against a map, with memtables and key filters small
// enough that automatic flushes and filter rotations happen all through:
// every read through a batch, whether it goes through the memtables or
// skips them (memkeys.go), must answer what the model holds. It runs with
// and without flushes awaited, since a read may come while a rotation's
// flush is still running.
func TestBatchReadsAgainstModel(t *testing.T) {
	for _, capacity := range []int{16, 200, 5000} {
		t.Run(fmt.Sprintf("capacity=%d", capacity), func(t *testing.T) {
			e := openMem(t, vfs.NewMem(), Options{memTableSize: 64 << 10, memKeysCapacity: capacity})
			defer e.Close()
			rng := rand.New(rand.NewPCG(uint64(capacity), 7))
			model := map[string]string{}
			key := func() string { return fmt.Sprintf("k%04d", rng.IntN(2000)) }
			index := uint64(0)
			for batchNo := range 600 {
				b := e.NewBatch()
				pending := map[string]*string{} // this batch's writes over the model
				lookup := func(k string) (string, bool) {
					if v, ok := pending[k]; ok {
						if v == nil {
							return "", false
						}
						return *v, true
					}
					v, ok := model[k]
					return v, ok
				}
				for op := range 40 {
					switch r := rng.IntN(100); {
					case r < 45:
						k := key()
						v := fmt.Sprintf("v%d.%d", batchNo, op)
						if err := b.Set([]byte(k), []byte(v)); err != nil {
							t.Fatal(err)
						}
						pending[k] = &v
					case r < 55:
						k := key()
						if err := b.Delete([]byte(k)); err != nil {
							t.Fatal(err)
						}
						pending[k] = nil
					case r < 56:
						lo := rng.IntN(1990)
						start, end := fmt.Sprintf("k%04d", lo), fmt.Sprintf("k%04d", lo+rng.IntN(10)+1)
						if err := b.DeleteRange([]byte(start), []byte(end)); err != nil {
							t.Fatal(err)
						}
						for k := range model {
							if k >= start && k < end {
								pending[k] = nil
							}
						}
						for k, v := range pending {
							if v != nil && k >= start && k < end {
								pending[k] = nil
							}
						}
					default:
						k := key()
						want, ok := lookup(k)
						got, err := b.Get([]byte(k))
						switch {
						case !ok && !errors.Is(err, engine.ErrNotFound):
							t.Fatalf("batch %d op %d: Get(%s) = %q, %v; want ErrNotFound", batchNo, op, k, got, err)
						case ok && (err != nil || string(got) != want):
							t.Fatalf("batch %d op %d: Get(%s) = %q, %v; want %q", batchNo, op, k, got, err, want)
						}
					}
				}
				if rng.IntN(10) == 0 {
					// Discarded: the model keeps what it had.
					if err := b.Close(); err != nil {
						t.Fatal(err)
					}
					continue
				}
				index++
				if err := b.Commit(index); err != nil {
					t.Fatal(err)
				}
				for k, v := range pending {
					if v == nil {
						delete(model, k)
					} else {
						model[k] = *v
					}
				}
				if rng.IntN(50) == 0 {
					if err := e.Flush(); err != nil {
						t.Fatal(err)
					}
				}
			}
		})
	}
}

// TestMemKeysAfterWALReplay: an engine written with Pebble's WAL on and
// reopened with it off replays the WAL into memtables that its key filter
// never saw. Pebble 2.1 flushes them before Open returns, so the queue
// then holds only the empty mutable memtable; newMemKeys checks the queue
// rather than rely on that (invariant 3), and this test holds the reads to
// the outcome either way.
func TestMemKeysAfterWALReplay(t *testing.T) {
	fs := vfs.NewCrashableMem()
	e := openMem(t, fs, Options{EnableWAL: true})
	b := e.NewBatch()
	for i := range 100 {
		if err := b.Set(fmt.Appendf(nil, "k%03d", i), []byte("wal")); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(1); err != nil {
		t.Fatal(err)
	}
	// A crash keeps what the WAL synced and no memtable was flushed.
	r := openMem(t, fs.CrashClone(vfs.CrashCloneCfg{}), Options{})
	defer r.Close()
	e.Close()
	rb := r.NewBatch()
	defer rb.Close()
	for i := range 100 {
		k := fmt.Appendf(nil, "k%03d", i)
		if v, err := rb.Get(k); err != nil || string(v) != "wal" {
			t.Fatalf("Get(%s) after reopening without the WAL = %q, %v; want wal", k, v, err)
		}
	}
}

// TestRangeDeletionKeepsOtherKeysOffTheMemtables: a range deletion in a
// memtable makes the reads of keys inside its span go through the
// memtables (invariant 4), and no others. The log compactor deletes a
// range of index rows at every log truncation; when any range deletion
// switched the filter off, a load's previous-version reads went through
// the memtables' skiplist until the next flush.
func TestRangeDeletionKeepsOtherKeysOffTheMemtables(t *testing.T) {
	// A filter of one key rotates at every commit, so after the flush it no
	// longer holds the keys read below: only the span can send them
	// through the memtables.
	e := openMem(t, vfs.NewMem(), Options{memKeysCapacity: 1})
	defer e.Close()
	b := e.NewBatch()
	for _, k := range []string{"a", "m5", "z"} {
		if err := b.Set([]byte(k), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(1); err != nil {
		t.Fatal(err)
	}
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	b = e.NewBatch()
	if err := b.DeleteRange([]byte("m"), []byte("n")); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(2); err != nil {
		t.Fatal(err)
	}

	// through reports whether a fresh batch's Get of key answered want, and
	// which way it read: through the memtables or the flushed tables alone.
	through := func(key, want string) (memtables bool) {
		t.Helper()
		rb := e.NewBatch().(*batch)
		defer rb.Close()
		v, err := rb.Get([]byte(key))
		switch {
		case want == "" && !errors.Is(err, engine.ErrNotFound):
			t.Fatalf("Get(%s) = %q, %v; want ErrNotFound", key, v, err)
		case want != "" && (err != nil || string(v) != want):
			t.Fatalf("Get(%s) = %q, %v; want %q", key, v, err, want)
		}
		if (rb.reads != nil) == (rb.flushedReads != nil) {
			t.Fatalf("Get(%s) built reads %v and flushedReads %v; want exactly one", key, rb.reads != nil, rb.flushedReads != nil)
		}
		return rb.reads != nil
	}
	for _, k := range []string{"a", "z", "n", "b"} {
		if through(k, map[string]string{"a": "v", "z": "v"}[k]) {
			t.Errorf("Get(%s), outside the deleted span [m, n), read through the memtables; want the flushed tables alone", k)
		}
	}
	for _, k := range []string{"m", "m5", "m7"} {
		if !through(k, "") {
			t.Errorf("Get(%s), inside the deleted span [m, n), read the flushed tables alone; want the memtables too", k)
		}
	}

	// Once the deletion is flushed its span no longer holds reads back.
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	if through("m5", "") {
		t.Errorf("Get(m5) after the range deletion was flushed read through the memtables; want the flushed tables alone")
	}
}

// TestCommitReadsQueueOnlyWhenNeeded: the memtable queue's length comes
// from Pebble's Metrics, which costs a few microseconds and kilobytes under
// the DB's mutex; a commit reads it only to date a range deletion, turn the
// filter off, or rotate it, not once per commit.
func TestCommitReadsQueueOnlyWhenNeeded(t *testing.T) {
	e := openMem(t, vfs.NewMem(), Options{memKeysCapacity: 1000})
	defer e.Close()
	reads := 0
	queueLen := e.memKeys.queueLen
	e.memKeys.queueLen = func() uint64 { reads++; return queueLen() }
	index := uint64(0)
	commit := func(write func(engine.Batch) error) {
		t.Helper()
		b := e.NewBatch()
		if err := write(b); err != nil {
			t.Fatal(err)
		}
		index++
		if err := b.Commit(index); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 100 {
		commit(func(b engine.Batch) error { return b.Set(fmt.Appendf(nil, "k%03d", i), []byte("v")) })
	}
	if reads != 0 {
		t.Fatalf("100 commits of one key read the memtable queue %d times; want 0", reads)
	}
	commit(func(b engine.Batch) error { return b.DeleteRange([]byte("k010"), []byte("k020")) })
	if reads != 1 {
		t.Fatalf("a commit of a range deletion read the memtable queue %d times; want 1 (to date its span)", reads)
	}
	reads = 0
	for i := range 1000 {
		commit(func(b engine.Batch) error { return b.Set(fmt.Appendf(nil, "n%04d", i), []byte("v")) })
	}
	if reads != 1 {
		t.Fatalf("1000 commits of one key each (a filter of 1000 keys) read the memtable queue %d times; want 1 (the rotation)", reads)
	}
}
