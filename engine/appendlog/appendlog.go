package appendlog

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/RaduBerinde/btreemap"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/internal/failpoint"
)

// DefaultMaxFileBytes is the active file's size at which it is sealed and a
// new one started, when Options.MaxFileBytes is 0.
const DefaultMaxFileBytes = 64 << 20

// maxKeptFrame is the largest frame buffer a commit keeps for the next
// one; a larger one (hybridlog writes a whole flush as one batch) is
// dropped, so that the engine does not hold it for good.
const maxKeptFrame = 4 << 20

// DefaultMergeMinBytes is the size of the immutable files below which the
// background merger does not run, when Options.MergeMinBytes is 0.
const DefaultMergeMinBytes = 64 << 20

// Options configure Open.
type Options struct {
	// MaxFileBytes is the size at which the active file is synced, sealed
	// and replaced by a new one; 0 means DefaultMaxFileBytes.
	MaxFileBytes int64
	// MergeMinBytes: the background merger runs once the immutable files
	// hold at least this many bytes and half of them are garbage; 0 means
	// DefaultMergeMinBytes, a negative value turns the merger off
	// (CompactAll still merges).
	MergeMinBytes int64
	// SyncCommits syncs every Commit before it returns (Flush): the
	// double-logging baseline, as engine/pebble's EnableWAL. Off by default.
	SyncCommits bool
	// Logger receives the engine's warnings; nil means zap.NewNop().
	Logger *zap.Logger

	// MergeHook, if set, is called by every merge at each MergePoint, on
	// the merge's goroutine, holding no lock that commits or reads take (a
	// merge holds mergeMu throughout): a test passes it to hold a merge at
	// a point while it commits and reads. nil in production.
	MergeHook func(MergePoint)
}

// MergePoint names a point of a merge, for Options.MergeHook.
type MergePoint int

const (
	// MergeAfterCut: the active file is sealed (the cut) and the merge's
	// view taken; writers commit again.
	MergeAfterCut MergePoint = iota
	// MergeSwap: the outputs are in place and the merge has pointed its
	// clone of the key directory at them, before it takes in the keys
	// committed meanwhile and installs it (invariant 8).
	MergeSwap
)

// segment is one open data file.
type segment struct {
	id   uint64
	hdr  header
	path string
	f    *os.File
	// refs counts the engine's set (one) and every view holding the file.
	// At zero the file is closed, and removed if obsolete.
	refs     atomic.Int32
	obsolete atomic.Bool

	// Guarded by Engine.mu; written only by the holder of Engine.writeMu
	// or, for a file not in the set yet, its creator.
	size   int64 // bytes of header and complete frames
	synced int64 // bytes known to be on disk
	sealed bool  // no longer appended to
	dead   int64 // bytes of values and keys overwritten or deleted
	// hinted: the file's hint file is in place (hint.go), of hintBytes.
	hinted    bool
	hintBytes int64
}

func (s *segment) ref() { s.refs.Add(1) }

func (s *segment) unref() {
	if s.refs.Add(-1) != 0 {
		return
	}
	_ = s.f.Close()
	if s.obsolete.Load() {
		// Recovery ignores an obsolete file whichever of them survive
		// (FORMAT.md, Recovery 3), and removes the hint of a file it
		// does not replay, so neither the order of removals nor a
		// directory sync matters here.
		_ = os.Remove(hintPath(s.path))
		_ = os.Remove(s.path)
	}
}

// loc is where a key's latest value is: a file and the value's offset and
// length in it.
type loc struct {
	seg *segment
	off int64
	n   uint32
}

// keydir is the ordered key directory: key -> loc.
type keydir = btreemap.BTreeMap[[]byte, loc]

func newKeydir() *keydir { return btreemap.New[[]byte, loc](32, bytes.Compare) }

// Engine is engine.Engine on append-only data files and an in-memory,
// ordered key directory (see the package comment and FORMAT.md).
//
// Invariants:
//  1. Files are append-only. Only the active file is appended to, only by
//     the holder of writeMu, one whole frame per batch (Commit) at
//     offset size; size then grows under mu. A sealed file never changes.
//  2. A batch is one frame ending with its engine.AppliedIndexKey record;
//     the key directory takes all of its records and the applied index
//     under mu in one step, after the frame is written: a reader sees a
//     batch whole or not at all, and every location it sees is in bytes
//     already written.
//  3. Before a new active file is created, the old one is synced whole
//     (rotation); files are created with their header synced and the
//     directory synced. So only the active file can hold unsynced bytes,
//     and after a power cut the files hold a prefix of the frames: a
//     prefix of the committed batches (recovery stops at the first bad
//     frame of the newest file).
//  4. durable (D) is raised only after an fsync returned, to the applied
//     index read together with the synced length: every batch <= D is in
//     synced bytes. durable <= applied; applied never decreases (Commit
//     refuses a lower index), except that InstallSnapshot sets both.
//  5. A key directory location points into a file of the set (segs), and
//     the set holds a reference on each of its files; a view holds a clone
//     of the directory and a reference on every file of the set when it
//     was taken, so every location it holds stays readable until it is
//     closed. A file leaves the set only under mu, marked obsolete.
//  6. The files recovery reads are exactly the set: a merge's outputs
//     supersede the files it rewrote, an installed snapshot every older
//     file, by their headers, before those files leave the set.
//  7. A hint file is written only for a sealed file, from its frames, and
//     is in place (synced, renamed, directory synced) before hinted is
//     set; recovery uses a hint only when its CRC holds and it names the
//     file's id, header and length, so replaying it gives the key
//     directory and dead bytes that scanning the file gives.
//  8. A merge points a clone of the key directory at its copies outside
//     mu, with swapping set; meanwhile every commit appends the keys it
//     writes to swapKeys, under mu with the key directory. The merge then,
//     in one hold of mu, takes each of those keys' current location (or
//     absence) from the key directory into the clone, installs the clone
//     and swaps the set: the installed directory holds every commit, and
//     commits and views wait for that step only, in proportion to the keys
//     committed during the merge's moves, not to the live keys.
//
// Concurrency: writeMu serialises the writers of files (Commit, rotation,
// InstallSnapshot, a merge's rotation); mu guards the key directory, the
// set and the segments' sizes; mergeMu serialises merges; hintMu is held
// while a hint file is written (CrashCopy takes it, so that it copies a
// hint whole or not at all). Lock order: hintMu, mergeMu, writeMu, mu.
// Engine.Get holds mu shared while it reads the value (so its file stays
// open); nothing else does I/O under mu.
type Engine struct {
	dir    string
	opts   Options
	logger *zap.Logger

	writeMu sync.Mutex
	enc     frameEncoder // guarded by writeMu
	pending []pendingOp  // guarded by writeMu

	mu struct {
		sync.RWMutex
		kd      *keydir
		kdClone *keydir // read-only clone for views; nil once kd changed
		segs    []*segment
		active  *segment
		err     error // sticky: a failed write or sync stops the engine
		closed  bool
		// swapping: a merge is pointing a clone of kd at its copies;
		// commits append the keys they write to swapKeys (invariant 8).
		swapping bool
		swapKeys [][]byte
	}
	mergeMu sync.Mutex
	lastCut uint64 // the cut of the last merge; guarded by mergeMu
	hintMu  sync.Mutex

	applied atomic.Uint64
	durable atomic.Uint64

	kick     chan struct{}
	stop     chan struct{}
	done     chan struct{}
	hintKick chan struct{} // wakes the hinter
	hintDone chan struct{} // closed when the hinter returns

	// openHinted and openScanned count the live files holding frames that
	// Open read through their hint and by scanning (set by Open only).
	openHinted, openScanned int
	closeOnce               sync.Once
}

var _ engine.Engine = (*Engine)(nil)

// pendingOp is one record of the frame being committed.
type pendingOp struct {
	key []byte
	off int // value offset in the frame; -1 for a deletion
	n   int
}

// Open opens (creating if needed) the engine in dir, recovering its files
// (FORMAT.md, Recovery), and starts the background merger.
func Open(dir string, opts Options) (*Engine, error) {
	if opts.MaxFileBytes <= 0 {
		opts.MaxFileBytes = DefaultMaxFileBytes
	}
	if opts.MergeMinBytes == 0 {
		opts.MergeMinBytes = DefaultMergeMinBytes
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	e := &Engine{dir: dir, opts: opts, logger: opts.Logger,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		hintKick: make(chan struct{}, 1), hintDone: make(chan struct{})}
	if err := e.recover(); err != nil {
		return nil, fmt.Errorf("open appendlog engine in %s: %w", dir, err)
	}
	go e.merger()
	go e.hinter()
	e.kickHinter() // the files recovery scanned
	return e, nil
}

// recover implements FORMAT.md's recovery and creates the active file.
func (e *Engine) recover() error {
	if err := mkdirSynced(e.dir); err != nil {
		return err
	}
	ents, err := os.ReadDir(e.dir)
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	var ids, hintIDs []uint64
	for _, de := range ents {
		name := de.Name()
		if strings.HasSuffix(name, tmpSuffix) {
			if err := os.Remove(filepath.Join(e.dir, name)); err != nil {
				return fmt.Errorf("remove %s: %w", name, err)
			}
			continue
		}
		if id, ok := parseFileName(name); ok {
			ids = append(ids, id)
		}
		if id, ok := parseHintName(name); ok {
			hintIDs = append(hintIDs, id)
		}
	}
	slices.Sort(ids)
	var all []*segment
	closeAll := func() {
		for _, s := range all {
			_ = s.f.Close()
		}
	}
	var cutoff, maxID uint64
	for i, id := range ids {
		path := filepath.Join(e.dir, fileName(id))
		f, err := os.Open(path)
		if err != nil {
			closeAll()
			return fmt.Errorf("open %s: %w", path, err)
		}
		h, size, err := readHeader(f)
		if err != nil {
			if i == len(ids)-1 && size < headerSize && errors.Is(err, errCorrupt) {
				// The newest file's creation was torn before its header
				// was synced: it holds nothing.
				_ = f.Close()
				if err := os.Remove(path); err != nil {
					closeAll()
					return fmt.Errorf("remove torn %s: %w", path, err)
				}
				continue
			}
			_ = f.Close()
			closeAll()
			return fmt.Errorf("%s: %w", path, err)
		}
		all = append(all, &segment{id: id, hdr: h, path: path, f: f, size: size})
		cutoff = max(cutoff, h.supersedes(id))
		maxID = max(maxID, id)
	}
	var live, obsolete []*segment
	for _, s := range all {
		if s.id >= cutoff || (cutoff > 0 && s.hdr.base == cutoff) {
			live = append(live, s)
		} else {
			obsolete = append(obsolete, s)
		}
	}
	kd := newKeydir()
	for i, s := range live {
		last := i == len(live)-1
		if !last && s.size > headerSize {
			// A sealed file: its hint, if usable, stands for its frames.
			// The newest file may have a torn tail and is always read.
			h, n, err := loadHint(s)
			if err == nil {
				applyHint(s, kd, h)
				s.synced, s.sealed, s.hinted, s.hintBytes = s.size, true, true, n
				e.openHinted++
				continue
			}
			if !errors.Is(err, os.ErrNotExist) {
				e.logger.Warn("appendlog: ignoring a hint file; scanning its data file", zap.String("file", s.path), zap.Error(err))
			}
		}
		valid, err := replay(s, kd, last)
		if err != nil {
			closeAll()
			return err
		}
		if s.size > headerSize {
			e.openScanned++
		}
		if last && valid < s.size {
			e.logger.Warn("appendlog: dropping a torn tail", zap.String("file", s.path),
				zap.Int64("valid", valid), zap.Int64("size", s.size))
			if err := os.Truncate(s.path, valid); err != nil {
				closeAll()
				return fmt.Errorf("truncate torn tail of %s: %w", s.path, err)
			}
		}
		s.size, s.synced, s.sealed = valid, valid, true
		if last {
			// A process crash leaves unsynced bytes in the page cache
			// that this replay read: sync them before they count as
			// durable (invariant 4).
			if err := syncFile(s.path); err != nil {
				closeAll()
				return err
			}
		}
	}
	for _, s := range obsolete {
		_ = s.f.Close()
		if err := os.Remove(s.path); err != nil {
			closeAll()
			return fmt.Errorf("remove superseded %s: %w", s.path, err)
		}
	}
	liveIDs := map[uint64]bool{}
	for _, s := range live {
		liveIDs[s.id] = true
	}
	removedHints := false
	for _, id := range hintIDs {
		// The hint of a superseded file, or of none: a file removed
		// before its hint was.
		if !liveIDs[id] {
			path := hintPath(filepath.Join(e.dir, fileName(id)))
			if err := os.Remove(path); err != nil {
				closeAll()
				return fmt.Errorf("remove stale hint %s: %w", path, err)
			}
			removedHints = true
		}
	}
	if len(obsolete) > 0 || removedHints {
		if err := syncDir(e.dir); err != nil {
			closeAll()
			return err
		}
	}
	active, err := createSegment(e.dir, (maxID/idStep+1)*idStep, header{})
	if err != nil {
		closeAll()
		return err
	}
	for _, s := range live {
		s.ref()
	}
	active.ref()
	e.mu.kd = kd
	e.mu.segs = append(live, active)
	e.mu.active = active
	var applied uint64
	if _, l, ok := kd.Get(engine.AppliedIndexKey); ok {
		v, err := readLoc(l)
		if err == nil {
			applied, err = decodeIndex(v)
		}
		if err != nil {
			e.closeSegs()
			return fmt.Errorf("read applied index: %w", err)
		}
	}
	e.applied.Store(applied)
	e.durable.Store(applied)
	e.logger.Info("appendlog: recovered", zap.String("dir", e.dir), zap.Uint64("applied-index", applied),
		zap.Int("files-read-by-hint", e.openHinted), zap.Int("files-scanned", e.openScanned))
	return nil
}

// replay applies every frame of s to kd and returns the length of its
// valid prefix. A bad frame ends the replay: in the last file it is a torn
// tail, elsewhere corruption.
func replay(s *segment, kd *keydir, last bool) (int64, error) {
	fr := &frameReader{r: bufio.NewReaderSize(io.NewSectionReader(s.f, headerSize, s.size-headerSize), 1<<20), off: headerSize}
	for {
		_, frame, start, err := fr.next()
		if err == io.EOF {
			return fr.off, nil
		}
		if errors.Is(err, errTorn) {
			if last {
				return fr.off, nil
			}
			return 0, fmt.Errorf("%s: %w: %v", s.path, errCorrupt, err)
		}
		if err != nil {
			return 0, fmt.Errorf("%s: %w", s.path, err)
		}
		err = decodeRecords(frame, func(r record) error {
			if r.del {
				if old, ok := deleteKey(kd, r.key); ok {
					old.seg.dead += int64(old.n) + int64(len(r.key))
				}
				return nil
			}
			l := loc{seg: s, off: start + int64(r.valueOff), n: uint32(len(r.value))}
			if _, old, ok := kd.ReplaceOrInsert(bytes.Clone(r.key), l); ok {
				old.seg.dead += int64(old.n) + int64(len(r.key))
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("%s: frame at %d: %w", s.path, start, err)
		}
	}
}

func deleteKey(kd *keydir, key []byte) (loc, bool) {
	_, l, ok := kd.Delete(key)
	return l, ok
}

// createSegment creates a data file with its header, synced, and syncs
// the directory (invariant 3).
func createSegment(dir string, id uint64, h header) (*segment, error) {
	path := filepath.Join(dir, fileName(id))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	if _, err := f.Write(h.encode()); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("write header of %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("sync %s: %w", path, err)
	}
	if err := syncDir(dir); err != nil {
		_ = f.Close()
		return nil, err
	}
	return &segment{id: id, hdr: h, path: path, f: f, size: headerSize, synced: headerSize}, nil
}

// readLoc reads a value.
func readLoc(l loc) ([]byte, error) {
	v := make([]byte, l.n)
	if _, err := l.seg.f.ReadAt(v, l.off); err != nil {
		return nil, fmt.Errorf("read %d bytes at %d of %s: %w", l.n, l.off, l.seg.path, err)
	}
	return v, nil
}

func decodeIndex(v []byte) (uint64, error) {
	if len(v) != 8 {
		return 0, fmt.Errorf("applied index of %d bytes, want 8", len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

func encodeIndex(i uint64) []byte { return binary.BigEndian.AppendUint64(nil, i) }

// AppliedIndex implements engine.Engine.
func (e *Engine) AppliedIndex() uint64 { return e.applied.Load() }

// DurableIndex implements engine.Engine (invariant 4).
func (e *Engine) DurableIndex() uint64 { return e.durable.Load() }

func (e *Engine) raiseDurable(idx uint64) {
	for {
		d := e.durable.Load()
		if idx <= d || e.durable.CompareAndSwap(d, idx) {
			return
		}
	}
}

func (e *Engine) stickyErr() error {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.mu.closed {
		return errEngineClosed
	}
	return e.mu.err
}

func (e *Engine) setErr(err error) {
	e.mu.Lock()
	if e.mu.err == nil {
		e.mu.err = err
	}
	e.mu.Unlock()
	e.logger.Error("appendlog engine failed; it refuses further commits", zap.Error(err))
}

var errEngineClosed = errors.New("appendlog engine closed")

// commit writes a batch's own writes (in key order), its tails' (in
// order) and the applied index as one frame, then applies them to the key
// directory (invariants 1 and 2).
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
	if err := e.stickyErr(); err != nil {
		return err
	}
	if cur := e.applied.Load(); appliedIndex < cur {
		return fmt.Errorf("applied index %d below the engine's %d", appliedIndex, cur)
	}
	e.enc.reset(appliedIndex)
	ops := e.pending[:0]
	add := func(k []byte, en entry) {
		if en.del {
			e.enc.del(k)
			ops = append(ops, pendingOp{key: k, off: -1})
		} else {
			ops = append(ops, pendingOp{key: k, off: e.enc.set(k, en.value), n: len(en.value)})
		}
	}
	if own != nil {
		own.AscendFunc(btreemap.Min[[]byte](), btreemap.Max[[]byte](), func(k []byte, en entry) bool {
			add(k, en)
			return true
		})
	}
	for _, t := range tails {
		for _, o := range t.ops {
			add(o.key, entry{value: o.value, del: o.del})
		}
	}
	add(engine.AppliedIndexKey, entry{value: encodeIndex(appliedIndex)})
	e.pending = ops[:0]
	frame, err := e.enc.finish()
	if err != nil {
		return err
	}
	seg := e.mu.active // changes only under writeMu
	base := seg.size
	if _, err := seg.f.WriteAt(frame, base); err != nil {
		err = fmt.Errorf("write %d bytes at %d of %s: %w", len(frame), base, seg.path, err)
		e.setErr(err)
		return err
	}
	e.mu.Lock()
	kd := e.mu.kd
	for _, o := range ops {
		if o.off < 0 {
			if old, ok := deleteKey(kd, o.key); ok {
				old.seg.dead += int64(old.n) + int64(len(o.key))
			}
			continue
		}
		l := loc{seg: seg, off: base + int64(o.off), n: uint32(o.n)}
		if _, old, ok := kd.ReplaceOrInsert(o.key, l); ok {
			old.seg.dead += int64(old.n) + int64(len(o.key))
		}
	}
	if e.mu.swapping {
		for _, o := range ops {
			e.mu.swapKeys = append(e.mu.swapKeys, o.key) // invariant 8
		}
	}
	seg.size += int64(len(frame))
	e.mu.kdClone = nil
	e.applied.Store(appliedIndex)
	e.mu.Unlock()
	clear(ops)
	if cap(e.enc.buf) > maxKeptFrame {
		e.enc.buf = nil // a large batch's buffers are not kept for the next
		e.pending = nil
	}
	if seg.size >= e.opts.MaxFileBytes {
		return e.rotateLocked()
	}
	return nil
}

// rotateLocked syncs and seals the active file and creates the next one
// (invariant 3), then raises the durable index to what the sealed file
// holds. REQUIRES: e.writeMu held.
func (e *Engine) rotateLocked() error {
	old := e.mu.active
	applied := e.applied.Load()
	if err := old.f.Sync(); err != nil {
		err = fmt.Errorf("sync %s: %w", old.path, err)
		e.setErr(err)
		return err
	}
	next, err := createSegment(e.dir, (old.id/idStep+1)*idStep, header{})
	if err != nil {
		e.setErr(err)
		return err
	}
	next.ref()
	e.mu.Lock()
	old.sealed = true
	old.synced = old.size
	e.mu.segs = append(e.mu.segs, next)
	e.mu.active = next
	kick := e.mergeDueLocked()
	e.mu.Unlock()
	e.raiseDurable(applied)
	e.kickHinter()
	if kick {
		select {
		case e.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// Flush implements engine.Engine: it syncs the active file and raises the
// durable index to the applied index read with the file's length
// (invariant 4). Commits go on while it syncs.
func (e *Engine) Flush() error {
	e.mu.RLock()
	if e.mu.closed || e.mu.err != nil {
		err := e.mu.err
		if err == nil {
			err = errEngineClosed
		}
		e.mu.RUnlock()
		return fmt.Errorf("flush appendlog engine in %s: %w", e.dir, err)
	}
	seg := e.mu.active
	n := seg.size
	applied := e.applied.Load()
	seg.ref()
	e.mu.RUnlock()
	defer seg.unref()
	failpoint.Hit("engine/before-flush")
	if err := seg.f.Sync(); err != nil {
		err = fmt.Errorf("flush appendlog engine in %s: sync %s: %w", e.dir, seg.path, err)
		e.setErr(err)
		return err
	}
	failpoint.Hit("engine/after-flush")
	e.mu.Lock()
	seg.synced = max(seg.synced, n)
	e.mu.Unlock()
	e.raiseDurable(applied)
	return nil
}

// MaxKeySize implements engine.Engine: a record's key length is checked
// against 64 KiB on write and on recovery (FORMAT.md).
func (e *Engine) MaxKeySize() int { return maxKeySize }

// DiskSize implements engine.Engine: the bytes of the files in the set and
// of their hint files (obsolete files still held by a reader are not
// counted).
func (e *Engine) DiskSize() int64 {
	e.mu.RLock()
	defer e.mu.RUnlock()
	var n int64
	for _, s := range e.mu.segs {
		n += s.size + s.hintBytes
	}
	return n
}

// Close stops the merger, syncs the active file and closes every file
// once no view holds it.
func (e *Engine) Close() error {
	var err error
	e.closeOnce.Do(func() {
		close(e.stop)
		<-e.done
		<-e.hintDone
		e.writeMu.Lock()
		defer e.writeMu.Unlock()
		if ferr := e.Flush(); ferr != nil && !errors.Is(ferr, errEngineClosed) {
			err = ferr
		}
		e.mu.Lock()
		e.mu.closed = true
		e.mu.Unlock()
		e.closeSegs()
	})
	return err
}

// closeSegs drops the set's reference on every file.
func (e *Engine) closeSegs() {
	e.mu.Lock()
	segs := e.mu.segs
	e.mu.segs = nil
	e.mu.Unlock()
	for _, s := range segs {
		s.unref()
	}
}

// mkdirSynced creates dir and its missing parents, syncing each parent
// after creating a child in it.
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

func syncDir(dir string) error { return syncFile(dir) }

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
}
