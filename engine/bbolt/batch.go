package bbolt

import (
	"bytes"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/strata-kv/strata/engine"
)

// batch is engine.Batch: its writes in an overlay of its own, read over a
// view of the engine taken at the first read and kept until the batch is
// committed or closed. Only the applier commits, so that view is the
// engine's committed state for as long as the batch is built.
//
// One bbolt read-write transaction per batch would read its own writes for
// free, but bbolt commits a read-write transaction only with its fsyncs or
// unsafely without them (see the package comment), and a discarded batch
// would need a rollback that holds bbolt's single writer lock meanwhile.
type batch struct {
	e    *Engine
	own  *layer
	ops  int
	v    *view // nil until the first read
	done bool
}

// NewBatch implements engine.Engine.
func (e *Engine) NewBatch() engine.Batch { return &batch{e: e, own: newLayer()} }

func checkKey(key []byte) error {
	if len(key) == 0 {
		return fmt.Errorf("bbolt engine: empty key")
	}
	if len(key) > bolt.MaxKeySize {
		return fmt.Errorf("bbolt engine: key of %d bytes is above bbolt's limit of %d", len(key), bolt.MaxKeySize)
	}
	return nil
}

func (b *batch) view() (*view, error) {
	if b.done {
		return nil, errClosed
	}
	if b.v == nil {
		v, err := b.e.newView()
		if err != nil {
			return nil, err
		}
		b.v = v
	}
	return b.v, nil
}

func (b *batch) Get(key []byte) ([]byte, error) {
	if _, en, ok := b.own.Get(key); ok {
		return found(en)
	}
	v, err := b.view()
	if err != nil {
		return nil, fmt.Errorf("get %q: %w", key, err)
	}
	return v.get(key)
}

// NewIter implements engine.Reader. The iterator sees the batch's writes
// as they are when it is created (a clone of its overlay).
func (b *batch) NewIter(lower, upper []byte) engine.Iterator {
	v, err := b.view()
	if err != nil {
		return errIter{fmt.Errorf("new iterator: %w", err)}
	}
	return newMergeIter(v.kids(&treeChild{t: b.own.Clone()}), lower, upper, nil)
}

func (b *batch) Set(key, value []byte) error {
	if b.done {
		return errClosed
	}
	if err := checkKey(key); err != nil {
		return err
	}
	b.own.ReplaceOrInsert(bytes.Clone(key), entry{value: bytes.Clone(value)})
	b.ops++
	return nil
}

func (b *batch) Delete(key []byte) error {
	if b.done {
		return errClosed
	}
	if err := checkKey(key); err != nil {
		return err
	}
	b.own.ReplaceOrInsert(bytes.Clone(key), entry{del: true})
	b.ops++
	return nil
}

// DeleteRange implements engine.Batch by deleting, one by one, every key
// the batch sees in [start, end) now: O(keys in range). Since only the
// applier commits, no key enters the range between this call and the
// commit except through this batch.
func (b *batch) DeleteRange(start, end []byte) error {
	if b.done {
		return errClosed
	}
	it := b.NewIter(start, end)
	var keys [][]byte
	for ok := it.First(); ok; ok = it.Next() {
		keys = append(keys, bytes.Clone(it.Key()))
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("delete range [%q, %q): %w", start, end, err)
	}
	for _, k := range keys {
		b.own.ReplaceOrInsert(k, entry{del: true})
	}
	b.ops++
	return nil
}

func (b *batch) Empty() bool { return b.ops == 0 }

// release ends the batch's read view: before the commit, which may wait
// for the flusher, which may wait for read transactions to end.
func (b *batch) release() {
	if b.v != nil {
		_ = b.v.close()
		b.v = nil
	}
	b.done = true
}

func (b *batch) Commit(appliedIndex uint64) error {
	return b.CommitWith(appliedIndex, nil)
}

// CommitWith implements engine.Batch: the batch's writes, then each tail's
// in order, then the applied index, go into the overlay in one step.
func (b *batch) CommitWith(appliedIndex uint64, tails []engine.WriteOnlyBatch) error {
	defer func() {
		for _, t := range tails {
			_ = t.Close()
		}
	}()
	if b.done {
		return fmt.Errorf("commit batch: %w", errClosed)
	}
	ws := make([]*writeOnlyBatch, len(tails))
	for i, t := range tails {
		wb, ok := t.(*writeOnlyBatch)
		if !ok || wb.done || wb.e != b.e {
			return fmt.Errorf("commit batch at index %d: tail %d is not an open write-only batch of this engine", appliedIndex, i)
		}
		ws[i] = wb
	}
	if cur := b.e.applied.Load(); appliedIndex < cur {
		return fmt.Errorf("commit batch: applied index %d below the engine's %d", appliedIndex, cur)
	}
	b.release()
	return b.e.commit(b.own, ws, appliedIndex)
}

func (b *batch) Close() error {
	if !b.done {
		b.release()
	}
	return nil
}

// op is one write of a write-only batch.
type op struct {
	key, value []byte
	del        bool
}

// writeOnlyBatch is engine.WriteOnlyBatch: its writes, in order.
type writeOnlyBatch struct {
	e    *Engine
	ops  []op
	done bool
}

// NewWriteOnlyBatch implements engine.Engine.
func (e *Engine) NewWriteOnlyBatch() engine.WriteOnlyBatch { return &writeOnlyBatch{e: e} }

func (w *writeOnlyBatch) Set(key, value []byte) error {
	if w.done {
		return errClosed
	}
	if err := checkKey(key); err != nil {
		return err
	}
	w.ops = append(w.ops, op{key: bytes.Clone(key), value: bytes.Clone(value)})
	return nil
}

func (w *writeOnlyBatch) Delete(key []byte) error {
	if w.done {
		return errClosed
	}
	if err := checkKey(key); err != nil {
		return err
	}
	w.ops = append(w.ops, op{key: bytes.Clone(key), del: true})
	return nil
}

func (w *writeOnlyBatch) Close() error {
	w.done = true
	return nil
}
