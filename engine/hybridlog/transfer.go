package hybridlog

import (
	"errors"
	"fmt"

	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/engine/appendlog"
)

// ExportView is a consistent view of the whole engine, reserved keys
// included, for sending as a raft snapshot or writing as a backup.
type ExportView struct{ v *view }

// NewExportView takes a consistent (sealed) view of the engine. It must
// be closed.
func (e *Engine) NewExportView() (*ExportView, error) {
	v, err := e.newView(true)
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
		if err := fn(it.Key(), it.Value()); err != nil {
			return errors.Join(err, it.Close())
		}
	}
	return it.Close()
}

// Reader reads the view (engine.ExportView); valid until Close.
func (x *ExportView) Reader() engine.Reader { return &snapshot{v: x.v} }

// Close releases the view.
func (x *ExportView) Close() error { return x.v.close() }

// NewSnapshotWriter starts a staged snapshot file at path: the stable
// region's (engine/appendlog), since an install replaces it.
func (e *Engine) NewSnapshotWriter(path string) (*appendlog.SnapshotWriter, error) {
	return e.stable.NewSnapshotWriter(path)
}

// InstallSnapshot atomically and durably replaces the engine's whole
// content with the staged file at path: the stable region installs it
// (engine/appendlog), then the memory regions are emptied. The caller (the
// applier) must not commit batches meanwhile.
func (e *Engine) InstallSnapshot(path string) (uint64, error) {
	e.flushMu.Lock()
	defer e.flushMu.Unlock()
	e.writeMu.Lock()
	defer e.writeMu.Unlock()
	// Views taken from here until memory is emptied take flushMu (Engine
	// invariants 4 and 5): one could pair the old memory with the new
	// stable region.
	e.mu.Lock()
	e.mu.installing = true
	e.mu.stableGen++
	e.mu.Unlock()
	applied, err := e.stable.InstallSnapshot(path)
	if err != nil {
		e.mu.Lock()
		e.mu.installing = false
		e.mu.stableGen++
		e.mu.Unlock()
		return 0, fmt.Errorf("install snapshot into hybridlog engine in %s: %w", e.dir, err)
	}
	e.mu.Lock()
	e.mu.installing = false
	e.mu.stableGen++
	e.mu.index = map[string]*rec{}
	e.mu.tree = newTree()
	e.mu.treeClone = nil
	e.mu.recs = nil
	e.mu.memStart, e.mu.ro = e.mu.tail, e.mu.tail
	e.mu.memBytes = 0
	e.applied.Store(applied)
	e.mu.roApplied = applied
	e.mu.cond.Broadcast()
	e.mu.Unlock()
	return applied, nil
}
