package bbolt

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/RaduBerinde/btreemap"
	bolt "go.etcd.io/bbolt"

	"github.com/strata-kv/strata/engine"
)

// overlaysLocked returns the overlays, newest first, and their generation.
// REQUIRES: e.mu held.
func (e *Engine) overlaysLocked() ([]*layer, uint64) {
	if e.mu.memClone == nil {
		e.mu.memClone = e.mu.mem.Clone()
	}
	out := make([]*layer, 0, 1+len(e.mu.frozen))
	out = append(out, e.mu.memClone)
	for i := len(e.mu.frozen) - 1; i >= 0; i-- {
		out = append(out, e.mu.frozen[i].tree)
	}
	return out, e.mu.gen
}

func (e *Engine) overlays() ([]*layer, uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.overlaysLocked()
}

// view is a consistent read view: overlays over a bbolt read transaction
// (Engine invariant 6).
type view struct {
	layers []*layer // newest first
	h      *handle  // acquired; released by close
	closed bool
	tx     *bolt.Tx
	bucket *bolt.Bucket
}

// newView takes the overlays, then begins a read transaction, in that
// order (invariant 6).
func (e *Engine) newView() (*view, error) {
	layers, gen := e.overlays()
	h, err := e.acquireHandle()
	if err != nil {
		return nil, err
	}
	tx, err := h.db.Begin(false)
	if err != nil {
		h.release()
		return nil, fmt.Errorf("begin bbolt read transaction: %w", err)
	}
	fileGen, err := decodeIndex(tx.Bucket(metaBucket).Get(genKey))
	if err != nil {
		_ = tx.Rollback()
		h.release()
		return nil, fmt.Errorf("read install generation: %w", err)
	}
	if fileGen != gen {
		// A snapshot was installed after the overlays were taken: they
		// belong to the state it replaced.
		layers = nil
	}
	return &view{layers: layers, h: h, tx: tx, bucket: tx.Bucket(dataBucket)}, nil
}

func (v *view) close() error {
	if v.closed {
		return nil
	}
	v.closed = true
	err := v.tx.Rollback()
	v.h.release()
	return err
}

// lookup finds key in layers, newest first.
func lookup(layers []*layer, key []byte) (entry, bool) {
	for _, l := range layers {
		if _, en, ok := l.Get(key); ok {
			return en, true
		}
	}
	return entry{}, false
}

func (v *view) get(key []byte) ([]byte, error) {
	if en, ok := lookup(v.layers, key); ok {
		return found(en)
	}
	// A cursor, not Bucket.Get, which cannot tell an empty value from none.
	k, val := v.bucket.Cursor().Seek(key)
	if !bytes.Equal(k, key) {
		return nil, engine.ErrNotFound
	}
	return bytes.Clone(val), nil
}

func found(en entry) ([]byte, error) {
	if en.del {
		return nil, engine.ErrNotFound
	}
	return bytes.Clone(en.value), nil
}

// kids returns the view's iterator children, newest first, after extra.
func (v *view) kids(extra ...child) []child {
	out := make([]child, 0, len(extra)+len(v.layers)+1)
	out = append(out, extra...)
	for _, l := range v.layers {
		out = append(out, &treeChild{t: l})
	}
	return append(out, &cursorChild{c: v.bucket.Cursor()})
}

// Get implements engine.Reader. A key found in the overlays needs no bbolt
// transaction: the answer is the state when the overlays were taken.
func (e *Engine) Get(key []byte) ([]byte, error) {
	layers, _ := e.overlays()
	if en, ok := lookup(layers, key); ok {
		return found(en)
	}
	v, err := e.newView()
	if err != nil {
		return nil, fmt.Errorf("get %q: %w", key, err)
	}
	defer v.close()
	// The fresh view's overlays are checked again: a flush may have moved
	// the key from an overlay into the file, or an install replaced both.
	return v.get(key)
}

// NewIter implements engine.Reader. The iterator holds a bbolt read
// transaction until it is closed.
func (e *Engine) NewIter(lower, upper []byte) engine.Iterator {
	v, err := e.newView()
	if err != nil {
		return errIter{fmt.Errorf("new iterator: %w", err)}
	}
	return newMergeIter(v.kids(), lower, upper, v.close)
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
	return newMergeIter(s.v.kids(), lower, upper, nil)
}
func (s *snapshot) Close() error { return s.v.close() }

// errSnapshot is the snapshot returned when no view could be taken: every
// read fails with the error.
type errSnapshot struct{ err error }

func (s errSnapshot) Get([]byte) ([]byte, error)          { return nil, s.err }
func (s errSnapshot) NewIter(_, _ []byte) engine.Iterator { return errIter(s) }
func (s errSnapshot) Close() error                        { return nil }

// child is one source of a merged iterator. key returns nil when the child
// is not positioned on an entry; keys are never empty.
type child interface {
	first()
	last()
	seekGE(k []byte)
	seekLT(k []byte)
	next()
	prev()
	key() []byte
	value() []byte
	del() bool
}

// treeChild walks an overlay that does not change while it is walked (a
// clone or a frozen overlay). Each step is a seek from the current key,
// O(log n): the B-tree has callbacks, not cursors.
type treeChild struct {
	t  *layer
	k  []byte
	en entry
}

func (c *treeChild) set(k []byte, en entry) bool { c.k, c.en = k, en; return false }

func (c *treeChild) first() {
	c.k = nil
	c.t.AscendFunc(btreemap.Min[[]byte](), btreemap.Max[[]byte](), c.set)
}
func (c *treeChild) last() {
	c.k = nil
	c.t.DescendFunc(btreemap.Max[[]byte](), btreemap.Min[[]byte](), c.set)
}
func (c *treeChild) seekGE(k []byte) {
	c.k = nil
	c.t.AscendFunc(btreemap.GE(k), btreemap.Max[[]byte](), c.set)
}
func (c *treeChild) seekLT(k []byte) {
	c.k = nil
	c.t.DescendFunc(btreemap.LT(k), btreemap.Min[[]byte](), c.set)
}
func (c *treeChild) next() {
	k := c.k
	c.k = nil
	c.t.AscendFunc(btreemap.GT(k), btreemap.Max[[]byte](), c.set)
}
func (c *treeChild) prev() {
	k := c.k
	c.k = nil
	c.t.DescendFunc(btreemap.LT(k), btreemap.Min[[]byte](), c.set)
}
func (c *treeChild) key() []byte   { return c.k }
func (c *treeChild) value() []byte { return c.en.value }
func (c *treeChild) del() bool     { return c.en.del }

// cursorChild walks the data bucket of a bbolt read transaction.
type cursorChild struct {
	c    *bolt.Cursor
	k, v []byte
}

func (c *cursorChild) first()          { c.k, c.v = c.c.First() }
func (c *cursorChild) last()           { c.k, c.v = c.c.Last() }
func (c *cursorChild) seekGE(k []byte) { c.k, c.v = c.c.Seek(k) }
func (c *cursorChild) seekLT(k []byte) {
	if c.k, c.v = c.c.Seek(k); c.k == nil {
		c.k, c.v = c.c.Last()
	} else {
		c.k, c.v = c.c.Prev()
	}
}
func (c *cursorChild) next()         { c.k, c.v = c.c.Next() }
func (c *cursorChild) prev()         { c.k, c.v = c.c.Prev() }
func (c *cursorChild) key() []byte   { return c.k }
func (c *cursorChild) value() []byte { return c.v }
func (c *cursorChild) del() bool     { return false }

// mergeIter merges its children, newest first: at each key the newest
// child that has it decides, and a deletion hides the key.
//
// Invariants: moving forwards, every child is on its smallest key >= the
// current one; backwards, on its largest key <= the current one. A change
// of direction seeks every child past the current key.
type mergeIter struct {
	kids         []child
	lower, upper []byte
	forward      bool
	valid        bool
	k, v         []byte
	release      func() error
	closed       bool
}

func newMergeIter(kids []child, lower, upper []byte, release func() error) *mergeIter {
	return &mergeIter{kids: kids, lower: lower, upper: upper, release: release}
}

// findForward settles on the smallest visible key at or after the
// children's positions.
func (m *mergeIter) findForward() bool {
	m.forward = true
	for {
		var k []byte
		for _, c := range m.kids {
			if ck := c.key(); ck != nil && (k == nil || bytes.Compare(ck, k) < 0) {
				k = ck
			}
		}
		if k == nil || (m.upper != nil && bytes.Compare(k, m.upper) >= 0) {
			m.valid = false
			return false
		}
		if m.settle(k) {
			return true
		}
		for _, c := range m.atKey(k) {
			c.next()
		}
	}
}

// findBackward settles on the largest visible key at or before the
// children's positions.
func (m *mergeIter) findBackward() bool {
	m.forward = false
	for {
		var k []byte
		for _, c := range m.kids {
			if ck := c.key(); ck != nil && (k == nil || bytes.Compare(ck, k) > 0) {
				k = ck
			}
		}
		if k == nil || (m.lower != nil && bytes.Compare(k, m.lower) < 0) {
			m.valid = false
			return false
		}
		if m.settle(k) {
			return true
		}
		for _, c := range m.atKey(k) {
			c.prev()
		}
	}
}

// settle makes k current if the newest child holding it has a value.
func (m *mergeIter) settle(k []byte) bool {
	for _, c := range m.kids {
		if bytes.Equal(c.key(), k) {
			if c.del() {
				return false
			}
			m.k, m.v, m.valid = k, c.value(), true
			return true
		}
	}
	return false
}

// atKey lists the children positioned on k (taken before any moves, since
// k may belong to one of them).
func (m *mergeIter) atKey(k []byte) []child {
	var out []child
	for _, c := range m.kids {
		if bytes.Equal(c.key(), k) {
			out = append(out, c)
		}
	}
	return out
}

func (m *mergeIter) First() bool {
	if m.lower != nil {
		return m.SeekGE(m.lower)
	}
	for _, c := range m.kids {
		c.first()
	}
	return m.findForward()
}

func (m *mergeIter) Last() bool {
	if m.upper != nil {
		return m.SeekLT(m.upper)
	}
	for _, c := range m.kids {
		c.last()
	}
	return m.findBackward()
}

func (m *mergeIter) SeekGE(key []byte) bool {
	if m.lower != nil && bytes.Compare(key, m.lower) < 0 {
		key = m.lower
	}
	for _, c := range m.kids {
		c.seekGE(key)
	}
	return m.findForward()
}

func (m *mergeIter) SeekLT(key []byte) bool {
	if m.upper != nil && bytes.Compare(key, m.upper) > 0 {
		key = m.upper
	}
	for _, c := range m.kids {
		c.seekLT(key)
	}
	return m.findBackward()
}

func (m *mergeIter) Next() bool {
	if !m.valid {
		return false
	}
	if m.forward {
		for _, c := range m.atKey(m.k) {
			c.next()
		}
	} else {
		// Every child is at or before the current key: move each to its
		// first key after it.
		k := m.k
		for _, c := range m.kids {
			c.seekGE(k)
			if bytes.Equal(c.key(), k) {
				c.next()
			}
		}
	}
	return m.findForward()
}

func (m *mergeIter) Prev() bool {
	if !m.valid {
		return false
	}
	if !m.forward {
		for _, c := range m.atKey(m.k) {
			c.prev()
		}
	} else {
		k := m.k
		for _, c := range m.kids {
			c.seekLT(k)
		}
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
	return m.v
}

func (m *mergeIter) Close() error {
	if m.closed {
		return nil
	}
	m.closed, m.valid = true, false
	if m.release != nil {
		return m.release()
	}
	return nil
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

var errClosed = errors.New("batch already committed or closed")
