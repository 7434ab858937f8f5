package mvcc

import (
	"fmt"
	"hash/maphash"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/internal/keyfilter"
)

// The filter of current keys
//
// Every Put reads its key's previous version before it writes (put in
// write.go): the new version's create_revision and version come from it,
// and a moved record must move to history. For a key the store does not
// hold, the read finds nothing, and finding nothing in an LSM means looking
// in every level: a table iterator opened and a bloom filter probed in each.
// When the data grows by new keys (a bulk load, a store that keeps adding
// objects), that read is the cost that grows fastest with the data
// (docs/bench/grow-profile-20261129/), and a load of 5×10^6 new keys ran
// 1.2-1.4× as fast with the read left out (docs/bench/performance.md, "The
// filter of current keys").
//
// currentKeys is an in-memory bloom filter (internal/keyfilter, growing)
// over every key that may have a current record. A write batch's read of a
// key the filter has never seen is answered "no such key" without touching
// the engine. Open never scans. The build waits for StartKeyFilter, which
// the member calls once its start-up replay is done, and then for the next
// write of a current record: it reads every current key, a core's work for
// about a second per 10^6 keys, and on two cores it slowed a restart at
// 5×10^6 keys from 0.35-0.38 s to 0.51-0.57 s when it ran beside the
// replay, and a restart at 10^6 keys by about 45 ms when it began right
// after it. A store that takes no writes needs no filter. A goroutine
// then builds the filter from a snapshot; until it is done every read goes
// to the engine as before.
//
// Invariants, kept by currentKeys under mu and by the callers named:
//  1. While valid, every key with a current record in the engine, or in a
//     write batch that may commit, is in keys. Every writer of a current
//     record adds the key before it writes the record (WriteBatch.put,
//     SetPreparedKeyState and CommitWithKeyStates; Replace is the only
//     other way records arrive, see 2). The build adds every key with a
//     current record in a snapshot that beginCurrentKeys takes under wmu
//     right after begin, so a record committed after the snapshot was
//     added by its writer (begin had started the new filter), and one
//     committed before is in the snapshot.
//  2. Replace installs a whole new engine content under wmu; it calls
//     reset first, which turns valid off and moves epoch, so a build begun
//     before (of the old content) can never turn valid on. A new build
//     starts after the install.
//  3. Keys are never removed: a deleted key stays in keys, a false positive
//     that costs one read, as do the ~1-3% of keys never added that the
//     filter lets through, and the keys of a batch that did not commit.
//
// Only reads through an open write batch consult the filter (view.keys is
// nil elsewhere): a snapshot taken before the build began could hold a
// key deleted before it, which keys never saw.
//
// Concurrency: mu guards everything. The applier adds and asks; the build
// goroutine adds the keys it scans; Replace resets.
type currentKeys struct {
	mu    sync.Mutex
	seed  maphash.Seed
	keys  *keyfilter.Growing
	valid bool
	// epoch counts begin and reset calls: a build finishes (turns valid on)
	// only if no other began or reset since its own begin (invariant 2).
	epoch uint64
	// nextAdd, while not nil, is closed and cleared by the next add: the
	// first build waits for it (StartKeyFilter).
	nextAdd chan struct{}
}

// currentKeysFirstCapacity is the capacity of a build's first filter; the
// filter doubles from there (80 KiB; 4.1 MB at 10^6 keys, 19.9 MB at 5×10^6,
// about 41 MB at 10^7).
const currentKeysFirstCapacity = 1 << 16

func newCurrentKeys() *currentKeys {
	return &currentKeys{seed: maphash.MakeSeed(), keys: keyfilter.NewGrowing(currentKeysFirstCapacity)}
}

// add records key, which is about to get a current record (invariant 1).
func (c *currentKeys) add(key []byte) {
	h := maphash.Bytes(c.seed, key)
	c.mu.Lock()
	c.keys.Add(h)
	if c.nextAdd != nil {
		close(c.nextAdd)
		c.nextAdd = nil
	}
	c.mu.Unlock()
}

// awaitAdd returns a channel that the next add closes.
func (c *currentKeys) awaitAdd() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nextAdd == nil {
		c.nextAdd = make(chan struct{})
	}
	return c.nextAdd
}

// addHashes records keys the build scanned, by hash, if the build's epoch
// is still the filter's; it reports whether it was.
func (c *currentKeys) addHashes(epoch uint64, hs []uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.epoch != epoch {
		return false
	}
	for _, h := range hs {
		c.keys.Add(h)
	}
	return true
}

// mayHold reports whether key may have a current record: false only when
// the filter is valid and has never seen key.
func (c *currentKeys) mayHold(key []byte) bool {
	h := maphash.Bytes(c.seed, key)
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.valid || c.keys.MayContain(h)
}

// begin starts a build: a new empty filter, not valid, that takes every
// add from now on. It returns the build's epoch. Call it under wmu.
func (c *currentKeys) begin() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.keys = keyfilter.NewGrowing(currentKeysFirstCapacity)
	c.valid = false
	c.epoch++
	return c.epoch
}

// finish turns the filter valid if epoch's build is still the latest.
func (c *currentKeys) finish(epoch uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.epoch != epoch {
		return false
	}
	c.valid = true
	return true
}

// reset turns the filter off before the engine's content is replaced
// (invariant 2). Call it under wmu.
func (c *currentKeys) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.valid = false
	c.epoch++
	c.keys = keyfilter.NewGrowing(currentKeysFirstCapacity)
}

// stats returns what the filter holds, for the build's log line.
func (c *currentKeys) stats() (keys, bytes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.keys.Count(), c.keys.Bytes()
}

// currentKeysScanChunk is how many scanned keys the build hashes before it
// takes the filter's lock to add them, and checks whether to stop.
const currentKeysScanChunk = 4096

// buildCurrentKeys builds the filter of current keys from a snapshot of
// the store (invariant 1). It returns early, with the filter still off,
// when stop closes or Replace resets the filter meanwhile.
func (s *Store) buildCurrentKeys(stop <-chan struct{}) error {
	start := time.Now()
	epoch, snap := s.beginCurrentKeys()
	defer snap.Close()
	built, err := s.scanCurrentKeys(epoch, snap, stop)
	if built {
		n, size := s.keys.stats()
		s.lg.Info("filter of current keys built", zap.Int("keys", n), zap.Int("bytes", size),
			zap.Duration("took", time.Since(start)))
	}
	return err
}

// beginCurrentKeys starts a build: under wmu, so that no write batch is
// open, a new filter starts taking adds and the snapshot it is built from
// is taken (invariant 1).
func (s *Store) beginCurrentKeys() (epoch uint64, snap engine.Snapshot) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	epoch = s.keys.begin()
	return epoch, s.e.NewSnapshot()
}

// scanCurrentKeys adds the key of every current record in snap to the
// filter, and turns it valid if epoch is still its build; built says
// whether it did.
func (s *Store) scanCurrentKeys(epoch uint64, snap engine.Snapshot, stop <-chan struct{}) (built bool, err error) {
	it := snap.NewIter([]byte(prefixCurrent), prefixEnd(prefixCurrent))
	hs := make([]uint64, 0, currentKeysScanChunk)
	for ok := it.First(); ok; ok = it.Next() {
		hs = append(hs, maphash.Bytes(s.keys.seed, it.Key()[len(prefixCurrent):]))
		if len(hs) < currentKeysScanChunk {
			continue
		}
		select {
		case <-stop:
			return false, it.Close()
		default:
		}
		if !s.keys.addHashes(epoch, hs) {
			return false, it.Close()
		}
		hs = hs[:0]
	}
	if err := it.Close(); err != nil {
		return false, fmt.Errorf("build filter of current keys: %w", err)
	}
	return s.keys.addHashes(epoch, hs) && s.keys.finish(epoch), nil
}

// StartKeyFilter starts the goroutine that builds the filter of current
// keys at the next put (or Replace), and again after each Replace, until
// Close. Call it after Start, once the start-up replay is done (the package
// comment of currentkeys.go); until the build is done, and without it,
// every put reads its key's previous version.
func (s *Store) StartKeyFilter() {
	if !s.started || s.keysStopped != nil {
		return
	}
	s.keysStopped = make(chan struct{})
	go s.currentKeysLoop(s.keys.awaitAdd(), s.stop, s.keysStopped)
}

// currentKeysLoop builds the filter once first closes (or Replace asks),
// and after each Replace, until stop closes.
func (s *Store) currentKeysLoop(first <-chan struct{}, stop <-chan struct{}, stopped chan<- struct{}) {
	defer close(stopped)
	select {
	case <-stop:
		return
	case <-first:
	case <-s.rebuildKeys:
	}
	for {
		if err := s.buildCurrentKeys(stop); err != nil {
			// The filter stays off: every Put reads, as without it.
			s.lg.Warn("filter of current keys not built", zap.Error(err))
		}
		select {
		case <-stop:
			return
		case <-s.rebuildKeys:
		}
	}
}
