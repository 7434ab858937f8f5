package hybridlog

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/RaduBerinde/btreemap"

	"github.com/strata-kv/strata/engine"
)

// layer is a batch's own writes, ordered by key.
type layer = btreemap.BTreeMap[[]byte, entry]

func newLayer() *layer { return btreemap.New[[]byte, entry](32, bytes.Compare) }

func entryValue(en entry) ([]byte, bool) { return en.value, en.del }

var errClosed = errors.New("hybridlog: batch already committed or closed")

// maxKeySize is the stable region's key limit (engine/appendlog).
const maxKeySize = 64 << 10

func checkKey(key []byte) error {
	if len(key) == 0 {
		return errors.New("hybridlog: empty key")
	}
	if len(key) > maxKeySize {
		return fmt.Errorf("hybridlog: key of %d bytes is above the limit of %d", len(key), maxKeySize)
	}
	return nil
}

// batch is engine.Batch: its writes in a layer of its own, read over a
// view of the engine taken without a seal at the first read (Engine
// invariant 5: only the applier commits, and it commits this batch after
// its reads) and kept until the batch is committed or closed.
type batch struct {
	e    *Engine
	own  *layer
	ops  int
	v    *view
	done bool
}

// NewBatch implements engine.Engine.
func (e *Engine) NewBatch() engine.Batch { return &batch{e: e, own: newLayer()} }

func (b *batch) view() (*view, error) {
	if b.done {
		return nil, errClosed
	}
	if b.v == nil {
		v, err := b.e.newView(false)
		if err != nil {
			return nil, err
		}
		b.v = v
	}
	return b.v, nil
}

func (b *batch) Get(key []byte) ([]byte, error) {
	if _, en, ok := b.own.Get(key); ok {
		if en.del {
			return nil, engine.ErrNotFound
		}
		return bytes.Clone(en.value), nil
	}
	v, err := b.view()
	if err != nil {
		return nil, fmt.Errorf("get %q: %w", key, err)
	}
	return v.get(key)
}

// NewIter implements engine.Reader. The iterator sees the batch's writes
// as they are when it is created (a clone of its layer).
func (b *batch) NewIter(lower, upper []byte) engine.Iterator {
	v, err := b.view()
	if err != nil {
		return errIter{fmt.Errorf("new iterator: %w", err)}
	}
	if b.own.Len() == 0 {
		return v.iter(lower, upper, nil)
	}
	return v.iter(lower, upper, nil, newTreeIter(b.own.Clone(), lower, upper, entryValue))
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

// DeleteRange implements engine.Batch by deleting every key the batch
// sees in [start, end) now: O(keys in range).
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

func (b *batch) release() {
	if b.v != nil {
		_ = b.v.close()
		b.v = nil
	}
	b.done = true
}

func (b *batch) Commit(appliedIndex uint64) error { return b.CommitWith(appliedIndex, nil) }

// CommitWith implements engine.Batch: the batch's writes, then each tail's
// in order, then the applied index, in one step.
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
