package bbolt

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"
)

// bbolt never gives freed pages back to the file system: they go to its
// freelist and are reused by later writes. CompactAll reclaims them as
// etcd's defragmentation does, by copying every key into a new file
// (bbolt's Compact), but without stopping the engine: the copy is made
// with flushMu held (so the file does not change meanwhile; commits go on
// into the overlay), renamed over the old file, and the new file's handle
// replaces the old one. Readers that hold the old handle keep reading it;
// it is closed when the last of them is done.

// compactTxBytes bounds each bbolt transaction of the copy, so that the
// copy of a large file does not hold it all in memory at once.
const compactTxBytes = 64 << 20

// handle is an open bbolt file shared by the views that read it.
//
// Invariant: the DB is closed once it is retired and no view holds it, and
// never before: a view acquires the handle before it begins a transaction
// on it, so a transaction never starts on a closed (or closing) DB.
type handle struct {
	db     *bolt.DB
	logger *zap.Logger
	mu     struct {
		sync.Mutex
		refs    int
		retired bool
	}
	closed chan struct{} // closed once db is closed
	err    error         // db.Close's error; read after closed
}

func newHandle(db *bolt.DB, logger *zap.Logger) *handle {
	return &handle{db: db, logger: logger, closed: make(chan struct{})}
}

// acquire takes a reference, or reports false for a retired handle.
func (h *handle) acquire() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.retired {
		return false
	}
	h.mu.refs++
	return true
}

func (h *handle) release() {
	h.mu.Lock()
	h.mu.refs--
	last := h.mu.retired && h.mu.refs == 0
	h.mu.Unlock()
	if last {
		h.close()
	}
}

// retire stops new references; the DB closes when the last one goes.
func (h *handle) retire() {
	h.mu.Lock()
	h.mu.retired = true
	last := h.mu.refs == 0
	h.mu.Unlock()
	if last {
		h.close()
	}
}

func (h *handle) close() {
	if h.err = h.db.Close(); h.err != nil {
		h.logger.Warn("close retired bbolt file", zap.Error(h.err))
	}
	close(h.closed)
}

// errClosedEngine is returned by reads after Close.
var errClosedEngine = errors.New("bbolt engine closed")

// acquireHandle returns the current handle with a reference taken.
func (e *Engine) acquireHandle() (*handle, error) {
	for {
		if e.closed.Load() {
			return nil, errClosedEngine
		}
		if h := e.db.Load(); h.acquire() {
			return h, nil
		}
		// Retired between the load and the acquire: a compaction has
		// already stored its successor, or Close has retired it.
	}
}

// CompactAll implements engine.Engine: it flushes, then rewrites the file
// into a compact copy and swaps it in (see above). Reads go on throughout;
// commits go on into the overlay, and wait only if the overlay fills while
// flushes wait for the copy.
func (e *Engine) CompactAll() error {
	if err := e.Flush(); err != nil {
		return fmt.Errorf("compact all: %w", err)
	}
	e.flushMu.Lock()
	defer e.flushMu.Unlock()
	old := e.db.Load()
	tmp := e.path + ".compact"
	_ = os.Remove(tmp) // a copy left by a crash is incomplete
	dst, err := bolt.Open(tmp, 0o600, &bolt.Options{
		Timeout: openTimeout, InitialMmapSize: e.opts.InitialMmapSize,
		NoFreelistSync: true, FreelistType: bolt.FreelistMapType,
		// The copy is synced once, whole, before it is renamed into
		// place; until then nothing depends on it.
		NoSync: true,
	})
	if err != nil {
		return fmt.Errorf("compact all: create %s: %w", tmp, err)
	}
	start := time.Now()
	err = bolt.Compact(dst, old.db, compactTxBytes)
	if err == nil {
		err = dst.Sync()
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// The rename replaces the file atomically: a crash leaves the old
		// file or the new one, and both hold the same state.
		if err = os.Rename(tmp, e.path); err == nil {
			err = syncDir(e.dir)
		}
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("compact all: %w", err)
	}
	db, err := openBolt(e.path, e.opts)
	if err != nil {
		// The old handle still reads the old file's inode, but the path
		// now names the new file: flushes can no longer go on.
		err = fmt.Errorf("compact all: reopen %s: %w", e.path, err)
		e.mu.Lock()
		e.mu.err = err
		e.mu.cond.Broadcast()
		e.mu.Unlock()
		return err
	}
	e.db.Store(newHandle(db, e.logger))
	e.retiring.Add(1)
	go func() {
		defer e.retiring.Done()
		old.retire()
		<-old.closed
	}()
	e.logger.Info("bbolt engine compacted", zap.Duration("took", time.Since(start)), zap.Int64("disk-size", e.DiskSize()))
	return nil
}
