package pebble

import (
	"context"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/strata-kv/strata/engine"
)

// Raft snapshots move the engine's whole content from a leader to a member
// that is too far behind for the log. The leader exports every key of a
// consistent Pebble snapshot (the applied-index key included, so the copy
// says which index it holds); the receiver writes them, in order, into one
// sstable and installs it with IngestAndExcise, which in a single atomic,
// durable step removes everything the engine held and adds the new table.
// A crash before the install leaves the old state; after it, the new one.
// No second database handle is ever swapped in under live readers.

// allKeys is the span every engine key falls in: the reserved keys start
// with 0x00 0x00 and the state machine's with printable prefixes; no key is
// empty. (An empty start key trips Pebble's invariant checks.)
var allKeys = pebble.KeyRange{Start: []byte{0x00}, End: []byte{0xff, 0xff, 0xff, 0xff}}

// ExportView is a consistent view of the whole engine, reserved keys
// included, for sending as a raft snapshot.
type ExportView struct {
	snap    *pebble.Snapshot
	applied uint64
}

// NewExportView takes a consistent view of the engine. It must be closed.
func (e *Engine) NewExportView() (*ExportView, error) {
	snap := e.db.NewSnapshot()
	applied, err := readIndex(snap, nil)
	if err != nil {
		snap.Close()
		return nil, fmt.Errorf("export view: %w", err)
	}
	return &ExportView{snap: snap, applied: applied}, nil
}

// AppliedIndex is the applied index the view holds.
func (v *ExportView) AppliedIndex() uint64 { return v.applied }

// ForEach calls fn with every key and value of the view, in key order. The
// slices passed to fn are valid only during the call.
func (v *ExportView) ForEach(fn func(key, value []byte) error) error {
	it, err := v.snap.NewIter(&pebble.IterOptions{LowerBound: allKeys.Start, UpperBound: allKeys.End})
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	for valid := it.First(); valid; valid = it.Next() {
		val, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return fmt.Errorf("export: read %q: %w", it.Key(), err)
		}
		if err := fn(it.Key(), val); err != nil {
			it.Close()
			return err
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	return nil
}

// Close releases the view.
func (v *ExportView) Close() error { return v.snap.Close() }

// SnapshotWriter builds the sstable of a received snapshot. Keys must be
// added in strictly increasing order.
type SnapshotWriter struct {
	path string
	w    *sstable.Writer
}

// NewSnapshotWriter starts a snapshot table at path, on the engine's file
// system, in a table format the engine can ingest.
func (e *Engine) NewSnapshotWriter(path string) (*SnapshotWriter, error) {
	f, err := e.fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return nil, fmt.Errorf("create snapshot table %s: %w", path, err)
	}
	w := sstable.NewWriter(objstorageprovider.NewFileWritable(f), sstable.WriterOptions{
		TableFormat: e.db.FormatMajorVersion().MaxTableFormat(),
	})
	return &SnapshotWriter{path: path, w: w}, nil
}

// Add appends a key and its value.
func (w *SnapshotWriter) Add(key, value []byte) error {
	if err := w.w.Set(key, value); err != nil {
		return fmt.Errorf("snapshot table %s: %w", w.path, err)
	}
	return nil
}

// Finish completes and syncs the table.
func (w *SnapshotWriter) Finish() error {
	if err := w.w.Close(); err != nil {
		return fmt.Errorf("finish snapshot table %s: %w", w.path, err)
	}
	return nil
}

// Abort discards an unfinished table.
func (w *SnapshotWriter) Abort() {
	_ = w.w.Close()
}

// InstallSnapshot atomically replaces the engine's whole content with the
// table at path (built by a SnapshotWriter) and returns the applied index
// the engine now holds. The install is durable when it returns: the node
// restarts the raft log after the snapshot as soon as it is installed, so
// an install lost in a crash would leave the engine at its old index with
// the entries up to the snapshot gone from the log. The caller (the
// applier) must not commit batches meanwhile.
//
// Pebble does not make every ingest durable by itself: one that overlaps a
// memtable (the applied-index key alone makes every install overlap once
// anything was committed since the last flush) may be queued on top of the
// memtables as a "flushable ingest", which only Pebble's WAL would recover.
// With the WAL off the install therefore ends with a flush, which writes
// the queued ingest, and everything below it, to durable files.
func (e *Engine) InstallSnapshot(path string) (uint64, error) {
	if e.memKeys != nil {
		// The table may be queued as a flushable, which reads that skip
		// the memtables would miss until it is flushed.
		e.memKeys.ingesting()
	}
	_, err := e.db.IngestAndExcise(context.Background(), []string{path}, nil, nil, allKeys)
	// Counted even on failure: the ingest may have changed the engine
	// before it failed, and an extra count only costs a batch a new
	// iterator.
	e.generation.Add(1)
	if e.memKeys != nil {
		e.memKeys.ingested()
	}
	if err != nil {
		return 0, fmt.Errorf("install snapshot table %s: %w", path, err)
	}
	if !e.wal {
		if err := e.db.Flush(); err != nil {
			return 0, fmt.Errorf("install snapshot table %s: flush: %w", path, err)
		}
	}
	idx, err := readIndex(e.db, nil)
	if err != nil {
		return 0, fmt.Errorf("read applied index after snapshot install: %w", err)
	}
	// The ingest replaced the applied index outright: it may be lower than
	// a stale in-memory value only if the snapshot were older than the
	// engine, which raft never sends.
	e.applied.Store(idx)
	e.durable.Store(idx)
	return idx, nil
}

// Reader reads the view as an engine.Reader, for the packages that decode
// their own records from it (mvcc, auth, apply).
func (v *ExportView) Reader() engine.Reader { return &snapshot{s: v.snap} }
