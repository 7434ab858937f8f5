package maintenance

import (
	"bytes"

	"github.com/strata-kv/strata/engine"
)

// seekReader is an engine.Reader whose Get seeks one long-lived iterator
// instead of starting a point lookup of its own: a backup reads one value
// for every key version (mvcc.ForEachVersion), and on Pebble a Get builds
// and tears down an iterator stack each time, which cost most of a
// snapshot's CPU. A key the iterator does not find is asked of the
// underlying Get, which tells a missing key from a read error (an
// iterator reports errors only on Close).
//
// Concurrency: one goroutine at a time, as an iterator.
type seekReader struct {
	engine.Reader
	it engine.Iterator
}

// Get returns a copy of the value stored under key, or engine.ErrNotFound.
func (r *seekReader) Get(key []byte) ([]byte, error) {
	if r.it == nil {
		r.it = r.Reader.NewIter(nil, nil)
	}
	if r.it.SeekGE(key) && bytes.Equal(r.it.Key(), key) {
		return append([]byte(nil), r.it.Value()...), nil
	}
	return r.Reader.Get(key)
}

// Close releases the iterator and returns its error.
func (r *seekReader) Close() error {
	if r.it == nil {
		return nil
	}
	return r.it.Close()
}
