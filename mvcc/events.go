package mvcc

import (
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/strata-kv/strata/engine"
)

// EventQuery asks ScanEvents for the events of a range of revisions.
type EventQuery struct {
	// From and To bound the revisions: events with main revision in
	// (From, To]. To <= 0, or above the snapshot's revision, means the
	// snapshot's current revision.
	From, To int64
	// Match selects events by key and says whether each selected event
	// needs its previous version (prev_kv). nil selects every event,
	// without previous versions. Unselected events cost one revision-index
	// entry each and no history read.
	Match func(key []byte) (selected, prevKV bool)
	// Limit bounds the selected events returned (0: no bound). The scan
	// stops before a revision that would pass it, never inside one, unless
	// that revision is the first: a revision's events are never split.
	Limit int
}

// EventBatch is the answer of ScanEvents.
type EventBatch struct {
	// Events are the selected events in revision order (main, then sub).
	// A deletion's KeyValue holds only the key and, as its mod_revision,
	// the revision of the deletion (as etcd's watch reports it).
	Events []*mvccpb.Event
	// Through is the last revision the scan covered completely: every
	// selected event with revision <= Through is in Events. A caller that
	// continues scans from Through.
	Through int64
	// Rev and CompactRev are the snapshot's current and compact revisions.
	Rev, CompactRev int64
}

// ScanEvents reads, from one engine snapshot, the events of revisions in
// (q.From, q.To]: one scan of the revision index from q.From, and one
// history read per selected event (two with prev_kv). It is safe from any
// goroutine, concurrently with writes and physical compaction.
//
// It fails with ErrCompacted when q.From+1 is below the compact revision
// (etcd's rule for a watch's start revision); the batch still carries Rev
// and CompactRev then. A previous version at a revision below the compact
// revision is not returned (etcd answers prev_kv with a Range at the event's
// revision minus one, which fails there).
func (s *Store) ScanEvents(q EventQuery) (_ EventBatch, err error) {
	v, snap, err := s.snapshotView()
	if err != nil {
		return EventBatch{}, err
	}
	defer snap.Close()
	out := EventBatch{Rev: v.rev, CompactRev: v.compactRev}
	to := q.To
	if to <= 0 || to > v.rev {
		to = v.rev
	}
	out.Through = max(to, q.From)
	if q.From >= to {
		return out, nil
	}
	if q.From+1 < v.compactRev {
		return out, ErrCompacted
	}
	it := snap.NewIter(revKey(q.From+1, 0), revKey(to+1, 0))
	defer func() {
		if cerr := it.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("scan events (%d, %d]: %w", q.From, to, cerr)
			out = EventBatch{}
		}
	}()
	lastMain := q.From
	for ok := it.First(); ok; ok = it.Next() {
		main, sub, perr := parseRevKey(it.Key())
		if perr != nil {
			return EventBatch{}, fmt.Errorf("scan events: %w", perr)
		}
		if main != lastMain {
			if q.Limit > 0 && len(out.Events) >= q.Limit && lastMain > q.From {
				out.Through = lastMain
				return out, nil
			}
			lastMain = main
		}
		tomb, key, perr := parseRevValue(it.Value())
		if perr != nil {
			return EventBatch{}, fmt.Errorf("scan events at %d.%d: %w", main, sub, perr)
		}
		selected, wantPrev := true, false
		if q.Match != nil {
			selected, wantPrev = q.Match(key)
		}
		if !selected {
			continue
		}
		key = append([]byte(nil), key...)
		ev := &mvccpb.Event{}
		if tomb {
			ev.Type = mvccpb.DELETE
			ev.Kv = &mvccpb.KeyValue{Key: key, ModRevision: main}
		} else {
			b, gerr := snap.Get(historyKey(key, main, sub))
			if gerr != nil {
				return EventBatch{}, fmt.Errorf("scan events: history of %q at %d.%d: %w", key, main, sub, gerr)
			}
			if ev.Kv, err = decodeKV(b); err != nil {
				return EventBatch{}, fmt.Errorf("scan events: %q at %d.%d: %w", key, main, sub, err)
			}
		}
		if wantPrev && main-1 >= v.compactRev {
			if ev.PrevKv, err = prevVersion(snap, key, main-1); err != nil {
				return EventBatch{}, err
			}
		}
		out.Events = append(out.Events, ev)
	}
	out.Through = to
	return out, nil
}

// prevVersion returns key's live version at rev, or nil if it had none.
func prevVersion(r engine.Reader, key []byte, rev int64) (*mvccpb.KeyValue, error) {
	v := view{r: r, rev: rev + 1} // rev+1 keeps getAt on the history path
	kv, err := v.getAt(key, rev)
	if err != nil && !errors.Is(err, engine.ErrNotFound) {
		return nil, fmt.Errorf("previous version of %q at %d: %w", key, rev, err)
	}
	return kv, nil
}
