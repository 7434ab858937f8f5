package appendlog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/RaduBerinde/btreemap"
	"go.uber.org/zap"
)

// mergeFrameBytes is the body size at which a merge or a staged snapshot
// starts a new frame.
const mergeFrameBytes = 1 << 20

// mergeDueLocked reports whether the background merger should run: the
// sealed files hold at least MergeMinBytes and half of it is garbage.
// REQUIRES: e.mu held.
func (e *Engine) mergeDueLocked() bool {
	if e.opts.MergeMinBytes < 0 {
		return false
	}
	var size, dead int64
	for _, s := range e.mu.segs {
		if s.sealed {
			size += s.size
			dead += s.dead
		}
	}
	return size >= e.opts.MergeMinBytes && 2*dead >= size
}

// merger runs a merge each time a rotation finds one due.
func (e *Engine) merger() {
	defer close(e.done)
	for {
		select {
		case <-e.stop:
			return
		case <-e.kick:
			if err := e.merge(); err != nil {
				e.logger.Warn("appendlog: background merge failed; the old files stay", zap.Error(err))
			}
		}
	}
}

// CompactAll implements engine.Engine: a merge of every immutable file
// (the active file is sealed first, so it is one of them). Commits and
// reads go on meanwhile.
func (e *Engine) CompactAll() error {
	if err := e.merge(); err != nil {
		return fmt.Errorf("compact appendlog engine in %s: %w", e.dir, err)
	}
	return nil
}

func closeOuts(outs []*segment) {
	for _, s := range outs {
		_ = s.f.Close()
	}
}

func (e *Engine) mergeHook(p MergePoint) {
	if e.opts.MergeHook != nil {
		e.opts.MergeHook(p)
	}
}

// moved is one value a merge rewrote.
type moved struct {
	key      []byte
	old, new loc
}

// merge rewrites the live values of every sealed file into new files that
// supersede them (FORMAT.md: base), then points the key directory at the
// copies and drops the old files from the set (Engine invariants 5, 6, 8).
func (e *Engine) merge() error {
	e.mergeMu.Lock()
	defer e.mergeMu.Unlock()
	// Seal the active file if it holds anything, so that the merge covers
	// every batch committed before the call.
	e.writeMu.Lock()
	if err := e.stickyErr(); err != nil {
		e.writeMu.Unlock()
		return err
	}
	var err error
	if e.mu.active.size > headerSize {
		err = e.rotateLocked()
	}
	cut := e.mu.active.id
	// The view is taken before writers resume: it must hold exactly the
	// batches before the cut, which are synced. A batch committed after
	// the cut lives in a newer file that a power cut may lose; had the
	// view seen it, a key it deleted or overwrote would have been left out
	// of the outputs, and lost with it (TestMergeSeesOnlyTheCut).
	var v *view
	if err == nil && cut != e.lastCut {
		v, err = e.newView()
	}
	e.writeMu.Unlock()
	if err != nil {
		return err
	}
	e.mergeHook(MergeAfterCut)
	if cut == e.lastCut {
		// Nothing was committed since the last merge, which cut here: its
		// outputs are all there is, and a second merge at the same cut
		// would reuse their ids.
		return nil
	}
	defer v.close()
	var olds []*segment
	for _, s := range v.segs {
		if s.id < cut {
			olds = append(olds, s)
		}
	}
	if len(olds) == 0 {
		return nil
	}
	w := &mergeWriter{dir: e.dir, cut: cut, maxSize: e.opts.MaxFileBytes}
	defer w.abort()
	var moves []moved
	var werr error
	v.kd.AscendFunc(btreemap.Min[[]byte](), btreemap.Max[[]byte](), func(k []byte, l loc) bool {
		if l.seg.id >= cut {
			return true
		}
		val, err := readLoc(l)
		if err != nil {
			werr = err
			return false
		}
		nl, err := w.add(k, val)
		if err != nil {
			werr = err
			return false
		}
		moves = append(moves, moved{key: k, old: l, new: nl})
		return true
	})
	if werr != nil {
		return werr
	}
	outs, err := w.finish()
	if err != nil {
		return err
	}
	// Point a clone of the key directory at the copies, outside mu: the
	// moves take time in proportion to the live keys, and commits and
	// views go on meanwhile. Commits record the keys they write (invariant
	// 8), which the step under mu below takes into the clone.
	e.mu.Lock()
	if e.mu.closed {
		e.mu.Unlock()
		closeOuts(outs)
		return errEngineClosed
	}
	kd := e.mu.kd.Clone()
	e.mu.swapping = true
	e.mu.Unlock()
	for _, m := range moves {
		if _, cur, ok := kd.Get(m.key); ok && cur == m.old {
			kd.ReplaceOrInsert(m.key, m.new)
		} else {
			m.new.seg.dead += int64(m.new.n) + int64(len(m.key)) // replaced before the clone
		}
	}
	e.mergeHook(MergeSwap)
	isOut := make(map[*segment]bool, len(outs))
	for _, s := range outs {
		isOut[s] = true
	}
	e.mu.Lock()
	written := e.mu.swapKeys
	e.mu.swapping, e.mu.swapKeys = false, nil
	if e.mu.closed {
		// Close ran meanwhile. The outputs are in place and hold the same
		// data as the files they supersede, so recovery reads either.
		e.mu.Unlock()
		closeOuts(outs)
		return errEngineClosed
	}
	// The keys committed since the clone: their location in the key
	// directory is newer than any copy (it is in a file at or above the
	// cut), and a copy it replaced is garbage. A key written twice is
	// charged once: the first pass leaves no copy in the clone.
	for _, k := range written {
		_, l, had := kd.Get(k)
		if had && isOut[l.seg] {
			l.seg.dead += int64(l.n) + int64(len(k))
		}
		if _, cur, ok := e.mu.kd.Get(k); ok {
			kd.ReplaceOrInsert(k, cur)
		} else if had {
			kd.Delete(k)
		}
	}
	e.mu.kd = kd
	segs := append([]*segment(nil), outs...)
	var dropped []*segment
	for _, s := range e.mu.segs {
		if s.id >= cut {
			segs = append(segs, s)
		} else {
			dropped = append(dropped, s)
		}
	}
	for _, s := range outs {
		s.ref()
	}
	e.mu.segs = segs
	e.mu.kdClone = nil
	e.mu.Unlock()
	for _, s := range dropped {
		s.obsolete.Store(true)
		s.unref()
	}
	e.lastCut = cut
	e.kickHinter()
	return nil
}

// mergeWriter writes a merge's output files: ids cut-idStep+1, ... with
// header base cut, each written under a temporary name, then synced and
// renamed into place by finish.
type mergeWriter struct {
	dir     string
	cut     uint64
	maxSize int64
	segs    []*segment
	cur     *segment
	enc     frameEncoder
	encOpen bool
	done    bool
}

// add appends a record and returns its value's location (valid once
// finish has returned).
func (w *mergeWriter) add(key, value []byte) (loc, error) {
	if w.cur == nil {
		if err := w.newFile(); err != nil {
			return loc{}, err
		}
	}
	if !w.encOpen {
		w.enc.reset(0)
		w.encOpen = true
	}
	off := w.enc.set(key, value)
	l := loc{seg: w.cur, off: w.cur.size + int64(off), n: uint32(len(value))}
	if int64(w.enc.bodyLen()) >= min(mergeFrameBytes, w.maxSize) {
		if err := w.writeFrame(); err != nil {
			return loc{}, err
		}
		if w.cur.size >= w.maxSize {
			if err := w.sealFile(); err != nil {
				return loc{}, err
			}
		}
	}
	return l, nil
}

func (w *mergeWriter) newFile() error {
	n := uint64(len(w.segs))
	if n+2 >= idStep { // the last id below cut is the marker's
		return errors.New("merge: too many output files")
	}
	id := w.cut - idStep + 1 + n
	final := filepath.Join(w.dir, fileName(id))
	if _, err := os.Stat(final); err == nil {
		return fmt.Errorf("merge: output %s exists", final)
	}
	f, err := os.OpenFile(final+tmpSuffix, os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("merge: create %s: %w", final+tmpSuffix, err)
	}
	h := header{base: w.cut}
	if _, err := f.Write(h.encode()); err != nil {
		_ = f.Close()
		return fmt.Errorf("merge: write %s: %w", final+tmpSuffix, err)
	}
	w.cur = &segment{id: id, hdr: h, path: final, f: f, size: headerSize, sealed: true}
	w.segs = append(w.segs, w.cur)
	return nil
}

func (w *mergeWriter) writeFrame() error {
	if !w.encOpen {
		return nil
	}
	w.encOpen = false
	frame, err := w.enc.finish()
	if err != nil {
		return err
	}
	if _, err := w.cur.f.WriteAt(frame, w.cur.size); err != nil {
		return fmt.Errorf("merge: write %s: %w", w.cur.path+tmpSuffix, err)
	}
	w.cur.size += int64(len(frame))
	return nil
}

func (w *mergeWriter) sealFile() error {
	if err := w.cur.f.Sync(); err != nil {
		return fmt.Errorf("merge: sync %s: %w", w.cur.path+tmpSuffix, err)
	}
	w.cur.synced = w.cur.size
	w.cur = nil
	return nil
}

// finish writes the last frame, syncs every output, renames them into
// place and syncs the directory; then it writes the merge's marker (id
// cut-1: a header with base cut and the marker flag), which is what
// supersedes the merged files (FORMAT.md), synced, renamed, directory
// synced. A crash before the marker's rename leaves outputs that recovery
// replays after the files they copy, which changes nothing. It returns the
// outputs and the marker, all for the set.
func (w *mergeWriter) finish() ([]*segment, error) {
	if w.cur != nil {
		if err := w.writeFrame(); err != nil {
			return nil, err
		}
		if err := w.sealFile(); err != nil {
			return nil, err
		}
	}
	for _, s := range w.segs {
		if err := os.Rename(s.path+tmpSuffix, s.path); err != nil {
			return nil, fmt.Errorf("merge: rename %s: %w", s.path, err)
		}
	}
	if err := syncDir(w.dir); err != nil {
		return nil, fmt.Errorf("merge: %w", err)
	}
	id := w.cut - 1
	final := filepath.Join(w.dir, fileName(id))
	h := header{base: w.cut, flags: flagMarker}
	f, err := os.OpenFile(final+tmpSuffix, os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("merge: create %s: %w", final+tmpSuffix, err)
	}
	marker := &segment{id: id, hdr: h, path: final, f: f, size: headerSize, synced: headerSize, sealed: true}
	w.segs = append(w.segs, marker)
	if _, err := f.Write(h.encode()); err != nil {
		return nil, fmt.Errorf("merge: write %s: %w", final+tmpSuffix, err)
	}
	if err := f.Sync(); err != nil {
		return nil, fmt.Errorf("merge: sync %s: %w", final+tmpSuffix, err)
	}
	if err := os.Rename(final+tmpSuffix, final); err != nil {
		return nil, fmt.Errorf("merge: rename %s: %w", final, err)
	}
	// From here the marker may be on disk: the outputs must stay. Should
	// the directory sync fail, the set keeps the old files, which the
	// outputs copy, and the next merge supersedes both.
	w.done = true
	if err := syncDir(w.dir); err != nil {
		for _, s := range w.segs {
			_ = s.f.Close()
		}
		return nil, fmt.Errorf("merge: %w", err)
	}
	return w.segs, nil
}

// abort closes and removes the files of an unfinished merge: renamed
// outputs without their marker change nothing on recovery, but take room.
func (w *mergeWriter) abort() {
	if w.done {
		return
	}
	for _, s := range w.segs {
		_ = s.f.Close()
		_ = os.Remove(s.path + tmpSuffix)
		_ = os.Remove(s.path)
	}
	w.done = true
}
