// Package enginetest is a conformance suite for engine.Engine
// implementations: every engine (engine/pebble, a bbolt baseline, ...) runs
// Run from its own tests so that they all honour the same contract.
//
//	func TestConformance(t *testing.T) {
//		enginetest.Run(t, func(t *testing.T, dir string) engine.Engine {
//			e, err := pebble.Open(dir, pebble.Options{})
//			if err != nil {
//				t.Fatal(err)
//			}
//			return e
//		})
//	}
//
// The opener is called with the same dir to reopen an engine after Close.
// Keys the suite writes start with "t/", so engines may reserve others.
package enginetest

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/strata-kv/strata/engine"
)

// Opener opens (or reopens) an engine in dir.
type Opener func(t *testing.T, dir string) engine.Engine

// Run runs the conformance suite.
func Run(t *testing.T, open Opener) {
	tests := []struct {
		name string
		fn   func(t *testing.T, open Opener)
	}{
		{"BatchReadsOwnWrites", testBatchReadsOwnWrites},
		{"IteratorBoundsAndDirections", testIterator},
		{"SnapshotIsolation", testSnapshot},
		{"AppliedIndex", testAppliedIndex},
		{"FlushAndDurableIndex", testFlush},
		{"Checkpoint", testCheckpoint},
		{"CloseDiscardsBatch", testBatchClose},
		{"CommitWithTails", testCommitWith},
		{"DeleteRangeThenWrite", testDeleteRange},
		{"BatchReadsBetweenWrites", testBatchReadsBetweenWrites},
		{"WritesCopyTheirArguments", testWritesCopy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, open) })
	}
}

func k(s string) []byte { return []byte("t/" + s) }

func commit(t *testing.T, e engine.Engine, index uint64, fn func(b engine.Batch)) {
	t.Helper()
	b := e.NewBatch()
	fn(b)
	if err := b.Commit(index); err != nil {
		t.Fatalf("commit at %d: %v", index, err)
	}
}

// scan lists "key=value" in [lower, upper) forwards.
func scan(t *testing.T, r engine.Reader, lower, upper []byte) []string {
	t.Helper()
	it := r.NewIter(lower, upper)
	var out []string
	for ok := it.First(); ok; ok = it.Next() {
		out = append(out, fmt.Sprintf("%s=%s", it.Key(), it.Value()))
	}
	if err := it.Close(); err != nil {
		t.Fatalf("iterate: %v", err)
	}
	return out
}

func all(t *testing.T, r engine.Reader) []string { return scan(t, r, k(""), []byte("t0")) }

func want(t *testing.T, what string, got []string, w ...string) {
	t.Helper()
	if !slices.Equal(got, w) {
		t.Fatalf("%s = %q, want %q", what, got, w)
	}
}

func testBatchReadsOwnWrites(t *testing.T, open Opener) {
	e := open(t, t.TempDir())
	defer e.Close()
	commit(t, e, 1, func(b engine.Batch) {
		_ = b.Set(k("a"), []byte("1"))
		_ = b.Set(k("b"), []byte("2"))
		_ = b.Set(k("c"), []byte("3"))
	})
	b := e.NewBatch()
	defer b.Close()
	if !b.Empty() {
		t.Fatal("new batch is not empty")
	}
	_ = b.Set(k("a"), []byte("10"))
	_ = b.Delete(k("b"))
	_ = b.Set(k("d"), []byte("4"))
	if b.Empty() {
		t.Fatal("batch with writes is empty")
	}
	if v, err := b.Get(k("a")); err != nil || string(v) != "10" {
		t.Fatalf("batch Get(a) = %q, %v", v, err)
	}
	if _, err := b.Get(k("b")); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("batch Get(b) after delete: err = %v, want ErrNotFound", err)
	}
	if v, err := b.Get(k("c")); err != nil || string(v) != "3" {
		t.Fatalf("batch Get(c) (committed) = %q, %v", v, err)
	}
	want(t, "batch scan", all(t, b), "t/a=10", "t/c=3", "t/d=4")
	want(t, "engine scan before commit", all(t, e), "t/a=1", "t/b=2", "t/c=3")
	_ = b.DeleteRange(k("b"), k("d"))
	want(t, "batch scan after DeleteRange", all(t, b), "t/a=10", "t/d=4")
	if err := b.Commit(2); err != nil {
		t.Fatal(err)
	}
	want(t, "engine scan after commit", all(t, e), "t/a=10", "t/d=4")
}

func testIterator(t *testing.T, open Opener) {
	e := open(t, t.TempDir())
	defer e.Close()
	commit(t, e, 1, func(b engine.Batch) {
		for _, s := range []string{"a", "b", "c", "d"} {
			_ = b.Set(k(s), []byte(s))
		}
	})
	want(t, "[b, d)", scan(t, e, k("b"), k("d")), "t/b=b", "t/c=c")
	it := e.NewIter(k("b"), k("d"))
	defer it.Close()
	var back []string
	for ok := it.Last(); ok; ok = it.Prev() {
		back = append(back, string(it.Key()))
	}
	want(t, "[b, d) backwards", back, "t/c", "t/b")
	if !it.SeekGE(k("bb")) || string(it.Key()) != "t/c" {
		t.Fatalf("SeekGE(bb) lands on %q", it.Key())
	}
	if !it.SeekLT(k("c")) || string(it.Key()) != "t/b" {
		t.Fatalf("SeekLT(c) lands on %q", it.Key())
	}
	if it.SeekLT(k("b")) || it.Valid() {
		t.Fatal("SeekLT below the lower bound is valid")
	}
	if it.SeekGE(k("d")) {
		t.Fatal("SeekGE at the upper bound is valid")
	}
}

func testSnapshot(t *testing.T, open Opener) {
	e := open(t, t.TempDir())
	defer e.Close()
	commit(t, e, 1, func(b engine.Batch) { _ = b.Set(k("a"), []byte("1")) })
	snap := e.NewSnapshot()
	defer snap.Close()
	commit(t, e, 2, func(b engine.Batch) {
		_ = b.Set(k("a"), []byte("2"))
		_ = b.Set(k("b"), []byte("2"))
	})
	want(t, "snapshot", all(t, snap), "t/a=1")
	if _, err := snap.Get(k("b")); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("snapshot Get(b) err = %v", err)
	}
	want(t, "engine", all(t, e), "t/a=2", "t/b=2")
}

func testAppliedIndex(t *testing.T, open Opener) {
	dir := t.TempDir()
	e := open(t, dir)
	if e.AppliedIndex() != 0 {
		t.Fatalf("new engine applied index %d", e.AppliedIndex())
	}
	commit(t, e, 5, func(b engine.Batch) { _ = b.Set(k("a"), []byte("1")) })
	commit(t, e, 5, func(b engine.Batch) {}) // equal is allowed
	b := e.NewBatch()
	if err := b.Commit(4); err == nil {
		t.Fatal("commit below the applied index succeeded")
	}
	_ = b.Close()
	commit(t, e, 9, func(b engine.Batch) { _ = b.Set(k("b"), []byte("2")) })
	if e.AppliedIndex() != 9 {
		t.Fatalf("applied index %d, want 9", e.AppliedIndex())
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open(t, dir)
	defer e.Close()
	if e.AppliedIndex() != 9 || e.DurableIndex() != 9 {
		t.Fatalf("after clean reopen applied/durable = %d/%d, want 9/9", e.AppliedIndex(), e.DurableIndex())
	}
	want(t, "after reopen", all(t, e), "t/a=1", "t/b=2")
}

func testFlush(t *testing.T, open Opener) {
	e := open(t, t.TempDir())
	defer e.Close()
	commit(t, e, 3, func(b engine.Batch) { _ = b.Set(k("a"), []byte("1")) })
	if d := e.DurableIndex(); d > 3 {
		t.Fatalf("durable %d above applied 3", d)
	}
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	if d := e.DurableIndex(); d != 3 {
		t.Fatalf("durable after Flush = %d, want 3", d)
	}
	if e.DiskSize() <= 0 {
		t.Fatalf("DiskSize = %d", e.DiskSize())
	}
	if err := e.CompactAll(); err != nil {
		t.Fatal(err)
	}
	want(t, "after CompactAll", all(t, e), "t/a=1")
}

func testCheckpoint(t *testing.T, open Opener) {
	e := open(t, t.TempDir())
	commit(t, e, 4, func(b engine.Batch) { _ = b.Set(k("a"), []byte("1")) })
	dir := filepath.Join(t.TempDir(), "cp")
	idx, err := e.Checkpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	if idx != 4 {
		t.Fatalf("checkpoint index %d, want 4", idx)
	}
	commit(t, e, 5, func(b engine.Batch) { _ = b.Set(k("b"), []byte("2")) })
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	cp := open(t, dir)
	defer cp.Close()
	if cp.AppliedIndex() != 4 {
		t.Fatalf("checkpoint opens at %d, want 4", cp.AppliedIndex())
	}
	want(t, "checkpoint", all(t, cp), "t/a=1")
}

func testBatchClose(t *testing.T, open Opener) {
	e := open(t, t.TempDir())
	defer e.Close()
	b := e.NewBatch()
	_ = b.Set(k("a"), []byte("1"))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	want(t, "after Close", all(t, e))
	if e.AppliedIndex() != 0 {
		t.Fatalf("a closed batch moved the applied index to %d", e.AppliedIndex())
	}
}

// testCommitWith: tails built on other goroutines commit atomically after
// the batch's own writes, in order, with the applied index; a discarded
// batch discards its tails.
func testCommitWith(t *testing.T, open Opener) {
	e := open(t, t.TempDir())
	defer e.Close()
	commit(t, e, 1, func(b engine.Batch) { _ = b.Set(k("a"), []byte("1")) })
	tails := make([]engine.WriteOnlyBatch, 2)
	var wg sync.WaitGroup
	for i := range tails {
		wg.Go(func() {
			w := e.NewWriteOnlyBatch()
			_ = w.Set(k(fmt.Sprintf("tail%d", i)), []byte("x"))
			_ = w.Set(k("last"), []byte(fmt.Sprint(i)))
			tails[i] = w
		})
	}
	wg.Wait()
	_ = tails[0].Delete(k("a"))
	b := e.NewBatch()
	_ = b.Set(k("a"), []byte("2"))
	_ = b.Set(k("last"), []byte("batch"))
	want(t, "batch scan before commit (tails not visible)", all(t, b), "t/a=2", "t/last=batch")
	want(t, "engine scan before commit", all(t, e), "t/a=1")
	if err := b.CommitWith(2, tails); err != nil {
		t.Fatal(err)
	}
	// Order: the batch, then tail 0 (which deletes a), then tail 1.
	want(t, "engine scan after commit", all(t, e), "t/last=1", "t/tail0=x", "t/tail1=x")
	if got := e.AppliedIndex(); got != 2 {
		t.Fatalf("applied index %d after CommitWith(2), want 2", got)
	}

	// Discarded: neither the batch nor its tails reach the engine.
	tail := e.NewWriteOnlyBatch()
	_ = tail.Set(k("discarded"), []byte("x"))
	b = e.NewBatch()
	_ = b.Set(k("discarded2"), []byte("x"))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tail.Close(); err != nil {
		t.Fatal(err)
	}
	want(t, "engine scan after discard", all(t, e), "t/last=1", "t/tail0=x", "t/tail1=x")
	// A tail below the applied index is refused like a batch.
	b = e.NewBatch()
	if err := b.CommitWith(1, []engine.WriteOnlyBatch{e.NewWriteOnlyBatch()}); err == nil {
		t.Fatal("CommitWith below the applied index succeeded")
	}
	_ = b.Close()
}

// testDeleteRange: a range deletion in a batch hides the committed keys and
// the batch's own earlier writes in its range, not those outside it, and a
// write after it in the same batch is seen, before and after the commit.
func testDeleteRange(t *testing.T, open Opener) {
	e := open(t, t.TempDir())
	defer e.Close()
	commit(t, e, 1, func(b engine.Batch) {
		for _, s := range []string{"a", "b", "c", "d", "g"} {
			_ = b.Set(k(s), []byte("1"))
		}
	})
	b := e.NewBatch()
	defer b.Close()
	_ = b.Set(k("e"), []byte("2"))
	if err := b.DeleteRange(k("b"), k("f")); err != nil {
		t.Fatal(err)
	}
	_ = b.Set(k("c"), []byte("3"))
	if _, err := b.Get(k("b")); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("batch Get(b) after DeleteRange: err = %v, want ErrNotFound", err)
	}
	want(t, "batch scan", all(t, b), "t/a=1", "t/c=3", "t/g=1")
	if err := b.Commit(2); err != nil {
		t.Fatal(err)
	}
	want(t, "engine scan after commit", all(t, e), "t/a=1", "t/c=3", "t/g=1")
}

// testBatchReadsBetweenWrites reads through a batch after each of its
// writes, as mvcc's apply does (each put reads the key's previous version,
// then writes it): an engine that caches what a read saw must still see
// every later write of the batch. It also asks for keys that are a prefix
// of a stored key, and the reverse, which must not match.
func testBatchReadsBetweenWrites(t *testing.T, open Opener) {
	e := open(t, t.TempDir())
	defer e.Close()
	commit(t, e, 1, func(b engine.Batch) {
		_ = b.Set(k("ab"), []byte("1"))
		_ = b.Set(k("c"), []byte("2"))
		_ = b.Set(k("e"), []byte("3"))
	})
	b := e.NewBatch()
	defer b.Close()
	get := func(key, wantValue string) {
		t.Helper()
		v, err := b.Get(k(key))
		if wantValue == "" {
			if !errors.Is(err, engine.ErrNotFound) {
				t.Fatalf("batch Get(%s) = %q, %v; want ErrNotFound", key, v, err)
			}
			return
		}
		if err != nil || string(v) != wantValue {
			t.Fatalf("batch Get(%s) = %q, %v; want %q", key, v, err, wantValue)
		}
	}
	get("a", "")   // a prefix of a stored key
	get("abc", "") // a stored key is a prefix of it
	get("ab", "1") // committed before the batch
	_ = b.Set(k("a"), []byte("10"))
	get("a", "10")
	get("ab", "1")
	_ = b.Set(k("ab"), []byte("11"))
	get("ab", "11")
	_ = b.Delete(k("c"))
	get("c", "")
	_ = b.Set(k("c"), []byte("12"))
	get("c", "12")
	_ = b.DeleteRange(k("b"), k("f"))
	get("c", "")
	get("e", "")
	get("ab", "11")
	_ = b.Set(k("d"), []byte("13"))
	get("d", "13")
	if err := b.Commit(2); err != nil {
		t.Fatal(err)
	}
	want(t, "engine scan after commit", all(t, e), "t/a=10", "t/ab=11", "t/d=13")
}

// testWritesCopy: a batch's and a write-only batch's Set and Delete copy
// their arguments, so a caller may reuse its buffers as soon as a call
// returns (engine.Batch; mvcc encodes every put into reused buffers).
func testWritesCopy(t *testing.T, open Opener) {
	e := open(t, t.TempDir())
	defer e.Close()
	commit(t, e, 1, func(b engine.Batch) { _ = b.Set(k("gone"), []byte("1")) })
	key, val := []byte{}, []byte{}
	reuse := func(kk, vv string) {
		key = append(key[:0], k(kk)...)
		val = append(val[:0], vv...)
	}
	b := e.NewBatch()
	reuse("a", "1")
	_ = b.Set(key, val)
	reuse("b", "2")
	_ = b.Set(key, val)
	reuse("gone", "")
	_ = b.Delete(key)
	reuse("zz", "overwritten")
	want(t, "batch scan with the buffers reused", all(t, b), "t/a=1", "t/b=2")
	tail := e.NewWriteOnlyBatch()
	reuse("c", "3")
	_ = tail.Set(key, val)
	reuse("d", "4")
	_ = tail.Set(key, val)
	reuse("zz", "overwritten")
	if err := b.CommitWith(2, []engine.WriteOnlyBatch{tail}); err != nil {
		t.Fatal(err)
	}
	want(t, "engine scan after commit", all(t, e), "t/a=1", "t/b=2", "t/c=3", "t/d=4")
}
