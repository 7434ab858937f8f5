package bbolt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/RaduBerinde/btreemap"
	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/internal/failpoint"
)

// FileName is the bbolt file inside the engine's directory.
const FileName = "bbolt.db"

// DefaultMemBytes is the overlay size at which it is frozen and flushed
// when Options.MemBytes is 0 (Pebble's default memtable is 4 MiB; a bbolt
// flush rewrites whole pages, so fewer, larger flushes write less).
const DefaultMemBytes = 64 << 20

// DefaultInitialMmapSize is bbolt's initial mapping when
// Options.InitialMmapSize is 0: etcd's default, 10 GiB (address space,
// not memory).
const DefaultInitialMmapSize = 10 << 30

// maxFrozen is how many frozen overlays may wait for the flusher before
// Commit waits (a write stall).
const maxFrozen = 2

// openTimeout bounds the wait for bbolt's file lock on Open.
const openTimeout = 5 * time.Second

var errNoBuckets = errors.New("bbolt engine: buckets missing")

var (
	dataBucket = []byte("data")
	metaBucket = []byte("meta")
	genKey     = []byte("generation")
)

// Options configure Open.
type Options struct {
	// MemBytes is the overlay size at which it is frozen and flushed in
	// the background; 0 means DefaultMemBytes.
	MemBytes int64
	// InitialMmapSize is bbolt's initial mapping in bytes; 0 means
	// DefaultInitialMmapSize.
	InitialMmapSize int
	// SyncCommits flushes (and so syncs) every Commit before it returns:
	// the double-logging baseline, as engine/pebble's EnableWAL. Off by
	// default.
	SyncCommits bool
	// Logger receives the engine's warnings; nil means zap.NewNop().
	Logger *zap.Logger
}

// entry is one key's state in an overlay: a value or a deletion.
type entry struct {
	value []byte
	del   bool
}

// layer is an overlay: key -> entry, ordered by key.
type layer = btreemap.BTreeMap[[]byte, entry]

func newLayer() *layer { return btreemap.New[[]byte, entry](32, bytes.Compare) }

// frozen is an overlay that no longer changes, waiting to be flushed.
type frozen struct {
	tree    *layer
	applied uint64 // applied index of the last batch in it
}

// Engine is engine.Engine on a bbolt file with an in-memory overlay.
//
// Invariants:
//  1. The bbolt file is written only under flushMu: by read-write
//     transactions (flush, snapshot install), each committed with bbolt's
//     fsyncs, and by CompactAll's rename of a synced copy holding the same
//     state; so the file always holds the state of a completed commit.
//  2. Every Commit writes its batch, its tails and engine.AppliedIndexKey
//     into the overlay under mu in one step: a reader sees all of a batch
//     or none, and a frozen overlay holds whole batches only, ending with
//     the batch whose index it records.
//  3. Frozen overlays are flushed oldest first, each in one bbolt
//     transaction that writes its entries and its AppliedIndexKey; so the
//     file holds exactly the state after the last flushed batch, a prefix
//     point of the committed batches, and the applied index it holds says
//     which.
//  4. The durable index D is the applied index of the last completed
//     flush (on Open: the applied index in the file). It rises only after
//     bbolt's commit, fsyncs included, has returned, so every batch <= D
//     survives a power cut. Flush freezes the overlay and flushes every
//     frozen overlay, so D >= the applied index seen at its call.
//  5. durable <= applied; applied never decreases (Commit refuses a lower
//     index), except that InstallSnapshot sets both to the snapshot's.
//  6. A reader takes the overlays under mu, then begins its bbolt read
//     transaction outside mu. A flush removes a frozen overlay only after
//     bbolt's commit returned, so the overlays taken cover everything the
//     transaction lacks (an overlay also in the file is read twice, with
//     the same result). An install bumps the generation stored in the
//     file in the same transaction; a reader whose transaction shows a
//     newer generation than its overlays drops them.
//
// Concurrency: mu guards the overlays, the generation and the sticky
// error; flushMu serialises bbolt writers. Lock order: flushMu before mu.
// No bbolt read transaction is begun while mu is held, and Commit releases
// its batch's read transaction before it may wait for the flusher.
// Goroutines: Open starts the flusher, which Close stops; CompactAll starts
// one that waits for the replaced file's last reader, which Close waits
// for.
type Engine struct {
	dir    string
	path   string
	opts   Options
	logger *zap.Logger
	// db is the open bbolt file; CompactAll replaces it (compact.go).
	// Writers load it under flushMu, readers acquire it.
	db       atomic.Pointer[handle]
	retiring sync.WaitGroup // handles replaced by CompactAll, until closed

	mu struct {
		sync.Mutex
		// mem holds the batches committed since the last freeze; only
		// Commit changes it.
		mem      *layer
		memBytes int64
		// memClone is a read-only clone of mem handed to readers; nil
		// once mem changed since it was taken.
		memClone *layer
		frozen   []*frozen // oldest first
		gen      uint64    // install generation the overlays belong to
		err      error     // sticky: a failed flush stops the engine
		// cond is signalled when a frozen overlay is flushed or err is set.
		cond sync.Cond
	}
	flushMu sync.Mutex

	applied atomic.Uint64
	durable atomic.Uint64

	kick      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closed    atomic.Bool // set by Close: reads fail instead of waiting for a handle
}

var _ engine.Engine = (*Engine)(nil)

// Open opens (creating if needed) the engine in dir and starts its flusher.
func Open(dir string, opts Options) (*Engine, error) {
	if opts.MemBytes <= 0 {
		opts.MemBytes = DefaultMemBytes
	}
	if opts.InitialMmapSize <= 0 {
		opts.InitialMmapSize = DefaultInitialMmapSize
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if err := mkdirSynced(dir); err != nil {
		return nil, fmt.Errorf("open bbolt engine in %s: %w", dir, err)
	}
	path := filepath.Join(dir, FileName)
	// A compaction's copy left by a crash before its rename is incomplete.
	if err := os.Remove(path + ".compact"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("open bbolt engine in %s: %w", dir, err)
	}
	_, statErr := os.Stat(path)
	db, err := openBolt(path, opts)
	if err != nil {
		return nil, fmt.Errorf("open bbolt engine in %s: %w", dir, err)
	}
	if errors.Is(statErr, os.ErrNotExist) {
		// bbolt syncs the new file, not the directory entry (rule 7).
		if err := syncDir(dir); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("open bbolt engine in %s: %w", dir, err)
		}
	}
	e := &Engine{dir: dir, path: path, opts: opts, logger: opts.Logger,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	e.mu.mem = newLayer()
	e.mu.cond.L = &e.mu.Mutex
	var applied, gen uint64
	read := func(tx *bolt.Tx) error {
		b, m := tx.Bucket(dataBucket), tx.Bucket(metaBucket)
		if b == nil || m == nil {
			return errNoBuckets
		}
		var err error
		if applied, err = decodeIndex(b.Get(engine.AppliedIndexKey)); err != nil {
			return err
		}
		gen, err = decodeIndex(m.Get(genKey))
		return err
	}
	// Reading first keeps a reopen from committing a transaction of its
	// own; only a new file gets its buckets.
	if err = db.View(read); errors.Is(err, errNoBuckets) {
		err = db.Update(func(tx *bolt.Tx) error {
			for _, name := range [][]byte{dataBucket, metaBucket} {
				if _, err := tx.CreateBucketIfNotExists(name); err != nil {
					return err
				}
			}
			return read(tx)
		})
	}
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open bbolt engine in %s: %w", dir, err)
	}
	e.applied.Store(applied)
	e.durable.Store(applied)
	e.mu.gen = gen
	e.db.Store(newHandle(db, opts.Logger))
	go e.flusher()
	return e, nil
}

// openBolt opens the bbolt file with the engine's settings: bbolt's
// ordinary synced commits (each flush is one), and the freelist rebuilt
// by a scan on open instead of written by every flush.
func openBolt(path string, opts Options) (*bolt.DB, error) {
	return bolt.Open(path, 0o600, &bolt.Options{
		Timeout:         openTimeout,
		InitialMmapSize: opts.InitialMmapSize,
		NoFreelistSync:  true,
		FreelistType:    bolt.FreelistMapType,
	})
}

func decodeIndex(v []byte) (uint64, error) {
	if v == nil {
		return 0, nil
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("read applied index: value has %d bytes, want 8", len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

func encodeIndex(i uint64) []byte { return binary.BigEndian.AppendUint64(nil, i) }

// AppliedIndex implements engine.Engine.
func (e *Engine) AppliedIndex() uint64 { return e.applied.Load() }

// DurableIndex implements engine.Engine: the applied index of the last
// completed flush (invariant 4).
func (e *Engine) DurableIndex() uint64 { return e.durable.Load() }

func (e *Engine) raiseDurable(idx uint64) {
	for {
		d := e.durable.Load()
		if idx <= d || e.durable.CompareAndSwap(d, idx) {
			return
		}
	}
}

// commit writes a batch's entries, then its tails' operations in order,
// then the applied index, into the overlay (invariant 2).
func (e *Engine) commit(own *layer, tails []*writeOnlyBatch, appliedIndex uint64) error {
	e.mu.Lock()
	if e.mu.err != nil {
		e.mu.Unlock()
		return fmt.Errorf("commit batch at index %d: %w", appliedIndex, e.mu.err)
	}
	if cur := e.applied.Load(); appliedIndex < cur {
		e.mu.Unlock()
		return fmt.Errorf("commit batch: applied index %d below the engine's %d", appliedIndex, cur)
	}
	mem := e.mu.mem
	var n int64
	put := func(k []byte, en entry) {
		mem.ReplaceOrInsert(k, en)
		n += int64(len(k) + len(en.value) + 48)
	}
	if own != nil {
		own.AscendFunc(btreemap.Min[[]byte](), btreemap.Max[[]byte](), func(k []byte, en entry) bool {
			put(k, en)
			return true
		})
	}
	for _, t := range tails {
		for _, o := range t.ops {
			put(o.key, entry{value: o.value, del: o.del})
		}
	}
	put(engine.AppliedIndexKey, entry{value: encodeIndex(appliedIndex)})
	e.mu.memBytes += n
	e.mu.memClone = nil
	e.applied.Store(appliedIndex)
	var err error
	if e.mu.memBytes >= e.opts.MemBytes {
		for len(e.mu.frozen) >= maxFrozen && e.mu.err == nil {
			e.mu.cond.Wait() // a write stall: the flusher is behind
		}
		if err = e.mu.err; err == nil {
			e.freezeLocked()
			select {
			case e.kick <- struct{}{}:
			default:
			}
		}
	}
	e.mu.Unlock()
	if err != nil {
		return fmt.Errorf("commit batch at index %d: %w", appliedIndex, err)
	}
	if e.opts.SyncCommits {
		return e.Flush()
	}
	return nil
}

// freezeLocked turns the overlay into a frozen one, if it holds anything.
// REQUIRES: e.mu held.
func (e *Engine) freezeLocked() {
	if e.mu.mem.Len() == 0 {
		return
	}
	e.mu.frozen = append(e.mu.frozen, &frozen{tree: e.mu.mem, applied: e.applied.Load()})
	e.mu.mem = newLayer()
	e.mu.memBytes = 0
	e.mu.memClone = nil
}

// Flush implements engine.Engine: it freezes the overlay and writes every
// frozen overlay to bbolt, oldest first, each in one synced transaction.
func (e *Engine) Flush() error {
	e.mu.Lock()
	e.freezeLocked()
	e.mu.Unlock()
	failpoint.Hit("engine/before-flush")
	e.flushMu.Lock()
	err := e.flushFrozenLocked()
	e.flushMu.Unlock()
	if err != nil {
		return fmt.Errorf("flush bbolt engine in %s: %w", e.dir, err)
	}
	failpoint.Hit("engine/after-flush")
	return nil
}

// flushFrozenLocked writes the frozen overlays to bbolt (invariant 3). A
// failure is sticky: the engine no longer knows what its file holds.
// REQUIRES: e.flushMu held.
func (e *Engine) flushFrozenLocked() error {
	for {
		e.mu.Lock()
		if e.mu.err != nil {
			err := e.mu.err
			e.mu.Unlock()
			return err
		}
		if len(e.mu.frozen) == 0 {
			e.mu.Unlock()
			return nil
		}
		f := e.mu.frozen[0]
		e.mu.Unlock()
		err := e.db.Load().db.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket(dataBucket)
			var err error
			f.tree.AscendFunc(btreemap.Min[[]byte](), btreemap.Max[[]byte](), func(k []byte, en entry) bool {
				if en.del {
					err = b.Delete(k)
				} else {
					err = b.Put(k, en.value)
				}
				if err != nil {
					err = fmt.Errorf("write %q: %w", k, err)
				}
				return err == nil
			})
			return err
		})
		e.mu.Lock()
		if err != nil {
			err = fmt.Errorf("flush up to index %d: %w", f.applied, err)
			e.mu.err = err
		} else {
			e.mu.frozen = e.mu.frozen[1:]
		}
		e.mu.cond.Broadcast()
		e.mu.Unlock()
		if err != nil {
			e.logger.Error("bbolt engine flush failed; the engine refuses further commits", zap.Error(err))
			return err
		}
		e.raiseDurable(f.applied)
	}
}

// flusher flushes frozen overlays when Commit freezes one.
func (e *Engine) flusher() {
	defer close(e.done)
	for {
		select {
		case <-e.stop:
			return
		case <-e.kick:
			e.flushMu.Lock()
			_ = e.flushFrozenLocked() // sticky; logged there
			e.flushMu.Unlock()
		}
	}
}

// Checkpoint implements engine.Engine: it flushes, then copies the file as
// one bbolt read transaction sees it (bbolt's Tx.WriteTo) to dir/FileName,
// under a temporary name, synced, renamed, directory synced. The applied
// index is read in the same transaction, so it is exactly the copy's.
func (e *Engine) Checkpoint(dir string) (uint64, error) {
	if err := e.Flush(); err != nil {
		return 0, fmt.Errorf("checkpoint to %s: %w", dir, err)
	}
	if _, err := os.Stat(dir); err == nil {
		return 0, fmt.Errorf("checkpoint to %s: directory exists", dir)
	}
	if err := mkdirSynced(dir); err != nil {
		return 0, fmt.Errorf("checkpoint to %s: %w", dir, err)
	}
	h, err := e.acquireHandle()
	if err != nil {
		return 0, fmt.Errorf("checkpoint to %s: %w", dir, err)
	}
	defer h.release()
	tx, err := h.db.Begin(false)
	if err != nil {
		return 0, fmt.Errorf("checkpoint to %s: %w", dir, err)
	}
	defer func() { _ = tx.Rollback() }()
	idx, err := decodeIndex(tx.Bucket(dataBucket).Get(engine.AppliedIndexKey))
	if err != nil {
		return 0, fmt.Errorf("checkpoint to %s: %w", dir, err)
	}
	path := filepath.Join(dir, FileName)
	if err := writeFileSynced(path, func(f *os.File) error { _, err := tx.WriteTo(f); return err }); err != nil {
		return 0, fmt.Errorf("checkpoint to %s: %w", dir, err)
	}
	return idx, nil
}

// MaxKeySize implements engine.Engine: bbolt's own limit (bolt.MaxKeySize,
// 32768 bytes), which Set enforces.
func (e *Engine) MaxKeySize() int { return bolt.MaxKeySize }

// DiskSize implements engine.Engine: the bytes the bbolt file occupies on
// disk (as du counts them). bbolt grows its file by truncating it in steps
// of 16 MiB, so the file's length overstates what is written there; its
// allocated blocks do not.
func (e *Engine) DiskSize() int64 {
	st, err := os.Stat(e.path)
	if err != nil {
		return 0
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return sys.Blocks * 512
	}
	return st.Size()
}

// Close stops the flusher, flushes (so that a clean restart has nothing
// to replay) and closes bbolt once every open view is closed.
func (e *Engine) Close() error {
	var err error
	e.closeOnce.Do(func() {
		close(e.stop)
		<-e.done
		ferr := e.Flush()
		e.closed.Store(true)
		h := e.db.Load()
		h.retire()
		<-h.closed
		e.retiring.Wait()
		if h.err != nil {
			err = fmt.Errorf("close bbolt engine in %s: %w", e.dir, h.err)
			return
		}
		err = ferr
	})
	return err
}

// mkdirSynced creates dir and its missing parents, syncing each parent
// after creating a child in it (durability rule 7).
func mkdirSynced(dir string) error {
	dir = filepath.Clean(dir)
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := mkdirSynced(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	return syncDir(parent)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// writeFileSynced writes path under a temporary name with write, syncs it,
// renames it into place and syncs the directory (durability rule 7).
func writeFileSynced(path string, write func(f *os.File) error) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	if err := write(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	return syncDir(filepath.Dir(path))
}
