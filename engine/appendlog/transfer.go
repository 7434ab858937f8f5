package appendlog

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/strata-kv/strata/engine"
)

// ExportView is a consistent view of the whole engine, reserved keys
// included, for sending as a raft snapshot or writing as a backup.
type ExportView struct{ v *view }

// NewExportView takes a consistent view of the engine. It must be closed.
func (e *Engine) NewExportView() (*ExportView, error) {
	v, err := e.newView()
	if err != nil {
		return nil, fmt.Errorf("export view: %w", err)
	}
	return &ExportView{v: v}, nil
}

// AppliedIndex is the applied index the view holds.
func (x *ExportView) AppliedIndex() uint64 { return x.v.applied }

// ForEach calls fn with every key and value of the view, in key order. The
// slices passed to fn are valid only during the call.
func (x *ExportView) ForEach(fn func(key, value []byte) error) error {
	it := x.v.iter(nil, nil, nil)
	for ok := it.First(); ok; ok = it.Next() {
		val := it.Value()
		if val == nil && it.err != nil {
			break
		}
		if err := fn(it.Key(), val); err != nil {
			_ = it.Close()
			return err
		}
	}
	return it.Close()
}

// Reader reads the view (engine.ExportView); valid until Close.
func (x *ExportView) Reader() engine.Reader { return &snapshot{v: x.v} }

// Close releases the view.
func (x *ExportView) Close() error { return x.v.close() }

// SnapshotWriter stages a received snapshot as a data file whose header
// has the reset flag (FORMAT.md), so that InstallSnapshot only checks it
// and links it into the engine. Keys must be added in strictly increasing
// order.
type SnapshotWriter struct {
	path  string
	f     *os.File
	size  int64
	enc   frameEncoder
	open  bool
	last  []byte
	count uint64
}

// NewSnapshotWriter starts a staged snapshot file at path.
func (e *Engine) NewSnapshotWriter(path string) (*SnapshotWriter, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create snapshot file %s: %w", path, err)
	}
	if _, err := f.Write(header{flags: flagReset}.encode()); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("snapshot file %s: %w", path, err)
	}
	return &SnapshotWriter{path: path, f: f, size: headerSize}, nil
}

// Add appends a key and its value.
func (w *SnapshotWriter) Add(key, value []byte) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("snapshot file %s: %w", w.path, err)
	}
	if w.count > 0 && bytes.Compare(key, w.last) <= 0 {
		return fmt.Errorf("snapshot file %s: key %q not after %q", w.path, key, w.last)
	}
	if !w.open {
		w.enc.reset(0)
		w.open = true
	}
	w.enc.set(key, value)
	w.last = append(w.last[:0], key...)
	w.count++
	if w.enc.bodyLen() >= mergeFrameBytes {
		return w.writeFrame()
	}
	return nil
}

func (w *SnapshotWriter) writeFrame() error {
	w.open = false
	frame, err := w.enc.finish()
	if err != nil {
		return fmt.Errorf("snapshot file %s: %w", w.path, err)
	}
	if _, err := w.f.Write(frame); err != nil {
		return fmt.Errorf("snapshot file %s: %w", w.path, err)
	}
	w.size += int64(len(frame))
	return nil
}

// Finish writes the last frame and syncs the file.
func (w *SnapshotWriter) Finish() error {
	if w.open {
		if err := w.writeFrame(); err != nil {
			_ = w.f.Close()
			return err
		}
	}
	if err := w.f.Sync(); err != nil {
		_ = w.f.Close()
		return fmt.Errorf("finish snapshot file %s: sync: %w", w.path, err)
	}
	if err := w.f.Close(); err != nil {
		return fmt.Errorf("finish snapshot file %s: %w", w.path, err)
	}
	return nil
}

// Abort discards an unfinished file's writer; the caller removes the file.
func (w *SnapshotWriter) Abort() { _ = w.f.Close() }

// InstallSnapshot atomically and durably replaces the engine's whole
// content with the staged file at path and returns the applied index the
// engine now holds. The file is checked whole, then hard-linked (or, on
// another file system, copied and synced) into the engine's directory
// with an id above every file's; the directory sync that follows is the
// switch: from then on recovery ignores every older file (its reset flag,
// FORMAT.md). The caller (the applier) must not commit batches meanwhile;
// it may remove path afterwards.
func (e *Engine) InstallSnapshot(path string) (uint64, error) {
	applied, err := e.installSnapshot(path)
	if err != nil {
		return 0, fmt.Errorf("install snapshot file %s: %w", path, err)
	}
	return applied, nil
}

func (e *Engine) installSnapshot(path string) (uint64, error) {
	e.mergeMu.Lock()
	defer e.mergeMu.Unlock()
	e.writeMu.Lock()
	defer e.writeMu.Unlock()
	if err := e.stickyErr(); err != nil {
		return 0, err
	}
	id := (e.mu.active.id/idStep + 1) * idStep
	final := filepath.Join(e.dir, fileName(id))
	// Check the staged file whole before it is placed: once in the
	// directory it is the engine's state.
	seg, kd, applied, err := loadStaged(path, final, id)
	if err != nil {
		return 0, err
	}
	if err := os.Link(path, final); err != nil {
		// Another file system: copy it, and read the copy.
		_ = seg.f.Close()
		if err := copyFile(path, final, -1); err != nil {
			return 0, err
		}
		if seg, kd, applied, err = loadStaged(final, final, id); err != nil {
			_ = os.Remove(final)
			return 0, err
		}
	}
	if err := syncDir(e.dir); err != nil { // the switch
		_ = seg.f.Close()
		e.setErr(err)
		return 0, err
	}
	active, err := createSegment(e.dir, id+idStep, header{})
	if err != nil {
		// The snapshot is installed on disk; this process no longer
		// knows its files.
		_ = seg.f.Close()
		e.setErr(err)
		return 0, err
	}
	seg.ref()
	active.ref()
	e.mu.Lock()
	old := e.mu.segs
	e.mu.segs = []*segment{seg, active}
	e.mu.active = active
	e.mu.kd = kd
	e.mu.kdClone = nil
	// The install replaced the applied index outright; raft never sends a
	// snapshot older than the engine.
	e.applied.Store(applied)
	e.durable.Store(applied)
	e.mu.Unlock()
	for _, s := range old {
		s.obsolete.Store(true)
		s.unref()
	}
	e.kickHinter()
	return applied, nil
}

// loadStaged opens a staged snapshot file at path, checks every frame and
// builds its key directory, as the file of id at final.
func loadStaged(path, final string, id uint64) (*segment, *keydir, uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, 0, err
	}
	h, size, err := readHeader(f)
	if err == nil && h.flags&flagReset == 0 {
		err = fmt.Errorf("%w: not a staged snapshot (no reset flag)", errCorrupt)
	}
	if err != nil {
		_ = f.Close()
		return nil, nil, 0, err
	}
	seg := &segment{id: id, hdr: h, path: final, f: f, size: size, synced: size, sealed: true}
	kd := newKeydir()
	valid, err := replay(seg, kd, true)
	if err == nil && valid != size {
		err = fmt.Errorf("%w: staged snapshot ends with a bad frame at %d of %d bytes", errCorrupt, valid, size)
	}
	var applied uint64
	if err == nil {
		if _, l, ok := kd.Get(engine.AppliedIndexKey); ok {
			var v []byte
			if v, err = readLoc(l); err == nil {
				applied, err = decodeIndex(v)
			}
		}
	}
	if err != nil {
		_ = f.Close()
		return nil, nil, 0, err
	}
	return seg, kd, applied, nil
}

// Checkpoint implements engine.Engine: it flushes, seals the active file
// if it holds at least a sixteenth of MaxFileBytes (sealForCheckpoint),
// takes a view, and writes its files into dir: every sealed file as a hard
// link (files never change once sealed: a later backup copies only the
// files it lacks), the active file as a copy of the length the view saw.
// Then it syncs dir.
func (e *Engine) Checkpoint(dir string) (uint64, error) {
	if err := e.Flush(); err != nil {
		return 0, fmt.Errorf("checkpoint to %s: %w", dir, err)
	}
	if err := e.sealForCheckpoint(); err != nil {
		return 0, fmt.Errorf("checkpoint to %s: %w", dir, err)
	}
	if _, err := os.Stat(dir); err == nil {
		return 0, fmt.Errorf("checkpoint to %s: directory exists", dir)
	}
	if err := mkdirSynced(dir); err != nil {
		return 0, fmt.Errorf("checkpoint to %s: %w", dir, err)
	}
	v, err := e.newView()
	if err != nil {
		return 0, fmt.Errorf("checkpoint to %s: %w", dir, err)
	}
	defer v.close()
	for i, s := range v.segs {
		dst := filepath.Join(dir, fileName(s.id))
		if v.sealed[i] && os.Link(s.path, dst) == nil {
			// Its hint, if written yet, is immutable too; without it
			// the checkpoint's Open scans the file.
			_ = os.Link(hintPath(s.path), hintPath(dst))
			continue
		}
		if err := copyFile(s.path, dst, v.sizes[i]); err != nil {
			return 0, fmt.Errorf("checkpoint to %s: %w", dir, err)
		}
	}
	if err := syncDir(dir); err != nil {
		return 0, fmt.Errorf("checkpoint to %s: %w", dir, err)
	}
	return v.applied, nil
}

// copyFile copies the first n bytes of src (all if n < 0) to dst under a
// temporary name, syncs it and renames it into place (the caller syncs
// the directory).
func copyFile(src, dst string, n int64) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("open %s: %w", src, err)
	}
	defer in.Close()
	var r io.Reader = in
	if n >= 0 {
		r = io.LimitReader(in, n)
	}
	out, err := os.OpenFile(dst+tmpSuffix, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", dst+tmpSuffix, err)
	}
	copied, err := io.Copy(out, r)
	if err == nil && n >= 0 && copied != n {
		err = fmt.Errorf("copied %d of %d bytes", copied, n)
	}
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(dst+tmpSuffix, dst)
	}
	if err != nil {
		_ = os.Remove(dst + tmpSuffix)
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return nil
}

// CrashCopy writes into dst (an existing, empty directory) what a power
// cut at this instant could leave of the engine's files, for power-cut
// tests of this engine and of engines built on it: it waits for writes and
// merges in flight, then copies every file, each file of the set passed
// through tear with its synced prefix and the rest (tear returns the bytes
// to write; the unsynced part may be kept, cut, damaged or extended as a
// cut may leave it). Files outside the set (held by a reader, or a merge's
// temporary files) are copied whole. It returns the durable index reported
// before the cut.
func (e *Engine) CrashCopy(dst string, tear func(synced, unsynced []byte) []byte) (uint64, error) {
	e.hintMu.Lock()
	defer e.hintMu.Unlock()
	e.mergeMu.Lock()
	defer e.mergeMu.Unlock()
	e.writeMu.Lock()
	defer e.writeMu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	d := e.durable.Load()
	synced := map[string]int64{}
	for _, s := range e.mu.segs {
		synced[filepath.Base(s.path)] = s.synced
	}
	ents, err := os.ReadDir(e.dir)
	if err != nil {
		return 0, fmt.Errorf("crash copy: %w", err)
	}
	for _, de := range ents {
		data, err := os.ReadFile(filepath.Join(e.dir, de.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			// An obsolete file whose last reader (the hinter, which holds
			// none of the locks taken above when it lets go) removed it
			// since ReadDir. A crash now may or may not find it; recovery
			// ignores an obsolete file either way (segment.unref).
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("crash copy: %w", err)
		}
		if n, ok := synced[de.Name()]; ok && n <= int64(len(data)) {
			data = tear(data[:n:n], data[n:])
		}
		if err := os.WriteFile(filepath.Join(dst, de.Name()), data, 0o600); err != nil {
			return 0, fmt.Errorf("crash copy: %w", err)
		}
	}
	return d, nil
}

// sealForCheckpoint seals the active file before a checkpoint once it
// holds at least MaxFileBytes/16 bytes (4 MiB by default). A checkpoint
// copies the active file, and the next one holds it longer, so a backup
// after each would upload the whole active file every time (up to
// MaxFileBytes for a change of any size); sealed, it is hard-linked and
// the next backup finds it unchanged. A smaller active file is copied, so
// that frequent checkpoints do not leave a file each: what a backup
// uploads beyond the change is then at most MaxFileBytes/16, and the files
// a checkpoint adds are at least that large.
func (e *Engine) sealForCheckpoint() error {
	e.writeMu.Lock()
	defer e.writeMu.Unlock()
	if err := e.stickyErr(); err != nil {
		return err
	}
	// The active file changes only under writeMu (invariant 3).
	if e.mu.active.size-headerSize < e.opts.MaxFileBytes/16 {
		return nil
	}
	return e.rotateLocked()
}
