package mvcc

import (
	"bytes"
	"fmt"
	"io"

	"github.com/strata-kv/strata/engine"
)

// WriteKeySpaces writes the key-value key spaces of the store in r to w,
// key then value for every entry, in a fixed order, for Maintenance's Hash:
// current values (mc), history (mh), lease attachments (ml) and the
// revision index (mr). Lease records, the store's own bookkeeping and the
// applier's metadata are left out, so members that agree on the data
// agree on what is written.
//
// It writes the copied layout whatever r holds (doc.go, "Where each
// version lives"): a current value without its record's marker, and a
// moved record's version as the history entry it will become. So a member
// whose versions came by replay or restore (copied records) writes the
// same bytes as one that applied the same writes (moved records), and a
// data directory of an earlier release the same as this one's.
func WriteKeySpaces(r engine.Reader, w io.Writer) error {
	moved, err := writeCurrent(r, w)
	if err != nil {
		return err
	}
	if err := writeHistory(r, w, moved); err != nil {
		return err
	}
	for _, p := range []string{prefixLease, prefixRev} {
		if err := writeSpace(r, w, p); err != nil {
			return err
		}
	}
	return nil
}

// writeCurrent writes mc with each record's KeyValue and returns the
// moved records' history entries, in key order.
func writeCurrent(r engine.Reader, w io.Writer) (moved [][2][]byte, err error) {
	it := r.NewIter([]byte(prefixCurrent), prefixEnd(prefixCurrent))
	defer func() {
		if cerr := it.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("write %s: %w", prefixCurrent, cerr)
		}
	}()
	for ok := it.First(); ok; ok = it.Next() {
		c, err := decodeCurrent(it.Value())
		if err != nil {
			return nil, err
		}
		if _, err := w.Write(it.Key()); err != nil {
			return nil, err
		}
		if _, err := w.Write(c.enc); err != nil {
			return nil, err
		}
		if c.moved {
			moved = append(moved, [2][]byte{historyKey(c.kv.Key, c.kv.ModRevision, c.sub), bytes.Clone(c.enc)})
		}
	}
	return moved, nil
}

// writeHistory writes mh with the moved records' entries merged in at
// their place.
func writeHistory(r engine.Reader, w io.Writer, moved [][2][]byte) (err error) {
	it := r.NewIter([]byte(prefixHistory), prefixEnd(prefixHistory))
	defer func() {
		if cerr := it.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("write %s: %w", prefixHistory, cerr)
		}
	}()
	write := func(k, v []byte) error {
		if _, err := w.Write(k); err != nil {
			return err
		}
		_, err := w.Write(v)
		return err
	}
	for ok := it.First(); ok; ok = it.Next() {
		for len(moved) > 0 && bytes.Compare(moved[0][0], it.Key()) < 0 {
			if err := write(moved[0][0], moved[0][1]); err != nil {
				return err
			}
			moved = moved[1:]
		}
		if err := write(it.Key(), it.Value()); err != nil {
			return err
		}
	}
	for _, m := range moved {
		if err := write(m[0], m[1]); err != nil {
			return err
		}
	}
	return nil
}

func writeSpace(r engine.Reader, w io.Writer, prefix string) (err error) {
	it := r.NewIter([]byte(prefix), prefixEnd(prefix))
	defer func() {
		if cerr := it.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("write %s: %w", prefix, cerr)
		}
	}()
	for ok := it.First(); ok; ok = it.Next() {
		if _, err := w.Write(it.Key()); err != nil {
			return err
		}
		if _, err := w.Write(it.Value()); err != nil {
			return err
		}
	}
	return nil
}
