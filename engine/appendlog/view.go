package appendlog

import (
	"bytes"
	"fmt"

	"github.com/RaduBerinde/btreemap"

	"github.com/strata-kv/strata/engine"
)

// view is a consistent read view: a clone of the key directory and a
// reference on every file of the set when it was taken (Engine invariant
// 5), with each file's length and whether it was sealed.
type view struct {
	kd      *keydir
	segs    []*segment
	sizes   []int64
	sealed  []bool
	applied uint64
	closed  bool
}

func (e *Engine) newView() (*view, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.closed {
		return nil, errEngineClosed
	}
	if e.mu.kdClone == nil {
		e.mu.kdClone = e.mu.kd.Clone()
	}
	v := &view{kd: e.mu.kdClone, applied: e.applied.Load()}
	for _, s := range e.mu.segs {
		s.ref()
		v.segs = append(v.segs, s)
		v.sizes = append(v.sizes, s.size)
		v.sealed = append(v.sealed, s.sealed)
	}
	return v, nil
}

func (v *view) close() error {
	if v.closed {
		return nil
	}
	v.closed = true
	for _, s := range v.segs {
		s.unref()
	}
	return nil
}

func (v *view) get(key []byte) ([]byte, error) {
	if v.closed {
		return nil, errClosed
	}
	_, l, ok := v.kd.Get(key)
	if !ok {
		return nil, engine.ErrNotFound
	}
	return readLoc(l)
}

func (v *view) iter(lower, upper []byte, release func() error) *kdIter {
	return &kdIter{treeIter: newTreeIter(v.kd, lower, upper), release: release}
}

// Get implements engine.Reader: a lookup in the key directory and one
// read of the value, under mu held shared so that its file stays open.
func (e *Engine) Get(key []byte) ([]byte, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.mu.closed {
		return nil, fmt.Errorf("get %q: %w", key, errEngineClosed)
	}
	_, l, ok := e.mu.kd.Get(key)
	if !ok {
		return nil, engine.ErrNotFound
	}
	v, err := readLoc(l)
	if err != nil {
		return nil, fmt.Errorf("get %q: %w", key, err)
	}
	return v, nil
}

// NewIter implements engine.Reader. The iterator holds a view until it is
// closed.
func (e *Engine) NewIter(lower, upper []byte) engine.Iterator {
	v, err := e.newView()
	if err != nil {
		return errIter{fmt.Errorf("new iterator: %w", err)}
	}
	return v.iter(lower, upper, v.close)
}

// NewSnapshot implements engine.Engine.
func (e *Engine) NewSnapshot() engine.Snapshot {
	v, err := e.newView()
	if err != nil {
		return errSnapshot{err}
	}
	return &snapshot{v: v}
}

type snapshot struct{ v *view }

func (s *snapshot) Get(key []byte) ([]byte, error) { return s.v.get(key) }
func (s *snapshot) NewIter(lower, upper []byte) engine.Iterator {
	if s.v.closed {
		return errIter{fmt.Errorf("new iterator: %w", errClosed)}
	}
	return s.v.iter(lower, upper, nil)
}
func (s *snapshot) Close() error { return s.v.close() }

// errSnapshot is the snapshot returned when no view could be taken.
type errSnapshot struct{ err error }

func (s errSnapshot) Get([]byte) ([]byte, error)          { return nil, s.err }
func (s errSnapshot) NewIter(_, _ []byte) engine.Iterator { return errIter(s) }
func (s errSnapshot) Close() error                        { return nil }

// iterBatch is how many entries a treeIter takes from the tree per
// descent.
const iterBatch = 64

type pair[V any] struct {
	k []byte
	v V
}

// treeIter walks a B-tree that does not change while it is walked (a
// clone) within [lower, upper). The tree has callbacks, not cursors, so
// it takes up to iterBatch entries per descent into buf, in the direction
// of travel; a change of direction descends again from the current key.
type treeIter[V any] struct {
	t            *btreemap.BTreeMap[[]byte, V]
	lower, upper []byte
	buf          []pair[V]
	pos          int
	forward      bool
	valid        bool
}

func newTreeIter[V any](t *btreemap.BTreeMap[[]byte, V], lower, upper []byte) *treeIter[V] {
	return &treeIter[V]{t: t, lower: lower, upper: upper}
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

func (it *treeIter[V]) fillForward(from btreemap.LowerBound[[]byte]) bool {
	it.buf, it.pos, it.forward = it.buf[:0], 0, true
	it.t.AscendFunc(from, it.hi(), func(k []byte, v V) bool {
		it.buf = append(it.buf, pair[V]{k, v})
		return len(it.buf) < iterBatch
	})
	it.valid = len(it.buf) > 0
	return it.valid
}

func (it *treeIter[V]) fillBackward(from btreemap.UpperBound[[]byte]) bool {
	it.buf, it.pos, it.forward = it.buf[:0], 0, false
	it.t.DescendFunc(from, it.lo(), func(k []byte, v V) bool {
		it.buf = append(it.buf, pair[V]{k, v})
		return len(it.buf) < iterBatch
	})
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

func (it *treeIter[V]) Next() bool {
	if !it.valid {
		return false
	}
	if !it.forward {
		return it.fillForward(btreemap.GT(it.buf[it.pos].k))
	}
	if it.pos+1 < len(it.buf) {
		it.pos++
		return true
	}
	if len(it.buf) < iterBatch {
		it.valid = false
		return false
	}
	return it.fillForward(btreemap.GT(it.buf[it.pos].k))
}

func (it *treeIter[V]) Prev() bool {
	if !it.valid {
		return false
	}
	if it.forward {
		return it.fillBackward(btreemap.LT(it.buf[it.pos].k))
	}
	if it.pos+1 < len(it.buf) {
		it.pos++
		return true
	}
	if len(it.buf) < iterBatch {
		it.valid = false
		return false
	}
	return it.fillBackward(btreemap.LT(it.buf[it.pos].k))
}

func (it *treeIter[V]) Valid() bool { return it.valid }

func (it *treeIter[V]) Key() []byte {
	if !it.valid {
		return nil
	}
	return it.buf[it.pos].k
}

func (it *treeIter[V]) val() V { return it.buf[it.pos].v }

// kdIter is engine.Iterator over a view's key directory: it reads a value
// from its file when Value is called.
type kdIter struct {
	*treeIter[loc]
	cached  loc
	loaded  bool
	value   []byte
	err     error
	release func() error
	closed  bool
}

// Value reads the current value; an error is kept for Close.
func (it *kdIter) Value() []byte {
	if !it.valid {
		return nil
	}
	l := it.val()
	if it.loaded && it.cached == l {
		return it.value
	}
	if cap(it.value) < int(l.n) {
		it.value = make([]byte, l.n)
	}
	it.value = it.value[:l.n]
	if _, err := l.seg.f.ReadAt(it.value, l.off); err != nil {
		if it.err == nil {
			it.err = fmt.Errorf("iterator: read %d bytes at %d of %s: %w", l.n, l.off, l.seg.path, err)
		}
		it.loaded = false
		return nil
	}
	it.cached, it.loaded = l, true
	return it.value
}

func (it *kdIter) Close() error {
	if it.closed {
		return it.err
	}
	it.closed, it.valid = true, false
	if it.release != nil {
		if err := it.release(); err != nil && it.err == nil {
			it.err = err
		}
	}
	return it.err
}

// mergeIter is a batch's iterator: its own writes (deletions included)
// over a view of the engine; at a key both hold, its own write decides.
//
// Invariant: moving forwards, both children are on their smallest key >=
// the current one; backwards, on their largest key <= it. A change of
// direction seeks both past the current key.
type mergeIter struct {
	own     *treeIter[entry]
	base    *kdIter
	forward bool
	valid   bool
	fromOwn bool
	k       []byte
}

func (m *mergeIter) findForward() bool {
	m.forward = true
	for {
		ov, bv := m.own.Valid(), m.base.Valid()
		if !ov && !bv {
			m.valid = false
			return false
		}
		if ov && (!bv || bytes.Compare(m.own.Key(), m.base.Key()) <= 0) {
			k := m.own.Key()
			if m.own.val().del {
				if bv && bytes.Equal(m.base.Key(), k) {
					m.base.Next()
				}
				m.own.Next()
				continue
			}
			m.k, m.fromOwn, m.valid = k, true, true
			return true
		}
		m.k, m.fromOwn, m.valid = m.base.Key(), false, true
		return true
	}
}

func (m *mergeIter) findBackward() bool {
	m.forward = false
	for {
		ov, bv := m.own.Valid(), m.base.Valid()
		if !ov && !bv {
			m.valid = false
			return false
		}
		if ov && (!bv || bytes.Compare(m.own.Key(), m.base.Key()) >= 0) {
			k := m.own.Key()
			if m.own.val().del {
				if bv && bytes.Equal(m.base.Key(), k) {
					m.base.Prev()
				}
				m.own.Prev()
				continue
			}
			m.k, m.fromOwn, m.valid = k, true, true
			return true
		}
		m.k, m.fromOwn, m.valid = m.base.Key(), false, true
		return true
	}
}

func (m *mergeIter) First() bool {
	m.own.First()
	m.base.First()
	return m.findForward()
}

func (m *mergeIter) Last() bool {
	m.own.Last()
	m.base.Last()
	return m.findBackward()
}

func (m *mergeIter) SeekGE(key []byte) bool {
	m.own.SeekGE(key)
	m.base.SeekGE(key)
	return m.findForward()
}

func (m *mergeIter) SeekLT(key []byte) bool {
	m.own.SeekLT(key)
	m.base.SeekLT(key)
	return m.findBackward()
}

func (m *mergeIter) Next() bool {
	if !m.valid {
		return false
	}
	k := m.k
	if m.forward {
		if m.own.Valid() && bytes.Equal(m.own.Key(), k) {
			m.own.Next()
		}
		if m.base.Valid() && bytes.Equal(m.base.Key(), k) {
			m.base.Next()
		}
	} else {
		for _, c := range []interface {
			SeekGE([]byte) bool
			Key() []byte
			Next() bool
		}{m.own, m.base} {
			if c.SeekGE(k) && bytes.Equal(c.Key(), k) {
				c.Next()
			}
		}
	}
	return m.findForward()
}

func (m *mergeIter) Prev() bool {
	if !m.valid {
		return false
	}
	k := m.k
	if !m.forward {
		if m.own.Valid() && bytes.Equal(m.own.Key(), k) {
			m.own.Prev()
		}
		if m.base.Valid() && bytes.Equal(m.base.Key(), k) {
			m.base.Prev()
		}
	} else {
		m.own.SeekLT(k)
		m.base.SeekLT(k)
	}
	return m.findBackward()
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
	if m.fromOwn {
		return m.own.val().value
	}
	return m.base.Value()
}

func (m *mergeIter) Close() error {
	m.valid = false
	return m.base.Close()
}

// errIter is the iterator returned when one cannot be created: it is never
// valid and reports the error on Close.
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
