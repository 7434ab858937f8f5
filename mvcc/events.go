package mvcc

import (
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Events returns the changes with main revision in [from, to] (to <= 0: up
// to the current revision), in revision order, for watchers: a put carries
// the new KeyValue, a delete a KeyValue holding only the key and the
// deletion's revision as mod_revision (as etcd's watch sends it). With
// prevKV each event also carries the key's live version at the revision
// before it, as etcd's watch does, unless that revision is compacted.
//
// It stops after limit events (0: no limit) but never inside a revision,
// and returns next, the first revision it did not read (or to+1).
//
// from below the compact revision fails with ErrCompacted, as a watch does
// in etcd; from at the compact revision is answerable because compaction
// keeps every change at that revision. It reads a consistent snapshot and is
// safe from any goroutine.
func (s *Store) Events(from, to int64, limit int, prevKV bool) (events []*mvccpb.Event, next int64, err error) {
	v, snap, err := s.snapshotView()
	if err != nil {
		return nil, 0, err
	}
	defer snap.Close()
	if from < v.compactRev {
		return nil, 0, ErrCompacted
	}
	if to <= 0 || to > v.rev {
		to = v.rev
	}
	if from > to {
		return nil, from, nil
	}
	it := snap.NewIter(revKey(from, 0), revKey(to+1, 0))
	defer func() {
		if cerr := it.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("events from %d: %w", from, cerr)
		}
	}()
	next = to + 1
	last := int64(-1)
	for ok := it.First(); ok; ok = it.Next() {
		main, sub, perr := parseRevKey(it.Key())
		if perr != nil {
			return nil, 0, perr
		}
		if limit > 0 && len(events) >= limit && main != last {
			next = main
			break
		}
		last = main
		tomb, key, perr := parseRevValue(it.Value())
		if perr != nil {
			return nil, 0, perr
		}
		key = append([]byte(nil), key...)
		ev := &mvccpb.Event{Type: mvccpb.Event_PUT}
		if tomb {
			ev.Type = mvccpb.Event_DELETE
			ev.Kv = &mvccpb.KeyValue{Key: key, ModRevision: main}
		} else {
			b, rerr := readVersionBytes(snap, key, main, sub)
			if rerr != nil {
				return nil, 0, fmt.Errorf("events: %w", rerr)
			}
			if ev.Kv, err = decodeKV(b); err != nil {
				return nil, 0, err
			}
		}
		// etcd's watch reads prev_kv with a Range at the event's revision
		// minus one, which fails below the compact revision; create events
		// (version 1) have none.
		if prevKV && main-1 >= v.compactRev && (tomb || ev.Kv.Version > 1) {
			if ev.PrevKv, err = v.getAtHistory(key, main-1); err != nil {
				return nil, 0, err
			}
		}
		events = append(events, ev)
	}
	return events, next, nil
}
