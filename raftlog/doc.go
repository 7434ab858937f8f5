// Package raftlog is strata's raft log and its only write-ahead log: the
// engine runs without a WAL of its own (docs/design.md, durability rules 1-7).
//
// # What it stores
//
// The log holds raft entries after the snapshot point, the HardState, and
// the snapshot point itself (index, term, ConfState): everything raft needs
// from raft.Storage at restart. *Log implements raft.Storage for raft's
// reads; the node goroutine writes through Append, Compact and
// ApplySnapshot.
//
// # Segments and frames
//
// The log is a sequence of preallocated, zero-filled segment files. Each
// Append becomes one checksummed, 8-byte-aligned batch frame written with
// one write and made durable with one fdatasync (group commit is the
// caller's: one Append per raft Ready). The byte layout, the checksums and
// the recovery procedure are specified in FORMAT.md, in this directory.
//
// Rolling to a new segment must not stall Append for the time it takes to
// zero-fill one, so the Log keeps one spare file prepared by a background
// goroutine (started by the first Append, waited for by Close): disk use is
// the live segments plus one spare.
//
// # Recovery
//
// Open replays every segment. A torn or garbage tail of the last segment
// (an Append whose sync never returned) is truncated and logged; any other
// damage, a bad frame followed by a good one or any damage in a sealed
// segment, is an error wrapping ErrCorrupt that names the file and offset.
// Nothing is ever skipped silently.
//
// # Memory
//
// Terms and on-disk positions of all live entries are kept in memory (24
// bytes per entry); the newest entries appended since Open (up to 2 MiB)
// are kept whole, older ones are read back from their frame on demand.
// Recovery keeps no entry whole: which entries are the newest is known only
// once the last segment is scanned. Log compaction (Compact,
// once the engine holds entries durably) bounds both.
//
// # Concurrency
//
// Reads (the raft.Storage methods, Stats) are safe from any goroutine and
// never wait for the disk. Append, Compact, ApplySnapshot and the
// pending-snapshot records come from one goroutine (the node's); log
// compaction (CompactOldestSegment, CompactNextBatch) runs on another,
// concurrently with them (see "Log compaction"). No lock is held across a
// write or sync; a write becomes visible to readers only once it is
// durable.
//
// # Several directories
//
// Options.Dirs may name several directories (devices). Each Append is then
// split into one part per directory, of consecutive entries, and the parts
// are written and fdatasynced in parallel, one goroutine per directory;
// Append returns when all are durable. Every frame carries the log-wide
// sequence number of the write it belongs to, so recovery merges the
// directories into one order and drops the parts of a last Append that did
// not reach every directory (stripe.go; FORMAT.md, "Several directories").
//
// # Log compaction
//
// CompactOldestSegment, called from a background goroutine concurrently
// with Append, rewrites the oldest segment, once all its entries are
// applied, as a compacted batch file (batchfile.go). CompactNextBatch does
// the same for the next n applied entries after the snapshot point,
// whatever segments hold them (--log-compaction-batch). What stands for
// the entries is an opaque payload that the caller's BatchBuilder encodes
// (package logcompact: per key the state to set, plus the entries that
// cannot be merged); the log keeps its index range and last term, writes
// the file durably, moves the snapshot point past it and drops the
// segments wholly below it. Before raft starts, the caller reads
// CompactedBatches and replays their payloads on the engine
// (compactlog.go; FORMAT.md, "Compacted batch files").
//
// # Failure
//
// A failed write or fdatasync is returned and the Log refuses every later
// write (ErrFailed): after a failed fsync the state of the file is unknown,
// and retrying could acknowledge data that is lost. The process restarts
// and recovers from disk.
package raftlog
