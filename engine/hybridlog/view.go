package hybridlog

import (
	"bytes"
	"fmt"

	"github.com/RaduBerinde/btreemap"

	"github.com/strata-kv/strata/engine"
)

// view is a consistent read view: a clone of the in-memory tree over a
// snapshot of the stable region, taken together (Engine invariant 5).
type view struct {
	tree    *tree
	stable  engine.Snapshot
	applied uint64
	closed  bool
}

// maxViewTries is how many times a view is taken without flushMu before
// it takes flushMu (Engine invariant 5). A try fails only when a flush
// starts between its two halves, and flushes run one at a time, each
// taking far longer than a try, so the second try nearly always holds.
const maxViewTries = 3

// newView takes a view; seal makes its records read-only first, for a
// reader on another goroutine than the applier's. It does not wait for a
// flush's write to the stable region (Engine invariant 5).
func (e *Engine) newView(seal bool) (*view, error) {
	for try := 0; try < maxViewTries; try++ {
		e.mu.Lock()
		if e.mu.closed {
			e.mu.Unlock()
			return nil, errEngineClosed
		}
		if e.mu.installing {
			e.mu.Unlock()
			break
		}
		v := e.treeViewLocked(seal)
		gen := e.mu.stableGen
		e.mu.Unlock()
		v.stable = e.stable.NewSnapshot()
		e.mu.RLock()
		held := e.mu.stableGen == gen
		e.mu.RUnlock()
		if held {
			return v, nil
		}
		_ = v.stable.Close()
	}
	// Under flushMu no flush or install changes the stable region.
	e.flushMu.Lock()
	defer e.flushMu.Unlock()
	e.mu.Lock()
	if e.mu.closed {
		e.mu.Unlock()
		return nil, errEngineClosed
	}
	v := e.treeViewLocked(seal)
	e.mu.Unlock()
	v.stable = e.stable.NewSnapshot()
	return v, nil
}

// treeViewLocked seals if asked and returns a view of the tree, without
// its stable half. REQUIRES: e.mu held (write).
func (e *Engine) treeViewLocked(seal bool) *view {
	if seal {
		e.sealLocked()
	}
	if e.mu.treeClone == nil {
		e.mu.treeClone = e.mu.tree.Clone()
	}
	return &view{tree: e.mu.treeClone, applied: e.applied.Load()}
}

func (v *view) close() error {
	if v.closed {
		return nil
	}
	v.closed = true
	return v.stable.Close()
}

func (v *view) get(key []byte) ([]byte, error) {
	if v.closed {
		return nil, errClosed
	}
	if _, r, ok := v.tree.Get(key); ok {
		if r.del {
			return nil, engine.ErrNotFound
		}
		return bytes.Clone(r.value), nil
	}
	return v.stable.Get(key)
}

// iter merges extra (newest), the view's tree and the stable region.
func (v *view) iter(lower, upper []byte, release func() error, extra ...child) engine.Iterator {
	if v.closed {
		return errIter{fmt.Errorf("new iterator: %w", errClosed)}
	}
	kids := append(extra, newTreeIter(v.tree, lower, upper, recValue), stableChild{v.stable.NewIter(lower, upper)})
	return &mergeIter{kids: kids, release: release}
}

func recValue(r *rec) ([]byte, bool) { return r.value, r.del }

// Get implements engine.Reader: the hash index, then the stable region.
func (e *Engine) Get(key []byte) ([]byte, error) {
	e.mu.RLock()
	if e.mu.closed {
		e.mu.RUnlock()
		return nil, fmt.Errorf("get %q: %w", key, errEngineClosed)
	}
	if r := e.mu.index[string(key)]; r != nil {
		v, del := bytes.Clone(r.value), r.del
		e.mu.RUnlock()
		if del {
			return nil, engine.ErrNotFound
		}
		if v == nil {
			v = []byte{}
		}
		return v, nil
	}
	e.mu.RUnlock()
	// Not in memory: the stable region has the key's state (invariant 3).
	return e.stable.Get(key)
}

// NewIter implements engine.Reader. The iterator holds a view until it is
// closed.
func (e *Engine) NewIter(lower, upper []byte) engine.Iterator {
	v, err := e.newView(true)
	if err != nil {
		return errIter{fmt.Errorf("new iterator: %w", err)}
	}
	return v.iter(lower, upper, v.close)
}

// NewSnapshot implements engine.Engine.
func (e *Engine) NewSnapshot() engine.Snapshot {
	v, err := e.newView(true)
	if err != nil {
		return errSnapshot{err}
	}
	return &snapshot{v: v}
}

type snapshot struct{ v *view }

func (s *snapshot) Get(key []byte) ([]byte, error) { return s.v.get(key) }
func (s *snapshot) NewIter(lower, upper []byte) engine.Iterator {
	return s.v.iter(lower, upper, nil)
}
func (s *snapshot) Close() error { return s.v.close() }

type errSnapshot struct{ err error }

func (s errSnapshot) Get([]byte) ([]byte, error)          { return nil, s.err }
func (s errSnapshot) NewIter(_, _ []byte) engine.Iterator { return errIter(s) }
func (s errSnapshot) Close() error                        { return nil }

// child is one source of a merged iterator: an engine.Iterator that can
// also hold deletions.
type child interface {
	engine.Iterator
	deleted() bool
}

// stableChild is the stable region's iterator, which holds no deletions.
type stableChild struct{ engine.Iterator }

func (stableChild) deleted() bool { return false }

// iterBatch is how many entries a treeIter takes per descent.
const iterBatch = 64

type pair[V any] struct {
	k []byte
	v V
}

// treeIter walks a B-tree that does not change while it is walked, in
// [lower, upper), taking up to iterBatch entries per descent in the
// direction of travel (the tree has callbacks, not cursors).
type treeIter[V any] struct {
	t            *btreemap.BTreeMap[[]byte, V]
	lower, upper []byte
	val          func(V) ([]byte, bool)
	buf          []pair[V]
	pos          int
	forward      bool
	valid        bool
}

func newTreeIter[V any](t *btreemap.BTreeMap[[]byte, V], lower, upper []byte, val func(V) ([]byte, bool)) *treeIter[V] {
	return &treeIter[V]{t: t, lower: lower, upper: upper, val: val}
}

func (it *treeIter[V]) lo() btreemap.LowerBound[[]byte] {
	if it.lower == nil {
		return btreemap.Min[[]byte]()
	}
	return btreemap.GE(it.lower)
}

func (it *treeIter[V]) hi() btreemap.UpperBound[[]byte] {
	if it.upper == nil {
		return btreemap.Max[[]byte]()
	}
	return btreemap.LT(it.upper)
}

func (it *treeIter[V]) collect(k []byte, v V) bool {
	it.buf = append(it.buf, pair[V]{k, v})
	return len(it.buf) < iterBatch
}

func (it *treeIter[V]) fillForward(from btreemap.LowerBound[[]byte]) bool {
	it.buf, it.pos, it.forward = it.buf[:0], 0, true
	it.t.AscendFunc(from, it.hi(), it.collect)
	it.valid = len(it.buf) > 0
	return it.valid
}

func (it *treeIter[V]) fillBackward(from btreemap.UpperBound[[]byte]) bool {
	it.buf, it.pos, it.forward = it.buf[:0], 0, false
	it.t.DescendFunc(from, it.lo(), it.collect)
	it.valid = len(it.buf) > 0
	return it.valid
}

func (it *treeIter[V]) First() bool { return it.fillForward(it.lo()) }
func (it *treeIter[V]) Last() bool  { return it.fillBackward(it.hi()) }

func (it *treeIter[V]) SeekGE(key []byte) bool {
	if it.lower != nil && bytes.Compare(key, it.lower) < 0 {
		key = it.lower
	}
	return it.fillForward(btreemap.GE(key))
}

func (it *treeIter[V]) SeekLT(key []byte) bool {
	if it.upper != nil && bytes.Compare(key, it.upper) > 0 {
		key = it.upper
	}
	return it.fillBackward(btreemap.LT(key))
}

// step moves one entry in the buffer's direction, refilling past its end.
func (it *treeIter[V]) step() bool {
	if it.pos+1 < len(it.buf) {
		it.pos++
		return true
	}
	if len(it.buf) < iterBatch {
		it.valid = false
		return false
	}
	if it.forward {
		return it.fillForward(btreemap.GT(it.buf[it.pos].k))
	}
	return it.fillBackward(btreemap.LT(it.buf[it.pos].k))
}

func (it *treeIter[V]) Next() bool {
	if !it.valid {
		return false
	}
	if !it.forward {
		return it.fillForward(btreemap.GT(it.buf[it.pos].k))
	}
	return it.step()
}

func (it *treeIter[V]) Prev() bool {
	if !it.valid {
		return false
	}
	if it.forward {
		return it.fillBackward(btreemap.LT(it.buf[it.pos].k))
	}
	return it.step()
}

func (it *treeIter[V]) Valid() bool { return it.valid }

func (it *treeIter[V]) Key() []byte {
	if !it.valid {
		return nil
	}
	return it.buf[it.pos].k
}

func (it *treeIter[V]) Value() []byte {
	if !it.valid {
		return nil
	}
	v, _ := it.val(it.buf[it.pos].v)
	return v
}

func (it *treeIter[V]) deleted() bool {
	_, del := it.val(it.buf[it.pos].v)
	return del
}

func (it *treeIter[V]) Close() error { it.valid = false; return nil }

// mergeIter merges its children, newest first: at each key the newest
// child holding it decides, and a deletion hides the key.
//
// Invariant: moving forwards, every child is on its smallest key >= the
// current one; backwards, on its largest key <= it. A change of direction
// seeks every child past the current key.
type mergeIter struct {
	kids    []child
	cur     child
	k       []byte
	forward bool
	valid   bool
	release func() error
	closed  bool
}

func (m *mergeIter) find(forward bool) bool {
	m.forward = forward
	for {
		var k []byte
		for _, c := range m.kids {
			if !c.Valid() {
				continue
			}
			ck := c.Key()
			if k == nil || (forward && bytes.Compare(ck, k) < 0) || (!forward && bytes.Compare(ck, k) > 0) {
				k = ck
			}
		}
		if k == nil {
			m.valid, m.cur = false, nil
			return false
		}
		var top child
		var at []child
		for _, c := range m.kids {
			if c.Valid() && bytes.Equal(c.Key(), k) {
				if top == nil {
					top = c
				}
				at = append(at, c)
			}
		}
		if !top.deleted() {
			m.cur, m.k, m.valid = top, k, true
			return true
		}
		for _, c := range at {
			if forward {
				c.Next()
			} else {
				c.Prev()
			}
		}
	}
}

func (m *mergeIter) First() bool {
	for _, c := range m.kids {
		c.First()
	}
	return m.find(true)
}

func (m *mergeIter) Last() bool {
	for _, c := range m.kids {
		c.Last()
	}
	return m.find(false)
}

func (m *mergeIter) SeekGE(key []byte) bool {
	for _, c := range m.kids {
		c.SeekGE(key)
	}
	return m.find(true)
}

func (m *mergeIter) SeekLT(key []byte) bool {
	for _, c := range m.kids {
		c.SeekLT(key)
	}
	return m.find(false)
}

func (m *mergeIter) Next() bool {
	if !m.valid {
		return false
	}
	k := bytes.Clone(m.k) // children's keys change as they move
	for _, c := range m.kids {
		if m.forward {
			if c.Valid() && bytes.Equal(c.Key(), k) {
				c.Next()
			}
		} else if c.SeekGE(k) && bytes.Equal(c.Key(), k) {
			c.Next()
		}
	}
	return m.find(true)
}

func (m *mergeIter) Prev() bool {
	if !m.valid {
		return false
	}
	k := bytes.Clone(m.k)
	for _, c := range m.kids {
		if !m.forward {
			if c.Valid() && bytes.Equal(c.Key(), k) {
				c.Prev()
			}
		} else {
			c.SeekLT(k)
		}
	}
	return m.find(false)
}

func (m *mergeIter) Valid() bool { return m.valid }

func (m *mergeIter) Key() []byte {
	if !m.valid {
		return nil
	}
	return m.k
}

func (m *mergeIter) Value() []byte {
	if !m.valid {
		return nil
	}
	return m.cur.Value()
}

func (m *mergeIter) Close() error {
	if m.closed {
		return nil
	}
	m.closed, m.valid = true, false
	var err error
	for _, c := range m.kids {
		if cerr := c.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}
	if m.release != nil {
		if rerr := m.release(); rerr != nil && err == nil {
			err = rerr
		}
	}
	return err
}

// errIter is never valid and reports its error on Close.
type errIter struct{ err error }

func (errIter) First() bool        { return false }
func (errIter) Last() bool         { return false }
func (errIter) SeekGE([]byte) bool { return false }
func (errIter) SeekLT([]byte) bool { return false }
func (errIter) Next() bool         { return false }
func (errIter) Prev() bool         { return false }
func (errIter) Valid() bool        { return false }
func (errIter) Key() []byte        { return nil }
func (errIter) Value() []byte      { return nil }
func (it errIter) Close() error    { return it.err }
