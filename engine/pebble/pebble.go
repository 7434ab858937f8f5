// Package pebble implements engine.Engine on Pebble, the pure-Go LSM tree.
//
// # Single logging
//
// By default the engine runs with Pebble's write-ahead log disabled: the raft
// log is the only log (docs/design.md, durability rule 2; seed 002). Every Commit writes the batch
// and the raft index it applies, under the reserved key AppliedIndexKey, in
// one atomic Pebble batch, without a sync. Pebble flushes whole memtables in
// commit order, so after a power cut the files hold a prefix of the committed
// batches and the applied index read back on Open says exactly which prefix.
//
// Options.EnableWAL turns Pebble's WAL back on and syncs every Commit: the
// "double logging" baseline that etcd-like designs pay for.
//
// # Durable index
//
// DurableIndex returns D such that every batch with applied index <= D is in
// durable files. D rises in three ways:
//
//  1. On Open it is the applied index read back (all that survived is durable).
//  2. Flush reads the applied index A before asking Pebble to flush and, once
//     the flush returns, raises D to A.
//  3. After one of Pebble's own automatic flushes (observed through the
//     EventListener's FlushEnd), the next DurableIndex call reads the applied
//     index from the flushed files only (IterOptions.OnlyReadGuaranteedDurable
//     ignores memtables), so D never counts a batch that is still only in a
//     memtable. Guessing which batches a flush covered would risk
//     over-estimating D, which would let the raft log drop entries the engine
//     would lose in a crash.
//
// With EnableWAL every commit is synced, so D equals the applied index.
//
// # Point reads inside a batch
//
// mvcc reads each key's previous version before it writes the key, so the
// apply batch's Get is the engine's hottest read. It takes one of three ways,
// chosen by memkeys.go's filter over the keys the memtables may hold:
//   - a key no memtable can hold is read from the flushed tables alone,
//     skipping the memtable's skiplist;
//   - a key the filter has seen, or the batch wrote, is read by
//     pebble.Batch.Get, which looks at the batch, then the memtables, then
//     each level in turn and stops at the first that holds the key: a hot
//     key's newest version is usually in a memtable, and a merging iterator
//     would also seek every level below it, reading a data block of the
//     bottom level for a version it then hides;
//   - otherwise (the filter is off, or the key is inside a range deletion
//     not yet flushed) through one prefix iterator kept for the batch,
//     which reads the bottom level's bloom filters (Batch.Get skips them, so
//     a key the store does not hold would cost a block search there).
//
// docs/bench/performance.md has the profiles and the measurements.
//
// # Reserved keys
//
// Keys beginning with the byte 0x00 0x00 are reserved for the engine; the
// state machine's key spaces must not use them.
//
// Concurrency: as engine.Engine says: batches are committed by one goroutine;
// reads, snapshots, Flush, DurableIndex and Checkpoint are safe from any.
package pebble

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/internal/failpoint"
)

// AppliedIndexKey is the reserved key under which every Commit stores the
// applied raft index, as an 8-byte big-endian integer: engine.AppliedIndexKey,
// shared by every engine (a wire format: do not change it).
var AppliedIndexKey = engine.AppliedIndexKey

// The LSM's shape, chosen by measurement (docs/bench/performance.md):
// loading 10^6 keys with Pebble's defaults (4 MiB memtables, an L0
// compaction at 4 sublevels, one compaction at a time) rewrote 1.0 GB in
// compactions and took the server 65-92 s of CPU; with the options below,
// 0.11 GB and 29-46 s in the same periods. The price is the tail a kill -9
// leaves to replay: up to a memtable's worth of applied entries (2.9 s for
// 60,000 puts after the load), where a 4 MiB memtable left a few thousand.
const (
	// DefaultCacheSize is the block cache size used when Options.CacheSize
	// is 0. Pebble reserves the memtables' memory from it, so it holds
	// defaultMemTableSize's two memtables besides the blocks. (Pebble's own
	// default, 8 MiB, made BenchmarkApplyPut read index blocks from disk on
	// most puts.)
	DefaultCacheSize = 384 << 20
	// defaultMemTableSize: larger memtables flush fewer, larger L0 tables,
	// which random keys make overlap all of Lbase, so each flush costs an
	// Lbase rewrite.
	defaultMemTableSize = 32 << 20
	// l0CompactionThreshold lets 8 sublevels gather before they are
	// compacted into Lbase (Pebble: 4), so one rewrite of Lbase takes more
	// of L0; bloom filters keep point reads across them cheap.
	l0CompactionThreshold = 8
	// l0StopWritesThreshold stops writes at 64 sublevels (Pebble: 12): a
	// write burst is absorbed by L0 instead of stalling.
	l0StopWritesThreshold = 64
	// maxCompactions: a second compaction runs when Pebble finds the debt
	// high; with two cores, never more.
	maxCompactions = 2
	// readSamplingMultiplier samples an iterator's reads every 256 KiB
	// (Pebble: every 1 MiB) for read-triggered compactions, which compact
	// the tables that reads keep seeking through. l0CompactionThreshold
	// leaves up to 8 sublevels after a load, and a Get looks in each (a
	// bloom filter probe at least). Sampled four times as often, YCSB at
	// 10^6 keys used 1-22% less CPU per operation than with Pebble's
	// default in 21 of 22 rows of two alternated runs, at 0.98-1.32× the
	// rate (docs/bench/performance.md, "Read-triggered compactions");
	// with none (-1) it ran at 0.82-1.01× the rate.
	readSamplingMultiplier = 1 << 2
)

// Options configure Open.
type Options struct {
	// FS is the file system; nil means the operating system's (vfs.Default).
	FS vfs.FS
	// EnableWAL turns Pebble's write-ahead log on and syncs every Commit
	// (the double-logging baseline). Off by default.
	EnableWAL bool
	// Logger receives Pebble's log lines; nil means zap.NewNop().
	Logger *zap.Logger
	// CacheSize is the block cache size in bytes; 0 means DefaultCacheSize.
	// Every Put reads the key's previous version, so the cache matters.
	CacheSize int64

	// ReadOnly opens an existing engine without changing any of its files
	// (a checkpoint being backed up or restored from): commits, flushes
	// and checkpoints fail (Pebble's read-only DB has no OPTIONS file of
	// its own to copy), Close does not flush, and the format is not
	// ratcheted.
	ReadOnly bool

	// memTableSize overrides Pebble's memtable size; tests set it small to
	// provoke automatic flushes.
	memTableSize uint64
	// memKeysCapacity overrides memKeysCapacity; tests set it small to
	// provoke rotations.
	memKeysCapacity int
}

// Engine is engine.Engine on a Pebble DB.
//
// Invariants:
//  1. durable <= applied at all times.
//  2. applied never decreases: Commit refuses a lower index.
type Engine struct {
	db   *pebble.DB
	fs   vfs.FS
	dir  string
	wal  bool
	opts Options

	applied atomic.Uint64 // applied index of the last committed batch
	durable atomic.Uint64 // D
	// flushed is set by Pebble's FlushEnd event; the next DurableIndex call
	// clears it and re-reads the durable applied index.
	flushed atomic.Bool
	// generation counts the commits and ingests that changed the engine's
	// content, so that an open batch knows when its point-read iterator no
	// longer sees the engine as it is (batch).
	generation atomic.Uint64
	// memKeys filters the keys the memtables may hold (memkeys.go); nil
	// with Pebble's WAL on or read-only, where the memtables also hold
	// what a WAL replay put there.
	memKeys *memKeys
	// flushedMemtables counts the memtables Pebble reported flushed.
	flushedMemtables atomic.Uint64

	stallMu sync.Mutex
	stalls  stallClock // guarded by stallMu

	// flushFailed is closed when a memtable flush has failed, with
	// flushErr its error: Pebble retries a failed flush at once, forever
	// (its flush loop has no backoff), so Flush and Close stop waiting on
	// it and report the failure (failed.go).
	flushFailed   chan struct{}
	flushErr      error // set before flushFailed closes
	flushFailOnce sync.Once
	bgLog         backgroundLog
}

var _ engine.Engine = (*Engine)(nil)

// Open opens (creating if needed) the engine in dir.
func Open(dir string, opts Options) (*Engine, error) {
	if opts.FS == nil {
		opts.FS = vfs.Default
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.CacheSize <= 0 {
		opts.CacheSize = DefaultCacheSize
	}
	e := &Engine{fs: opts.FS, dir: dir, wal: opts.EnableWAL, opts: opts, flushFailed: make(chan struct{})}
	e.bgLog.logger = opts.Logger
	cache := pebble.NewCache(opts.CacheSize)
	defer cache.Unref() // the DB holds its own reference
	po := &pebble.Options{
		Cache:      cache,
		FS:         tableWriteFS{opts.FS}, // writebuf.go
		DisableWAL: !opts.EnableWAL,
		// Snapshot install uses IngestAndExcise, which needs a recent
		// format; a new store starts at the newest, an old one ratchets.
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             zapLogger{opts.Logger.Sugar()},
		ReadOnly:           opts.ReadOnly,
	}
	if opts.ReadOnly {
		// Ratcheting the format writes a marker file; a read-only
		// engine reads whatever format it finds.
		po.FormatMajorVersion = 0
		po.ErrorIfNotExists = true
	}
	// Bloom filters let a Get skip the tables that do not hold the key: every
	// Put reads its key's previous version, often in vain for new keys.
	for i := range po.Levels {
		po.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	po.MemTableSize = defaultMemTableSize
	if opts.memTableSize > 0 {
		po.MemTableSize = opts.memTableSize
	}
	po.L0CompactionThreshold = l0CompactionThreshold
	po.L0StopWritesThreshold = l0StopWritesThreshold
	po.CompactionConcurrencyRange = func() (int, int) { return 1, maxCompactions }
	po.Experimental.ReadSamplingMultiplier = readSamplingMultiplier
	po.EventListener = &pebble.EventListener{
		FlushEnd: func(info pebble.FlushInfo) {
			switch {
			case info.Err == nil:
				e.flushedMemtables.Add(uint64(info.Input))
				e.flushed.Store(true)
			case !isEmptyFlush(info.Err):
				e.failFlush(info.Err)
			}
		},
		BackgroundError: e.bgLog.log,
		WriteStallBegin: e.stallBegan,
		WriteStallEnd:   e.stallEnded,
	}
	// The gate holds compactions back until Open has returned (openGate).
	gate := newOpenGate()
	po.Experimental.CompactionScheduler = gate
	db, err := pebble.Open(dir, po)
	if err != nil {
		gate.Unregister()
		return nil, fmt.Errorf("open pebble engine in %s: %w", dir, err)
	}
	gate.open()
	e.db = db
	idx, err := readIndex(db, nil)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open pebble engine in %s: %w", dir, err)
	}
	e.applied.Store(idx)
	e.durable.Store(idx)
	if !opts.EnableWAL && !opts.ReadOnly {
		// The memtables start empty unless a WAL of an earlier run (with
		// EnableWAL) was replayed into them: newMemKeys tells by the queue.
		e.memKeys = newMemKeys(opts.memKeysCapacity,
			func() uint64 { return uint64(db.Metrics().MemTable.Count) },
			e.flushedMemtables.Load)
	}
	return e, nil
}

// readIndex reads the applied index through iterator options o (nil: all
// committed data).
func readIndex(r pebble.Reader, o *pebble.IterOptions) (uint64, error) {
	if o == nil {
		o = &pebble.IterOptions{}
	}
	o.LowerBound = AppliedIndexKey
	o.UpperBound = append(append([]byte(nil), AppliedIndexKey...), 0)
	it, err := r.NewIter(o)
	if err != nil {
		return 0, fmt.Errorf("read applied index: %w", err)
	}
	var idx uint64
	if it.First() {
		v := it.Value()
		if len(v) != 8 {
			_ = it.Close()
			return 0, fmt.Errorf("read applied index: value has %d bytes, want 8", len(v))
		}
		idx = binary.BigEndian.Uint64(v)
	}
	if err := it.Close(); err != nil {
		return 0, fmt.Errorf("read applied index: %w", err)
	}
	return idx, nil
}

// Get implements engine.Reader.
func (e *Engine) Get(key []byte) ([]byte, error) { return get(e.db, key) }

// NewIter implements engine.Reader.
func (e *Engine) NewIter(lower, upper []byte) engine.Iterator { return newIter(e.db, lower, upper) }

// NewBatch returns an indexed batch: reads through it see its own writes.
func (e *Engine) NewBatch() engine.Batch {
	return &batch{e: e, b: e.db.NewIndexedBatch()}
}

// NewSnapshot implements engine.Engine.
func (e *Engine) NewSnapshot() engine.Snapshot { return &snapshot{s: e.db.NewSnapshot()} }

// AppliedIndex implements engine.Engine.
func (e *Engine) AppliedIndex() uint64 { return e.applied.Load() }

// DurableIndex implements engine.Engine. After an automatic flush it reads
// the applied index from flushed files only; see the package comment.
func (e *Engine) DurableIndex() uint64 {
	if e.wal {
		return e.applied.Load()
	}
	if e.flushed.Swap(false) {
		idx, err := readIndex(e.db, &pebble.IterOptions{OnlyReadGuaranteedDurable: true})
		if err != nil {
			// Under-estimating D is safe; try again after the next flush.
			e.opts.Logger.Warn("read durable applied index", zap.Error(err))
		} else {
			e.raiseDurable(idx)
		}
	}
	return e.durable.Load()
}

func (e *Engine) raiseDurable(idx uint64) {
	for {
		d := e.durable.Load()
		if idx <= d || e.durable.CompareAndSwap(d, idx) {
			return
		}
	}
}

// Flush implements engine.Engine.
func (e *Engine) Flush() error {
	a := e.applied.Load()
	failpoint.Hit("engine/before-flush")
	if err := e.failed(); err != nil {
		return fmt.Errorf("flush pebble engine in %s: %w", e.dir, err)
	}
	done, err := e.db.AsyncFlush()
	if err != nil {
		return fmt.Errorf("flush pebble engine in %s: %w", e.dir, err)
	}
	select {
	case <-done:
	case <-e.flushFailed:
		return fmt.Errorf("flush pebble engine in %s: %w", e.dir, e.flushErr)
	}
	failpoint.Hit("engine/after-flush")
	e.raiseDurable(a)
	return nil
}

// Checkpoint implements engine.Engine. It flushes first, because with the
// WAL off a checkpoint holds only flushed data, then reads the applied index
// back from the copy itself, so the answer is exact even if batches were
// committed between the flush and the checkpoint.
func (e *Engine) Checkpoint(dir string) (uint64, error) {
	if err := e.Flush(); err != nil {
		return 0, fmt.Errorf("checkpoint to %s: %w", dir, err)
	}
	if err := e.db.Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		return 0, fmt.Errorf("checkpoint to %s: %w", dir, err)
	}
	cp, err := pebble.Open(dir, &pebble.Options{FS: e.fs, ReadOnly: true, Logger: zapLogger{e.opts.Logger.Sugar()}})
	if err != nil {
		return 0, fmt.Errorf("checkpoint to %s: reopen copy: %w", dir, err)
	}
	idx, err := readIndex(cp, nil)
	if cerr := cp.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("checkpoint to %s: %w", dir, err)
	}
	return idx, nil
}

// CompactAll implements engine.Engine: it compacts the whole key space.
func (e *Engine) CompactAll() error {
	it, err := e.db.NewIter(nil)
	if err != nil {
		return fmt.Errorf("compact all: %w", err)
	}
	var first, last []byte
	if it.First() {
		first = append([]byte(nil), it.Key()...)
		if it.Last() {
			last = append(append([]byte(nil), it.Key()...), 0)
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("compact all: %w", err)
	}
	if first == nil || last == nil {
		return nil
	}
	if err := e.db.Compact(context.Background(), first, last, true); err != nil {
		return fmt.Errorf("compact all: %w", err)
	}
	return nil
}

// DiskSize implements engine.Engine.
func (e *Engine) DiskSize() int64 { return int64(e.db.Metrics().DiskSpaceUsage()) }

// MaxKeySize implements engine.Engine: Pebble bounds a key only by what a
// batch can hold (4 GiB), far above any request etcd's limits admit, so it
// enforces none here.
func (e *Engine) MaxKeySize() int { return 0 }

// Close flushes (so that a clean restart has nothing to replay) and closes
// the DB.
func (e *Engine) Close() error {
	var ferr error
	if !e.wal && !e.opts.ReadOnly {
		ferr = e.Flush()
	}
	if err := e.db.Close(); err != nil {
		return fmt.Errorf("close pebble engine in %s: %w", e.dir, err)
	}
	return ferr
}

func get(r pebble.Reader, key []byte) ([]byte, error) {
	v, closer, err := r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, engine.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("get %q: %w", key, err)
	}
	out := append([]byte(nil), v...)
	if err := closer.Close(); err != nil {
		return nil, fmt.Errorf("get %q: %w", key, err)
	}
	return out, nil
}

// batch is an indexed pebble batch (engine.Batch).
//
// Its point reads take one of three ways (the package comment, "Point
// reads inside a batch"). The kept iterator, reads, is for keys memKeys
// cannot place: pebble.Batch.Get builds a new iterator stack per call and
// never consults the bottom level's bloom filters, so a key the store does
// not hold would cost a block search in the largest level. The kept
// iterator reuses its levels' table iterators from one seek to the next and
// reads L6 filters (UseL6Filters); SeekPrefixGE with Pebble's default
// comparer, whose prefix is the whole key, finds the key itself or nothing.
//
// Invariant: reads sees the batch's own writes and every write committed to
// the engine before the read (Batch.Get does too: it reads through the
// batch's index and at the engine's latest sequence number). SetOptions
// before each seek brings in the batch's writes since the last one (a no-op
// when there are none); a commit or ingest on the engine after the iterator
// was made (e.generation moved) makes the next read build a new one, since
// an iterator's view of the engine is fixed when it is made.
type batch struct {
	e    *Engine
	b    *pebble.Batch
	done bool

	reads           *pebble.Iterator // nil until the first Get
	readsGeneration uint64           // e.generation when reads was made

	// flushedReads reads the flushed tables only, for keys that memKeys
	// says no memtable holds ("Reads that skip the memtables", memkeys.go).
	flushedReads      *pebble.Iterator
	flushedGeneration uint64
	// own holds the hashes of the keys this batch wrote: memKeys learns
	// them only at commit. ownRangeDel: the batch deleted a range, which
	// may cover any key, so every read goes through the batch.
	own         map[uint64]struct{}
	ownRangeDel bool
}

// pointReadOptions are the options of batch.reads; SetOptions with the same
// values keeps the iterator's state and only refreshes the batch's view.
var pointReadOptions = pebble.IterOptions{UseL6Filters: true}

// flushedReadOptions leave the memtables out (and the batch: the iterator
// is the DB's).
var flushedReadOptions = pebble.IterOptions{UseL6Filters: true, OnlyReadGuaranteedDurable: true}

// Get implements engine.Reader.
func (b *batch) Get(key []byte) ([]byte, error) {
	if mk := b.e.memKeys; mk != nil && !b.ownRangeDel {
		h := mk.hash(key)
		if _, written := b.own[h]; written {
			return get(b.b, key)
		}
		rebuild := b.flushedReads == nil || b.flushedGeneration != b.e.generation.Load()
		switch mk.place(key, h, rebuild) {
		case placeFlushed:
			return b.getFlushed(key, rebuild)
		case placeMemtable:
			return get(b.b, key)
		}
	}
	if b.reads != nil && b.readsGeneration != b.e.generation.Load() {
		if err := b.closeReads(); err != nil {
			return nil, fmt.Errorf("get %q: %w", key, err)
		}
	}
	if b.reads == nil {
		gen := b.e.generation.Load()
		it, err := b.b.NewIter(&pointReadOptions)
		if err != nil {
			return nil, fmt.Errorf("get %q: %w", key, err)
		}
		b.reads, b.readsGeneration = it, gen
	} else {
		b.reads.SetOptions(&pointReadOptions)
	}
	return seekPoint(b.reads, key)
}

// getFlushed reads key from the flushed tables alone. rebuild: the
// iterator is missing or older than the engine's last change, and
// memKeys was asked with retire (invariant 2 of memKeys).
func (b *batch) getFlushed(key []byte, rebuild bool) ([]byte, error) {
	if rebuild {
		if b.flushedReads != nil {
			err := b.flushedReads.Close()
			b.flushedReads = nil
			if err != nil {
				return nil, fmt.Errorf("get %q: %w", key, err)
			}
		}
		gen := b.e.generation.Load()
		it, err := b.e.db.NewIter(&flushedReadOptions)
		if err != nil {
			return nil, fmt.Errorf("get %q: %w", key, err)
		}
		b.flushedReads, b.flushedGeneration = it, gen
	}
	return seekPoint(b.flushedReads, key)
}

// seekPoint reads key's value through a prefix seek: with Pebble's default
// comparer a key's prefix is the whole key, so a valid position is key.
func seekPoint(it *pebble.Iterator, key []byte) ([]byte, error) {
	if !it.SeekPrefixGE(key) {
		if err := it.Error(); err != nil {
			return nil, fmt.Errorf("get %q: %w", key, err)
		}
		return nil, engine.ErrNotFound
	}
	v, err := it.ValueAndErr()
	if err != nil {
		return nil, fmt.Errorf("get %q: %w", key, err)
	}
	return append([]byte(nil), v...), nil
}

// closeReads closes the point-read iterators, before the batch is committed
// or closed, or when the engine changed under them.
func (b *batch) closeReads() error {
	var err error
	if b.reads != nil {
		err = b.reads.Close()
		b.reads = nil
	}
	if b.flushedReads != nil {
		if ferr := b.flushedReads.Close(); err == nil {
			err = ferr
		}
		b.flushedReads = nil
	}
	return err
}

// wrote records a key this batch writes, for Get's memKeys check.
func (b *batch) wrote(key []byte) {
	if b.e.memKeys == nil {
		return
	}
	if b.own == nil {
		b.own = make(map[uint64]struct{}, 64)
	}
	b.own[b.e.memKeys.hash(key)] = struct{}{}
}

func (b *batch) NewIter(lower, upper []byte) engine.Iterator { return newIter(b.b, lower, upper) }

// Set implements engine.Batch.
func (b *batch) Set(key, value []byte) error {
	b.wrote(key)
	return b.b.Set(key, value, nil)
}

// Delete implements engine.Batch.
func (b *batch) Delete(key []byte) error {
	b.wrote(key)
	return b.b.Delete(key, nil)
}

// DeleteRange implements engine.Batch.
func (b *batch) DeleteRange(start, end []byte) error {
	b.ownRangeDel = true
	return b.b.DeleteRange(start, end, nil)
}

// Empty implements engine.Batch.
func (b *batch) Empty() bool { return b.b.Empty() }

func (b *batch) Commit(appliedIndex uint64) error {
	if b.done {
		return errors.New("commit batch: already committed or closed")
	}
	if err := b.closeReads(); err != nil {
		return fmt.Errorf("commit batch at index %d: %w", appliedIndex, err)
	}
	if err := b.e.commit(b.b, appliedIndex); err != nil {
		return err
	}
	b.done = true
	return b.b.Close()
}

// CommitWith implements engine.Batch. The batch and its tails are copied
// into one unindexed pebble batch: copying is cheap, and indexing the
// tails would cost what building them apart saved.
func (b *batch) CommitWith(appliedIndex uint64, tails []engine.WriteOnlyBatch) error {
	defer func() {
		for _, t := range tails {
			_ = t.Close()
		}
	}()
	if len(tails) == 0 {
		return b.Commit(appliedIndex)
	}
	if b.done {
		return errors.New("commit batch: already committed or closed")
	}
	if err := b.closeReads(); err != nil {
		return fmt.Errorf("commit batch at index %d: %w", appliedIndex, err)
	}
	whole := b.e.db.NewBatch()
	defer whole.Close()
	if err := whole.Apply(b.b, nil); err != nil {
		return fmt.Errorf("commit batch at index %d: %w", appliedIndex, err)
	}
	for i, t := range tails {
		wb, ok := t.(*writeOnlyBatch)
		if !ok || wb.done {
			return fmt.Errorf("commit batch at index %d: tail %d is not an open write-only batch of this engine", appliedIndex, i)
		}
		if err := whole.Apply(wb.b, nil); err != nil {
			return fmt.Errorf("commit batch at index %d: tail %d: %w", appliedIndex, i, err)
		}
	}
	if err := b.e.commit(whole, appliedIndex); err != nil {
		return err
	}
	b.done = true
	return b.b.Close()
}

// commit writes the applied index into pb and commits it without a sync
// (with a sync when the engine keeps its own WAL).
func (e *Engine) commit(pb *pebble.Batch, appliedIndex uint64) error {
	if cur := e.applied.Load(); appliedIndex < cur {
		return fmt.Errorf("commit batch: applied index %d below the engine's %d", appliedIndex, cur)
	}
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], appliedIndex)
	if err := pb.Set(AppliedIndexKey, buf[:], nil); err != nil {
		return fmt.Errorf("commit batch at index %d: %w", appliedIndex, err)
	}
	wo := pebble.NoSync
	if e.wal {
		wo = pebble.Sync
	}
	if e.memKeys != nil {
		if err := e.memKeys.addBatch(pb); err != nil {
			return fmt.Errorf("commit batch at index %d: %w", appliedIndex, err)
		}
	}
	if err := pb.Commit(wo); err != nil {
		return fmt.Errorf("commit batch at index %d: %w", appliedIndex, err)
	}
	e.generation.Add(1)
	e.applied.Store(appliedIndex)
	if e.memKeys != nil {
		// After the generation moved: an open batch's flushed-tables
		// iterator, made before a flush this retires, is rebuilt.
		e.memKeys.committed()
	}
	return nil
}

// writeOnlyBatch is an unindexed pebble batch (engine.WriteOnlyBatch).
type writeOnlyBatch struct {
	b    *pebble.Batch
	done bool
}

// NewWriteOnlyBatch implements engine.Engine.
func (e *Engine) NewWriteOnlyBatch() engine.WriteOnlyBatch {
	return &writeOnlyBatch{b: e.db.NewBatch()}
}

func (w *writeOnlyBatch) Set(key, value []byte) error { return w.b.Set(key, value, nil) }
func (w *writeOnlyBatch) Delete(key []byte) error     { return w.b.Delete(key, nil) }

func (w *writeOnlyBatch) Close() error {
	if w.done {
		return nil
	}
	w.done = true
	return w.b.Close()
}

func (b *batch) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	rerr := b.closeReads()
	if err := b.b.Close(); err != nil {
		return err
	}
	return rerr
}

type snapshot struct{ s *pebble.Snapshot }

func (s *snapshot) Get(key []byte) ([]byte, error)              { return get(s.s, key) }
func (s *snapshot) NewIter(lower, upper []byte) engine.Iterator { return newIter(s.s, lower, upper) }
func (s *snapshot) Close() error                                { return s.s.Close() }

type iter struct {
	*pebble.Iterator
}

func newIter(r pebble.Reader, lower, upper []byte) engine.Iterator {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return errIter{fmt.Errorf("new iterator: %w", err)}
	}
	return iter{it}
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

type zapLogger struct{ s *zap.SugaredLogger }

func (l zapLogger) Infof(format string, args ...interface{})  { l.s.Infof(format, args...) }
func (l zapLogger) Errorf(format string, args ...interface{}) { l.s.Errorf(format, args...) }
func (l zapLogger) Fatalf(format string, args ...interface{}) { l.s.Fatalf(format, args...) }
