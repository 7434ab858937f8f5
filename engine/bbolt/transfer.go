package bbolt

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"os"

	bolt "go.etcd.io/bbolt"

	"github.com/strata-kv/strata/engine"
)

// Raft snapshots and backups move the engine's whole content. The leader
// exports every key of a consistent view (engine.AppliedIndexKey included)
// in the stream format package snapshot defines, the same for every
// engine. The receiver stages the keys in a file (the staged format
// below: it never leaves the member) and InstallSnapshot loads it into a
// fresh data bucket in one synced bbolt transaction, which also bumps the
// install generation; a crash before the commit leaves the old state,
// after it the new one, and readers holding older overlays drop them
// (Engine invariant 6).

// ExportView is a consistent view of the whole engine, reserved keys
// included, for sending as a raft snapshot.
type ExportView struct {
	v       *view
	applied uint64
}

// NewExportView takes a consistent view of the engine. It must be closed.
func (e *Engine) NewExportView() (*ExportView, error) {
	v, err := e.newView()
	if err != nil {
		return nil, fmt.Errorf("export view: %w", err)
	}
	raw, err := v.get(engine.AppliedIndexKey)
	if errors.Is(err, engine.ErrNotFound) {
		raw, err = nil, nil
	}
	applied, derr := decodeIndex(raw)
	if err == nil {
		err = derr
	}
	if err != nil {
		_ = v.close()
		return nil, fmt.Errorf("export view: %w", err)
	}
	return &ExportView{v: v, applied: applied}, nil
}

// AppliedIndex is the applied index the view holds.
func (x *ExportView) AppliedIndex() uint64 { return x.applied }

// ForEach calls fn with every key and value of the view, in key order. The
// slices passed to fn are valid only during the call.
func (x *ExportView) ForEach(fn func(key, value []byte) error) error {
	it := newMergeIter(x.v.kids(), nil, nil, nil)
	for ok := it.First(); ok; ok = it.Next() {
		if err := fn(it.Key(), it.Value()); err != nil {
			return err
		}
	}
	return it.Close()
}

// Reader reads the view (engine.ExportView); valid until Close.
func (x *ExportView) Reader() engine.Reader { return &snapshot{v: x.v} }

// Close releases the view.
func (x *ExportView) Close() error { return x.v.close() }

// The staged snapshot file:
//
//	magic      8 bytes  "SBBSNAP1"
//	records    uvarint key length (> 0), uvarint value length, key, value
//	end        uvarint 0
//	count      8 bytes big-endian: the number of records
//	crc        4 bytes big-endian: CRC-32C of every byte before it
//
// Only the engine that wrote it reads it; it is checked whole before the
// install commits.
var stagedMagic = []byte("SBBSNAP1")

// maxStagedValue bounds a value's length read from a staged file, so that
// a corrupt length cannot force a huge allocation before the CRC is seen.
const maxStagedValue = 256 << 20

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// SnapshotWriter stages a received snapshot. Keys must be added in
// strictly increasing order.
type SnapshotWriter struct {
	path  string
	f     *os.File
	w     *bufio.Writer
	crc   hash.Hash32
	out   io.Writer
	last  []byte
	count uint64
	buf   []byte
}

// NewSnapshotWriter starts a staged snapshot file at path.
func (e *Engine) NewSnapshotWriter(path string) (*SnapshotWriter, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create snapshot file %s: %w", path, err)
	}
	w := &SnapshotWriter{path: path, f: f, w: bufio.NewWriterSize(f, 1<<20), crc: crc32.New(castagnoli)}
	w.out = io.MultiWriter(w.w, w.crc)
	if _, err := w.out.Write(stagedMagic); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("snapshot file %s: %w", path, err)
	}
	return w, nil
}

// Add appends a key and its value.
func (w *SnapshotWriter) Add(key, value []byte) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("snapshot file %s: %w", w.path, err)
	}
	if w.count > 0 && bytes.Compare(key, w.last) <= 0 {
		return fmt.Errorf("snapshot file %s: key %q not after %q", w.path, key, w.last)
	}
	w.buf = binary.AppendUvarint(w.buf[:0], uint64(len(key)))
	w.buf = binary.AppendUvarint(w.buf, uint64(len(value)))
	w.buf = append(w.buf, key...)
	w.buf = append(w.buf, value...)
	if _, err := w.out.Write(w.buf); err != nil {
		return fmt.Errorf("snapshot file %s: %w", w.path, err)
	}
	w.last = append(w.last[:0], key...)
	w.count++
	return nil
}

// Finish writes the end, the count and the checksum, and syncs the file.
func (w *SnapshotWriter) Finish() error {
	tail := binary.AppendUvarint(nil, 0)
	tail = binary.BigEndian.AppendUint64(tail, w.count)
	if _, err := w.out.Write(tail); err != nil {
		_ = w.f.Close()
		return fmt.Errorf("finish snapshot file %s: %w", w.path, err)
	}
	if _, err := w.w.Write(binary.BigEndian.AppendUint32(nil, w.crc.Sum32())); err != nil {
		_ = w.f.Close()
		return fmt.Errorf("finish snapshot file %s: %w", w.path, err)
	}
	if err := w.w.Flush(); err != nil {
		_ = w.f.Close()
		return fmt.Errorf("finish snapshot file %s: %w", w.path, err)
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

// InstallSnapshot atomically replaces the engine's whole content with the
// staged file at path and returns the applied index the engine now holds.
// The install is durable when it returns (one synced bbolt transaction):
// the node restarts the raft log after the snapshot as soon as it is
// installed. The caller (the applier) must not commit batches meanwhile.
// The new state is built in one bbolt transaction, which keeps its dirty
// pages in memory until it commits.
func (e *Engine) InstallSnapshot(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("install snapshot file %s: %w", path, err)
	}
	defer f.Close()
	e.flushMu.Lock()
	defer e.flushMu.Unlock()
	e.mu.Lock()
	gen := e.mu.gen + 1
	e.mu.Unlock()
	var applied uint64
	err = e.db.Load().db.Update(func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket(dataBucket); err != nil {
			return err
		}
		b, err := tx.CreateBucket(dataBucket)
		if err != nil {
			return err
		}
		b.FillPercent = 0.9 // keys arrive in order: pack the pages
		if applied, err = loadStaged(f, b); err != nil {
			return err
		}
		return tx.Bucket(metaBucket).Put(genKey, encodeIndex(gen))
	})
	if err != nil {
		return 0, fmt.Errorf("install snapshot file %s: %w", path, err)
	}
	e.mu.Lock()
	e.mu.mem = newLayer()
	e.mu.memBytes = 0
	e.mu.memClone = nil
	e.mu.frozen = nil
	e.mu.gen = gen
	e.mu.cond.Broadcast()
	// The install replaced the applied index outright; raft never sends a
	// snapshot older than the engine.
	e.applied.Store(applied)
	e.durable.Store(applied)
	e.mu.Unlock()
	return applied, nil
}

// loadStaged puts every record of a staged file into b and returns the
// applied index it holds; an error (corruption included) makes the
// caller's transaction roll back.
func loadStaged(f io.Reader, b *bolt.Bucket) (uint64, error) {
	crc := crc32.New(castagnoli)
	r := bufio.NewReaderSize(f, 1<<20)
	tr := &teeByteReader{r: r, h: crc}
	magic := make([]byte, len(stagedMagic))
	if _, err := io.ReadFull(tr, magic); err != nil || !bytes.Equal(magic, stagedMagic) {
		return 0, fmt.Errorf("staged snapshot: bad magic (%v)", err)
	}
	var applied, count uint64
	for {
		klen, err := binary.ReadUvarint(tr)
		if err != nil {
			return 0, fmt.Errorf("staged snapshot: record %d: %w", count, err)
		}
		if klen == 0 {
			break
		}
		vlen, err := binary.ReadUvarint(tr)
		if err != nil {
			return 0, fmt.Errorf("staged snapshot: record %d: %w", count, err)
		}
		if klen > bolt.MaxKeySize || vlen > maxStagedValue {
			return 0, fmt.Errorf("staged snapshot: record %d: key of %d or value of %d bytes is too large", count, klen, vlen)
		}
		// bbolt keeps the slices until the commit: one allocation each.
		kv := make([]byte, klen+vlen)
		if _, err := io.ReadFull(tr, kv); err != nil {
			return 0, fmt.Errorf("staged snapshot: record %d: %w", count, err)
		}
		k, v := kv[:klen], kv[klen:]
		if bytes.Equal(k, engine.AppliedIndexKey) {
			if applied, err = decodeIndex(v); err != nil {
				return 0, fmt.Errorf("staged snapshot: %w", err)
			}
		}
		if err := b.Put(k, v); err != nil {
			return 0, fmt.Errorf("staged snapshot: record %d: %w", count, err)
		}
		count++
	}
	var tail [8]byte
	if _, err := io.ReadFull(tr, tail[:]); err != nil {
		return 0, fmt.Errorf("staged snapshot: count: %w", err)
	}
	want := crc.Sum32()
	var sum [4]byte
	if _, err := io.ReadFull(r, sum[:]); err != nil {
		return 0, fmt.Errorf("staged snapshot: checksum: %w", err)
	}
	if got := binary.BigEndian.Uint32(sum[:]); got != want {
		return 0, fmt.Errorf("staged snapshot: checksum %08x, computed %08x", got, want)
	}
	if n := binary.BigEndian.Uint64(tail[:]); n != count {
		return 0, fmt.Errorf("staged snapshot: %d records, the file says %d", count, n)
	}
	return applied, nil
}

// teeByteReader hashes every byte read through it.
type teeByteReader struct {
	r *bufio.Reader
	h hash.Hash32
}

func (t *teeByteReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	t.h.Write(p[:n])
	return n, err
}

func (t *teeByteReader) ReadByte() (byte, error) {
	c, err := t.r.ReadByte()
	if err == nil {
		t.h.Write([]byte{c})
	}
	return c, err
}
