package pebble

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/strata-kv/strata/internal/keyfilter"
)

// Reads that skip the memtables
//
// Every Put in mvcc reads its key's previous version inside the apply
// batch. With the WAL off the memtables hold only what was committed since
// Open, and a profile of a bulk load showed most of that read spent in the
// memtable's skiplist: a seek through 32 MiB of randomly placed nodes, a
// cache miss per level, mostly for keys the memtables do not hold (a new
// key, or one last written long ago). memKeys is a bloom filter over every
// key the memtables may hold; a batch asks it first, and a key it has never
// seen is read from the flushed tables alone (pebble's
// IterOptions.OnlyReadGuaranteedDurable leaves the memtables out).
//
// A filter is rotated when it is full, without forcing a flush: the old
// one is kept until every memtable that existed at the rotation has been
// flushed, which memKeys learns by counting the memtables Pebble reports
// flushed (FlushEnd's Input) against the queue's length at the rotation.
// Pebble flushes its queue oldest first and signals FlushEnd after the new
// tables are visible to new iterators.
//
// Invariants, kept by memKeys under mu:
//  1. While valid, every key of every batch committed to a memtable that has
//     not been flushed is in cur or in old. Keys are added in commit,
//     before the batch is applied; a batch that then fails to commit only
//     leaves extra keys, which cost a read through the memtables.
//  2. old is dropped only once flushed() has reached oldFlushedAt: then
//     every memtable of the queue at the rotation, so every key old holds,
//     is in a flushed table. A reader drops it only before building the
//     iterator that relies on it, so that iterator sees those tables.
//  3. valid is false whenever the memtables may hold what the filters do not
//     show, for any key: an ingest queued as a flushable, Pebble's own WAL
//     replayed at Open, a range key, or more range deletions at once than
//     maxDeletedSpans. It turns true again once flushed() reaches validAt,
//     taken after the cause, when every memtable that could hold it is
//     flushed.
//  4. A range deletion covers keys it does not name, but only inside its
//     span: every range deletion of a batch committed to a memtable that has
//     not been flushed is in spans, added in addBatch before the batch is
//     applied, and a key inside one is never placed in the flushed tables
//     alone. A span is dropped once flushed() reaches its flushedAt,
//     taken after its commit. Reads of keys outside every span still skip
//     the memtables: the log compactor's ForgetIndexRevisions deletes a
//     range of index rows ("mi") at every log truncation, several times per
//     memtable under a load, and before spans each one switched the filter
//     off for every key until the next flush.
//
// Concurrency: mu guards everything; commits come from one goroutine (the
// applier), reads of the decision from the same, so mu is uncontended.
type memKeys struct {
	mu   sync.Mutex
	seed maphash.Seed

	// queueLen is the number of memtables (mutable, immutable and
	// flushable) in Pebble's queue; flushed is how many Pebble has
	// reported flushed since Open.
	queueLen func() uint64
	flushed  func() uint64

	capacity     int               // keys a filter takes before rotation
	cur          *keyfilter.Filter // keys committed since the last rotation
	old          *keyfilter.Filter // keys committed before it; nil once flushed
	oldFlushedAt uint64            // flushed() at which old's memtables are all flushed

	valid   bool
	validAt uint64 // while !valid: flushed() at which valid turns true
	// rangeKeyed: a batch being committed holds a range key; once it is in
	// a memtable, valid turns false (invariant 3). strata writes none today.
	rangeKeyed bool

	spans []deletedSpan // range deletions the memtables may hold (invariant 4)
}

// deletedSpan is a range deletion [start, end) that a memtable not yet
// flushed may hold.
type deletedSpan struct {
	start, end []byte
	// flushedAt is the flushed() count at which every memtable that may
	// hold it is flushed: notCommitted until its batch's commit returns.
	flushedAt uint64
}

// notCommitted is the flushedAt of a span whose batch is being committed.
const notCommitted = ^uint64(0)

// maxDeletedSpans bounds the spans a read compares its key against; past
// it the filter is switched off until the memtables are flushed (invariant
// 3). A memtable sees one span per log truncation, a few per 32 MiB.
const maxDeletedSpans = 64

// memKeysCapacity is how many keys a filter takes before it is rotated: at
// 10 bits a key, 1.3 MB each, two at most. A 32 MiB memtable holds about
// 100,000 puts of small values, and a put adds two keys (its record and
// the applied index, at most).
const memKeysCapacity = 1 << 20

// newMemKeys returns the filter of an engine just opened, whose memtables
// queue holds queueLen() memtables: complete only if that is the empty
// mutable one. capacity 0 means memKeysCapacity.
func newMemKeys(capacity int, queueLen, flushed func() uint64) *memKeys {
	if capacity <= 0 {
		capacity = memKeysCapacity
	}
	m := &memKeys{seed: maphash.MakeSeed(), queueLen: queueLen, flushed: flushed, capacity: capacity, cur: keyfilter.New(capacity)}
	if q := queueLen(); q == 1 {
		m.valid = true
	} else {
		m.validAt = m.allFlushedAt()
	}
	return m
}

func (m *memKeys) hash(key []byte) uint64 { return maphash.Bytes(m.seed, key) }

// allFlushedAt is the flushed() count at which every memtable in the
// queue now is flushed. The queue is read first: a flush ending between
// the two reads then makes the answer later than needed, never earlier.
func (m *memKeys) allFlushedAt() uint64 {
	q := m.queueLen()
	return m.flushed() + q
}

// addBatch records every key of a batch about to be committed (invariant
// 1), every range deletion's span (4), and notes a range key (3).
func (m *memKeys) addBatch(pb *pebble.Batch) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := pb.Reader()
	for {
		kind, key, value, ok, err := r.Next()
		if err != nil {
			return fmt.Errorf("read batch keys: %w", err)
		}
		if !ok {
			return nil
		}
		switch kind {
		case pebble.InternalKeyKindRangeDelete:
			// The batch's buffer is reused after the commit: the span
			// keeps copies. A range deletion's value is its end key.
			m.spans = append(m.spans, deletedSpan{
				start:     append([]byte(nil), key...),
				end:       append([]byte(nil), value...),
				flushedAt: notCommitted,
			})
		case pebble.InternalKeyKindRangeKeySet, pebble.InternalKeyKindRangeKeyUnset,
			pebble.InternalKeyKindRangeKeyDelete:
			m.rangeKeyed = true
		default:
			m.cur.Add(m.hash(key))
		}
	}
}

// committed runs after each commit: it dates the batch's range deletions
// (or turns valid off after a range key or too many spans), rotates a full
// filter, and drops a flushed one.
//
// Most commits need no allFlushedAt: it is read only when a span waits for
// its date, a cause turns valid off, or the filter rotates. Reading it asks
// Pebble for its whole Metrics (3.2 µs, 27 allocations and 3.5 KB on the
// 2-core AMD VM, under the DB's mutex), once per commit before.
func (m *memKeys) committed() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.retireLocked()
	flushedAt := notCommitted // read at most once, after the commit
	at := func() uint64 {
		if flushedAt == notCommitted {
			flushedAt = m.allFlushedAt()
		}
		return flushedAt
	}
	for i := range m.spans {
		if m.spans[i].flushedAt == notCommitted {
			m.spans[i].flushedAt = at()
		}
	}
	if m.rangeKeyed || len(m.spans) > maxDeletedSpans {
		// Every span is older than flushedAt: validAt covers them all.
		m.rangeKeyed = false
		m.spans = nil
		m.valid = false
		m.validAt = at()
	}
	if m.old == nil && m.cur.Count() >= m.capacity {
		m.old, m.oldFlushedAt = m.cur, at()
		m.cur = keyfilter.New(m.capacity)
	}
}

// ingesting turns valid off before an ingest, for good: ingested marks
// when it may turn back on.
func (m *memKeys) ingesting() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.valid = false
	m.validAt = ^uint64(0)
}

// ingested runs after an ingest, whose table may wait in the queue as a
// flushable until it is flushed.
func (m *memKeys) ingested() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.validAt = m.allFlushedAt()
}

// retireLocked drops old once its memtables are flushed (invariant 2),
// turns valid back on when the memtables behind its cause are (3), and
// drops the spans whose memtables are (4).
func (m *memKeys) retireLocked() {
	f := m.flushed()
	if m.old != nil && f >= m.oldFlushedAt {
		m.old = nil
	}
	if !m.valid && f >= m.validAt {
		m.valid = true
	}
	kept := m.spans[:0]
	for _, sp := range m.spans {
		if f < sp.flushedAt {
			kept = append(kept, sp)
		}
	}
	clear(m.spans[len(kept):])
	m.spans = kept
}

// keyPlace is what memKeys can tell of where a key's newest version is.
type keyPlace int

const (
	// placeUnknown: the filter is off (invariant 3), or the key is inside a
	// range deletion a memtable may hold (4); every level must be read.
	placeUnknown keyPlace = iota
	// placeMemtable: a filter has seen the key, so a memtable probably
	// holds its newest version (1% of keys never seen pass too, and a key
	// stays in its filter after its memtable is flushed).
	placeMemtable
	// placeFlushed: no memtable holds the key and no range deletion in one
	// covers it, so the flushed tables alone give its latest committed
	// value.
	placeFlushed
)

// place says where key, whose hash is h, is to be read from. retire says
// whether the caller is about to build its flushed-tables iterator, which
// is when old and spans may be dropped (invariants 2, 4).
func (m *memKeys) place(key []byte, h uint64, retire bool) keyPlace {
	m.mu.Lock()
	defer m.mu.Unlock()
	if retire {
		m.retireLocked()
	}
	if !m.valid {
		return placeUnknown
	}
	if m.cur.MayContain(h) || (m.old != nil && m.old.MayContain(h)) {
		return placeMemtable
	}
	for _, sp := range m.spans {
		if bytes.Compare(key, sp.start) >= 0 && bytes.Compare(key, sp.end) < 0 {
			return placeUnknown
		}
	}
	return placeFlushed
}
