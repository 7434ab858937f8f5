package mvcc

import (
	"errors"
	"fmt"

	"github.com/strata-kv/strata/engine"
)

// Reading a store's state from a consistent engine view (an
// engine.Snapshot, or a pebble export view's Reader), for writing it in
// another store's format: etcd's snapshot file (package etcddb). Every
// function here reads only r, so a caller that reads the auth store's and
// the applier's records from the same view gets one instant of the state
// machine.

// RevisionState is the store's revision counter and compact revision.
type RevisionState struct {
	// Rev is the current revision; CompactRev the revision compaction last
	// asked for (-1: never compacted).
	Rev, CompactRev int64
}

// ReadRevisionState reads the revision state r holds.
func ReadRevisionState(r engine.Reader) (RevisionState, error) {
	b, err := r.Get(metaState)
	if errors.Is(err, engine.ErrNotFound) {
		return RevisionState{Rev: 1, CompactRev: -1}, nil
	}
	if err != nil {
		return RevisionState{}, fmt.Errorf("read revision state: %w", err)
	}
	st, err := decodeState(b)
	if err != nil {
		return RevisionState{}, err
	}
	return RevisionState{Rev: st.rev, CompactRev: st.compactRev}, nil
}

// ForEachVersion calls fn with every key version r holds, in revision
// order: each put with its KeyValue, each deletion with KV nil. After a
// compaction these are etcd's kept versions: every version above the
// compact revision, and each key's newest version at or below it unless
// that is a deletion (physical compaction may still be removing the rest).
// The KeyChange and its slices are fn's to keep.
func ForEachVersion(r engine.Reader, fn func(c KeyChange) error) (err error) {
	it := r.NewIter([]byte(prefixRev), prefixEnd(prefixRev))
	defer func() {
		if cerr := it.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("read versions: %w", cerr)
		}
	}()
	for valid := it.First(); valid; valid = it.Next() {
		c, err := readVersion(r, it.Key(), it.Value())
		if err != nil {
			return err
		}
		if err := fn(c); err != nil {
			return err
		}
	}
	return nil
}

// readVersion reads the version a revision-index row (key revKey, value
// revValue) names: its key and, for a put, its history entry.
func readVersion(r engine.Reader, revK, revV []byte) (KeyChange, error) {
	main, sub, err := parseRevKey(revK)
	if err != nil {
		return KeyChange{}, err
	}
	tomb, key, err := parseRevValue(revV)
	if err != nil {
		return KeyChange{}, err
	}
	c := KeyChange{Main: main, Sub: sub, Key: append([]byte(nil), key...)}
	if tomb {
		return c, nil
	}
	raw, err := readVersionBytes(r, key, main, sub)
	if err != nil {
		return KeyChange{}, err
	}
	if c.KV, err = decodeKV(raw); err != nil {
		return KeyChange{}, err
	}
	return c, nil
}

// readVersionBytes returns the encoded KeyValue of key's put at main.sub,
// which a revision-index row names: its moved current record if that is the
// version (a version written by a Put stays there until it is replaced),
// else its history entry (doc.go, "Where each version lives").
func readVersionBytes(r engine.Reader, key []byte, main, sub int64) ([]byte, error) {
	b, err := r.Get(currentKey(key))
	switch {
	case err == nil:
		c, err := decodeCurrent(b)
		if err != nil {
			return nil, err
		}
		if c.kv.ModRevision == main && (!c.moved || c.sub == sub) {
			return c.enc, nil
		}
	case !errors.Is(err, engine.ErrNotFound):
		return nil, fmt.Errorf("read revision %d.%d of %q: %w", main, sub, key, err)
	}
	raw, err := r.Get(historyKey(key, main, sub))
	if errors.Is(err, engine.ErrNotFound) {
		// The row and the version are removed in one batch: a view never
		// holds one without the other.
		return nil, fmt.Errorf("%w: revision %d.%d of %q has no version", errCorrupt, main, sub, key)
	}
	if err != nil {
		return nil, fmt.Errorf("read revision %d.%d of %q: %w", main, sub, key, err)
	}
	return raw, nil
}

// ReadLeases returns every lease record r holds, in the order of the IDs'
// bytes.
func ReadLeases(r engine.Reader) ([]LeaseRecord, error) {
	it := r.NewIter([]byte(prefixLeaseRecord), prefixEnd(prefixLeaseRecord))
	var out []LeaseRecord
	for ok := it.First(); ok; ok = it.Next() {
		rec, err := decodeLeaseRecord(it.Key(), it.Value())
		if err != nil {
			_ = it.Close()
			return nil, fmt.Errorf("read lease records: %w", err)
		}
		out = append(out, rec)
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("read lease records: %w", err)
	}
	return out, nil
}

// MetaKey is the engine key under which SetMeta stores name.
func MetaKey(name string) []byte { return []byte(prefixUser + name) }

// ReadMeta returns the value SetMeta stored under name in r, nil if none.
func ReadMeta(r engine.Reader, name string) ([]byte, error) {
	b, err := r.Get([]byte(prefixUser + name))
	if errors.Is(err, engine.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read meta %q: %w", name, err)
	}
	return b, nil
}
