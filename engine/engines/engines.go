// Package engines opens a storage engine by the name chosen with --engine,
// so that the member's wiring is one call and knows no engine package:
//
//	eng, err := engines.Open(cfg.Engine, datadir.Engine(cfg.DataDir), engines.Options{...})
//
// Every engine it opens is an engine.Transferable: besides engine.Engine it
// exports a consistent view of its whole content, stages a received one in
// a file, and installs it (raft snapshots, backups, restore). Exports carry
// the same keys, engine.AppliedIndexKey included, whatever the engine, so a
// snapshot streamed from a member on one engine installs into a member on
// another.
//
// The engine a data directory holds is recorded in its identity (package
// datadir, LoadOrCreateID); this package only opens what it is told to.
package engines

import (
	"fmt"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/engine/appendlog"
	bboltengine "github.com/strata-kv/strata/engine/bbolt"
	"github.com/strata-kv/strata/engine/hybridlog"
	pebbleengine "github.com/strata-kv/strata/engine/pebble"
)

// The engines' names, as --engine takes them.
const (
	Pebble = "pebble" // the default: Pebble's LSM tree, WAL off (engine/pebble)
	Bbolt  = "bbolt"  // etcd's B+tree, behind an in-memory overlay (engine/bbolt)
	// AppendLog is Bitcask's design: append-only data files and an
	// in-memory ordered key directory (engine/appendlog).
	AppendLog = "appendlog"
	// HybridLog is FASTER's design: a log whose tail is mutable in memory,
	// over an appendlog stable region (engine/hybridlog).
	HybridLog = "hybridlog"
)

// Default is the engine used when none is named (datadir.DefaultEngine).
const Default = Pebble

// Names lists the engines, the default first.
func Names() []string { return []string{Pebble, Bbolt, AppendLog, HybridLog} }

// SeeksCheaperThanGets reports whether, on the engine named name ("" meaning
// Default), seeking one reused iterator to a key reads its value faster than
// a Get does: so on Pebble (a Get builds an iterator stack of its own;
// 2.4 against 4.5 µs a read of 50,000 keys in random order) and on bbolt
// (1.8 against 2.8 µs), not on appendlog and hybridlog, whose iterators
// fill a batch of 64 entries at each seek (7.0 against 5.8 µs, 13.2
// against 5.2 µs). A backup that reads a value for every key version
// chooses its reads by it.
func SeeksCheaperThanGets(name string) bool {
	return name == "" || name == Pebble || name == Bbolt
}

// Check returns nil if name ("" meaning Default) names an engine, else an
// error listing the engines.
func Check(name string) error {
	if name == "" || slices.Contains(Names(), name) {
		return nil
	}
	names := Names()
	return fmt.Errorf("unknown engine %q: --engine takes %s or %s", name, strings.Join(names[:len(names)-1], ", "), names[len(names)-1])
}

// Options configure Open.
type Options struct {
	// FS is the file system; nil means the operating system's. Only Pebble
	// runs on another (an in-memory or crashable one): bbolt, appendlog and
	// hybridlog write through the operating system's files, and refuse any
	// other FS.
	FS vfs.FS
	// EnableWAL asks for the double-logging baseline (--engine-wal): Pebble
	// turns its WAL on and syncs every commit; bbolt, which has no WAL,
	// flushes and syncs every commit (bbolt.Options.SyncCommits), and
	// appendlog and hybridlog sync every commit (their SyncCommits).
	EnableWAL bool
	// ReadOnly opens an existing engine without changing any of its files
	// (a checkpoint about to be uploaded). Only Pebble has the mode; the
	// other engines refuse it.
	ReadOnly bool
	// Logger receives the engine's log lines; nil means zap.NewNop().
	Logger *zap.Logger
}

// Open opens (creating if needed) the engine named name ("" meaning
// Default) in dir.
func Open(name, dir string, opts Options) (engine.Transferable, error) {
	if err := Check(name); err != nil {
		return nil, err
	}
	if err := checkForeign(name, dir, opts.FS); err != nil {
		return nil, err
	}
	if name != Pebble && name != "" && opts.FS != nil && opts.FS != vfs.Default {
		return nil, fmt.Errorf("open %s engine in %s: it works on the operating system's files only, not on %T", name, dir, opts.FS)
	}
	if name != Pebble && name != "" && opts.ReadOnly {
		return nil, fmt.Errorf("open %s engine in %s: it has no read-only mode", name, dir)
	}
	switch name {
	case HybridLog:
		e, err := hybridlog.Open(dir, hybridlog.Options{SyncCommits: opts.EnableWAL, Logger: opts.Logger})
		if err != nil {
			return nil, err
		}
		return hybridLogEngine{e}, nil
	case AppendLog:
		e, err := appendlog.Open(dir, appendlog.Options{SyncCommits: opts.EnableWAL, Logger: opts.Logger})
		if err != nil {
			return nil, err
		}
		return appendLogEngine{e}, nil
	case Bbolt:
		e, err := bboltengine.Open(dir, bboltengine.Options{SyncCommits: opts.EnableWAL, Logger: opts.Logger})
		if err != nil {
			return nil, err
		}
		return bboltEngine{e}, nil
	default:
		e, err := pebbleengine.Open(dir, pebbleengine.Options{FS: opts.FS, EnableWAL: opts.EnableWAL, ReadOnly: opts.ReadOnly, Logger: opts.Logger})
		if err != nil {
			return nil, err
		}
		return pebbleEngine{e}, nil
	}
}

// pebbleEngine adapts engine/pebble's concrete export types to the
// engine.Transferable interface.
type pebbleEngine struct{ *pebbleengine.Engine }

func (p pebbleEngine) NewExportView() (engine.ExportView, error) {
	v, err := p.Engine.NewExportView()
	if err != nil {
		return nil, err
	}
	return v, nil
}

func (p pebbleEngine) NewSnapshotWriter(path string) (engine.SnapshotWriter, error) {
	w, err := p.Engine.NewSnapshotWriter(path)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// bboltEngine adapts engine/bbolt's concrete export types likewise.
type bboltEngine struct{ *bboltengine.Engine }

func (b bboltEngine) NewExportView() (engine.ExportView, error) {
	v, err := b.Engine.NewExportView()
	if err != nil {
		return nil, err
	}
	return v, nil
}

func (b bboltEngine) NewSnapshotWriter(path string) (engine.SnapshotWriter, error) {
	w, err := b.Engine.NewSnapshotWriter(path)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// appendLogEngine adapts engine/appendlog's concrete export types likewise.
type appendLogEngine struct{ *appendlog.Engine }

func (a appendLogEngine) NewExportView() (engine.ExportView, error) {
	v, err := a.Engine.NewExportView()
	if err != nil {
		return nil, err
	}
	return v, nil
}

func (a appendLogEngine) NewSnapshotWriter(path string) (engine.SnapshotWriter, error) {
	w, err := a.Engine.NewSnapshotWriter(path)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// hybridLogEngine adapts engine/hybridlog's concrete export types likewise.
type hybridLogEngine struct{ *hybridlog.Engine }

func (h hybridLogEngine) NewExportView() (engine.ExportView, error) {
	v, err := h.Engine.NewExportView()
	if err != nil {
		return nil, err
	}
	return v, nil
}

func (h hybridLogEngine) NewSnapshotWriter(path string) (engine.SnapshotWriter, error) {
	w, err := h.Engine.NewSnapshotWriter(path)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// checkForeign refuses a directory that holds another engine's files: an
// engine opened there would start empty beside them, silently. (The data
// directory's identity is the first check, datadir.LoadOrCreateID; this
// one also covers a directory opened without it.)
func checkForeign(name, dir string, fs vfs.FS) error {
	if name == "" {
		name = Default
	}
	if fs == nil {
		fs = vfs.Default
	}
	names, err := fs.List(dir)
	if err != nil {
		return nil // not there yet: the engine creates it
	}
	for _, n := range names {
		if other := ownerOf(n); other != "" && other != name {
			return fmt.Errorf("open %s engine in %s: the directory holds %s %s engine (%s)", name, dir, article(other), other, n)
		}
	}
	return nil
}

// ownerOf returns the engine whose file a name is, or "".
func ownerOf(file string) string {
	switch {
	case file == "CURRENT" || strings.HasPrefix(file, "MANIFEST-"):
		return Pebble
	case file == bboltengine.FileName:
		return Bbolt
	case strings.HasSuffix(file, ".alog"):
		return AppendLog
	case file == hybridlog.StableDir:
		return HybridLog
	}
	return ""
}

func article(name string) string {
	if strings.ContainsRune("aeiou", rune(name[0])) {
		return "an"
	}
	return "a"
}
