package hybridlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/RaduBerinde/btreemap"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/engine/appendlog"
	"github.com/strata-kv/strata/internal/failpoint"
)

// StableDir is the stable region's directory inside the engine's.
const StableDir = "stable"

// DefaultMemBytes is the size of the in-memory records at which the commit
// seals them and the flusher writes them out, when Options.MemBytes is 0.
const DefaultMemBytes = 64 << 20

// evictStep is how many records a flush evicts per hold of Engine.mu, so
// that commits and views wait for one step, not for the region.
const evictStep = 4096

// recOverhead is what a record costs in memory beyond its key and value
// (the record, its map and tree entries), for the MemBytes accounting.
const recOverhead = 96

// Options configure Open.
type Options struct {
	// MemBytes: see DefaultMemBytes.
	MemBytes int64
	// Stable configures the stable region (its Logger and SyncCommits are
	// set from these options).
	Stable appendlog.Options
	// SyncCommits flushes (and so syncs) every Commit before it returns:
	// the double-logging baseline. Off by default.
	SyncCommits bool
	// Logger receives the engine's warnings; nil means zap.NewNop().
	Logger *zap.Logger

	// afterFlushWrite, if set (tests only), runs in every flush once its
	// region is in the stable region, before the records are evicted, with
	// flushMu held.
	afterFlushWrite func()
}

// rec is one log record in memory. key and addr never change; value and
// del change in place only while addr >= ro (the mutable region), under
// Engine.mu.
type rec struct {
	key   []byte
	value []byte
	del   bool
	addr  uint64
}

func (r *rec) size() int64 { return int64(len(r.key)+len(r.value)) + recOverhead }

// tree is the ordered index over the in-memory records.
type tree = btreemap.BTreeMap[[]byte, *rec]

func newTree() *tree { return btreemap.New[[]byte, *rec](32, bytes.Compare) }

// Engine is engine.Engine on a HybridLog (see the package comment).
//
// Invariants:
//  1. memStart <= ro <= tail; recs[i] is the record at address
//     memStart+i. A flush's region [memStart, to) leaves memory when the
//     flush moves memStart to to, after evicting its records (4).
//  2. A record changes only while its address is >= ro, and only under mu
//     by the committing applier; ro moves only under mu, between batches
//     (a commit applies its whole batch under one hold of mu), and records
//     roApplied, the applied index there.
//  3. index[k] and tree[k] are the latest in-memory record of k, if k has
//     one a flush has not evicted; otherwise k's state is the stable
//     region's.
//  4. The stable region receives the records [memStart, ro) in address
//     order as one batch at roApplied, under flushMu; the records are
//     evicted (removed from index and tree where they are the latest)
//     only after that commit returned, evictStep records per hold of mu.
//     So the stable region always holds the state at a seal point, and a
//     key missing from memory is there. A flush reads its region and
//     increments stableGen in one hold of mu; an install sets installing
//     and increments stableGen before it changes the stable region, and
//     clears installing and increments stableGen again in the hold of mu
//     that empties memory.
//  5. A view takes the tree under mu, then the stable region's snapshot
//     with no lock of this engine held, and keeps the pair only if
//     stableGen did not change in between and no install was under way;
//     otherwise it tries again, and after maxViewTries takes both under
//     flushMu, which flushes and installs hold. So no flush read its
//     region after the tree was taken and committed it before the
//     snapshot (every record the snapshot holds was in memory when the
//     tree was taken, so the tree holds it or a newer record of its key),
//     and the tree (newest first) covers everything the snapshot lacks
//     (a record evicted before the tree was committed before it, and the
//     snapshot comes later). No view waits for a flush's write to the
//     stable region. A view for another goroutine seals first (ro = tail),
//     so none of its records changes.
//  6. DurableIndex is the stable region's: a batch <= it is in synced
//     stable files (engine/appendlog's invariant 4); Flush seals and
//     flushes before syncing, so it reaches the applied index seen at the
//     call.
//
// Concurrency: writeMu serialises commits; flushMu serialises writes to
// the stable region and installs (views take it only after maxViewTries,
// 5); mu guards the regions, the indexes, the records and stableGen. Lock
// order: flushMu, writeMu, mu; no lock of this engine is held while a
// commit or a view waits for the stable region's locks, except flushMu.
// Open starts the flusher; Close stops it.
type Engine struct {
	dir    string
	opts   Options
	logger *zap.Logger
	stable *appendlog.Engine

	writeMu sync.Mutex
	flushMu sync.Mutex

	mu struct {
		sync.RWMutex
		index     map[string]*rec
		indexPeak int // the most keys index held since it was last built
		tree      *tree
		treeClone *tree // read-only clone for views; nil once tree changed
		recs      []*rec
		memStart  uint64
		ro        uint64
		tail      uint64
		roApplied uint64
		memBytes  int64 // of the records in memory
		// stableGen and installing: invariants 4 and 5.
		stableGen  uint64
		installing bool
		err        error // sticky: a failed flush stops the engine
		closed     bool
		cond       sync.Cond // signalled when a flush evicts or err is set
	}

	applied atomic.Uint64

	kick      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

var _ engine.Engine = (*Engine)(nil)

// Open opens (creating if needed) the engine in dir: the stable region
// recovers its files (engine/appendlog), memory starts empty.
func Open(dir string, opts Options) (*Engine, error) {
	if opts.MemBytes <= 0 {
		opts.MemBytes = DefaultMemBytes
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	sopts := opts.Stable
	sopts.Logger = opts.Logger
	sopts.SyncCommits = false
	stable, err := appendlog.Open(filepath.Join(dir, StableDir), sopts)
	if err != nil {
		return nil, fmt.Errorf("open hybridlog engine in %s: %w", dir, err)
	}
	e := &Engine{dir: dir, opts: opts, logger: opts.Logger, stable: stable,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	e.mu.index = map[string]*rec{}
	e.mu.tree = newTree()
	e.mu.cond.L = &e.mu.RWMutex
	a := stable.AppliedIndex()
	e.applied.Store(a)
	e.mu.roApplied = a
	go e.flusher()
	return e, nil
}

// AppliedIndex implements engine.Engine.
func (e *Engine) AppliedIndex() uint64 { return e.applied.Load() }

// DurableIndex implements engine.Engine: the stable region's (invariant 6).
func (e *Engine) DurableIndex() uint64 { return e.stable.DurableIndex() }

// entry is one write of a batch: a value or a deletion.
type entry struct {
	value []byte
	del   bool
}

// commit applies a batch's own writes (in key order), its tails' (in
// order) and the applied index to the memory regions, in place where the
// key's latest record is mutable (invariant 2).
func (e *Engine) commit(own *layer, tails []*writeOnlyBatch, appliedIndex uint64) error {
	e.writeMu.Lock()
	err := e.commitLocked(own, tails, appliedIndex)
	e.writeMu.Unlock()
	if err != nil {
		return fmt.Errorf("commit batch at index %d: %w", appliedIndex, err)
	}
	if e.opts.SyncCommits {
		return e.Flush()
	}
	return nil
}

// REQUIRES: e.writeMu held.
func (e *Engine) commitLocked(own *layer, tails []*writeOnlyBatch, appliedIndex uint64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.closed {
		return errEngineClosed
	}
	if e.mu.err != nil {
		return e.mu.err
	}
	if cur := e.applied.Load(); appliedIndex < cur {
		return fmt.Errorf("applied index %d below the engine's %d", appliedIndex, cur)
	}
	// A write stall: the flusher is more than MemBytes behind.
	for e.mu.memBytes >= 2*e.opts.MemBytes && e.mu.err == nil && !e.mu.closed {
		if e.mu.ro < e.mu.tail {
			e.sealLocked()
		}
		select {
		case e.kick <- struct{}{}:
		default:
		}
		e.mu.cond.Wait()
	}
	if e.mu.closed {
		return errEngineClosed
	}
	if e.mu.err != nil {
		return e.mu.err
	}
	if own != nil {
		own.AscendFunc(btreemap.Min[[]byte](), btreemap.Max[[]byte](), func(k []byte, en entry) bool {
			e.writeLocked(k, en.value, en.del)
			return true
		})
	}
	for _, t := range tails {
		for _, o := range t.ops {
			e.writeLocked(o.key, o.value, o.del)
		}
	}
	e.writeLocked(engine.AppliedIndexKey, binary.BigEndian.AppendUint64(nil, appliedIndex), false)
	e.applied.Store(appliedIndex)
	if e.mu.memBytes >= e.opts.MemBytes && e.mu.ro < e.mu.tail {
		e.sealLocked()
		select {
		case e.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// writeLocked writes one key: in place if its latest record is mutable,
// else as a new record at the tail. key and value are owned by the engine
// from here on. REQUIRES: e.mu held (write).
func (e *Engine) writeLocked(key, value []byte, del bool) {
	if del {
		value = nil
	}
	if r := e.mu.index[string(key)]; r != nil && r.addr >= e.mu.ro {
		e.mu.memBytes += int64(len(value) - len(r.value))
		r.value, r.del = value, del
		return
	}
	r := &rec{key: key, value: value, del: del, addr: e.mu.tail}
	e.mu.tail++
	e.mu.recs = append(e.mu.recs, r)
	e.mu.index[string(key)] = r
	e.mu.indexPeak = max(e.mu.indexPeak, len(e.mu.index))
	e.mu.tree.ReplaceOrInsert(key, r)
	e.mu.treeClone = nil
	e.mu.memBytes += r.size()
}

// sealLocked makes every record read-only (ro = tail), between batches.
// REQUIRES: e.mu held (write).
func (e *Engine) sealLocked() {
	e.mu.ro = e.mu.tail
	e.mu.roApplied = e.applied.Load()
}

// flushPending writes the read-only records to the stable region as one
// batch and evicts them (invariant 4).
func (e *Engine) flushPending() error {
	e.flushMu.Lock()
	defer e.flushMu.Unlock()
	return e.flushPendingLocked()
}

// REQUIRES: e.flushMu held.
func (e *Engine) flushPendingLocked() error {
	e.mu.Lock()
	if err := e.mu.err; err != nil {
		e.mu.Unlock()
		return err
	}
	from, to, applied := e.mu.memStart, e.mu.ro, e.mu.roApplied
	region := e.mu.recs[:to-from]
	if from == to {
		e.mu.Unlock()
		return nil
	}
	e.mu.stableGen++ // invariant 4: views taken before this one retry
	e.mu.Unlock()
	// The records below ro no longer change (invariant 2).
	w := e.stable.NewWriteOnlyBatch()
	for _, r := range region {
		var err error
		if r.del {
			err = w.Delete(r.key)
		} else {
			err = w.Set(r.key, r.value)
		}
		if err != nil {
			_ = w.Close()
			return e.fail(fmt.Errorf("flush records [%d, %d): %w", from, to, err))
		}
	}
	b := e.stable.NewBatch()
	if err := b.CommitWith(applied, []engine.WriteOnlyBatch{w}); err != nil {
		_ = b.Close()
		return e.fail(fmt.Errorf("flush records [%d, %d) at index %d: %w", from, to, applied, err))
	}
	if e.opts.afterFlushWrite != nil {
		e.opts.afterFlushWrite()
	}
	// Evict in steps (invariant 4): a reader that misses an evicted key
	// finds it in the stable region, which holds the region now.
	for i := 0; i < len(region); i += evictStep {
		e.mu.Lock()
		for _, r := range region[i:min(i+evictStep, len(region))] {
			if e.mu.index[string(r.key)] == r {
				delete(e.mu.index, string(r.key))
				e.mu.tree.Delete(r.key)
				e.mu.treeClone = nil
			}
			e.mu.memBytes -= r.size()
		}
		e.mu.cond.Broadcast()
		e.mu.Unlock()
	}
	e.mu.Lock()
	if n := len(e.mu.index); n*4 < e.mu.indexPeak {
		// Go maps do not shrink: rebuild one that lost most of its keys.
		index := make(map[string]*rec, n)
		maps.Copy(index, e.mu.index)
		e.mu.index, e.mu.indexPeak = index, n
	}
	rest := e.mu.recs[to-from:]
	e.mu.recs = append(make([]*rec, 0, len(rest)+16), rest...) // drop the evicted records
	e.mu.memStart = to
	e.mu.cond.Broadcast()
	e.mu.Unlock()
	return nil
}

// fail makes err sticky: the engine no longer knows what the stable
// region holds.
func (e *Engine) fail(err error) error {
	e.mu.Lock()
	if e.mu.err == nil {
		e.mu.err = err
	}
	e.mu.cond.Broadcast()
	e.mu.Unlock()
	e.logger.Error("hybridlog engine flush failed; it refuses further commits", zap.Error(err))
	return err
}

// flusher flushes when a commit seals.
func (e *Engine) flusher() {
	defer close(e.done)
	for {
		select {
		case <-e.stop:
			return
		case <-e.kick:
			_ = e.flushPending() // sticky; logged
		}
	}
}

// Flush implements engine.Engine: seal, flush, and sync the stable
// region (invariant 6).
func (e *Engine) Flush() error {
	e.mu.Lock()
	if e.mu.closed {
		e.mu.Unlock()
		return fmt.Errorf("flush hybridlog engine in %s: %w", e.dir, errEngineClosed)
	}
	e.sealLocked()
	e.mu.Unlock()
	failpoint.Hit("engine/before-flush")
	if err := e.flushPending(); err != nil {
		return fmt.Errorf("flush hybridlog engine in %s: %w", e.dir, err)
	}
	if err := e.stable.Flush(); err != nil {
		return fmt.Errorf("flush hybridlog engine in %s: %w", e.dir, err)
	}
	failpoint.Hit("engine/after-flush")
	return nil
}

// Checkpoint implements engine.Engine: a flush, then the stable region's
// checkpoint (sealed files hard-linked) into dir/StableDir.
func (e *Engine) Checkpoint(dir string) (uint64, error) {
	if err := e.Flush(); err != nil {
		return 0, fmt.Errorf("checkpoint to %s: %w", dir, err)
	}
	if _, err := os.Stat(dir); err == nil {
		return 0, fmt.Errorf("checkpoint to %s: directory exists", dir)
	}
	// Held so that the stable region holds no batch the flush above did
	// not write, and the index returned is the copy's.
	e.flushMu.Lock()
	defer e.flushMu.Unlock()
	idx, err := e.stable.Checkpoint(filepath.Join(dir, StableDir))
	if err != nil {
		return 0, fmt.Errorf("checkpoint to %s: %w", dir, err)
	}
	return idx, nil
}

// CompactAll implements engine.Engine: the stable region's merge, after
// writing out what memory holds, so that it is merged too. Commits and
// views go on meanwhile: they wait for neither the flush's write (5) nor
// the merge (engine/appendlog).
func (e *Engine) CompactAll() error {
	e.mu.Lock()
	if !e.mu.closed {
		e.sealLocked()
	}
	e.mu.Unlock()
	if err := e.flushPending(); err != nil {
		return fmt.Errorf("compact hybridlog engine in %s: %w", e.dir, err)
	}
	// Sync what the flush wrote now, with no lock held, rather than in the
	// merge's rotation, which holds the stable region's writeMu over its
	// sync and so would hold up the flusher's next write.
	if err := e.stable.Flush(); err != nil {
		return fmt.Errorf("compact hybridlog engine in %s: %w", e.dir, err)
	}
	return e.stable.CompactAll()
}

// DiskSize implements engine.Engine: the stable region's files.
func (e *Engine) DiskSize() int64 { return e.stable.DiskSize() }

// MaxKeySize implements engine.Engine: the stable region's limit, since
// every record ends up there.
func (e *Engine) MaxKeySize() int { return e.stable.MaxKeySize() }

var errEngineClosed = errors.New("hybridlog engine closed")

// Close stops the flusher, flushes and closes the stable region.
func (e *Engine) Close() error {
	var err error
	e.closeOnce.Do(func() {
		close(e.stop)
		<-e.done
		ferr := e.Flush()
		e.mu.Lock()
		e.mu.closed = true
		e.mu.cond.Broadcast()
		e.mu.Unlock()
		err = errors.Join(ferr, e.stable.Close())
		if err != nil {
			err = fmt.Errorf("close hybridlog engine in %s: %w", e.dir, err)
		}
	})
	return err
}
