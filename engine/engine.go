// Package engine defines the storage engine that strata's state machine
// writes to, and the rules that let the raft log be the only write-ahead log.
//
// # Single logging
//
// The engine runs without a write-ahead log of its own (seed 002). Every
// batch it commits carries the raft index it applies, written atomically with
// the data, and is committed without a sync. After a crash the engine holds
// a prefix of the committed batches, so the applied index it reads back is
// exactly the point from which the raft log must be replayed.
//
// The engine also reports a durable index D: every batch whose applied index
// is <= D is in durable files and survives a power cut. The raft log may drop
// an entry only once it is <= D (docs/design.md, durability rules 2-4).
//
// Implementations live in sub-packages: engine/pebble is the default,
// engine/bbolt the B+tree baseline (seed 001); engine/engines opens either
// by name.
package engine

import "errors"

// ErrNotFound is returned by Get when the key does not exist.
var ErrNotFound = errors.New("engine: key not found")

// Reader reads keys. The byte slices a Reader returns are owned by the
// caller unless a method says otherwise.
type Reader interface {
	// Get returns a copy of the value stored under key, or ErrNotFound.
	Get(key []byte) ([]byte, error)
	// NewIter returns an iterator over keys in [lower, upper). A nil bound
	// is unbounded. The iterator must be closed.
	NewIter(lower, upper []byte) Iterator
}

// Iterator walks keys in ascending byte order. Key and Value are valid only
// until the next positioning call; copy them to keep them.
type Iterator interface {
	First() bool
	Last() bool
	SeekGE(key []byte) bool
	SeekLT(key []byte) bool
	Next() bool
	Prev() bool
	Valid() bool
	Key() []byte
	Value() []byte
	// Close releases the iterator and returns any error met while iterating.
	Close() error
}

// Batch collects writes that commit atomically. Reads through a Batch see
// the batch's own writes on top of the engine's committed state, so that
// several requests applied in one batch see each other's effects.
//
// Set, Delete and DeleteRange copy their arguments: the caller may reuse
// them as soon as the call returns (mvcc encodes each put's rows into
// buffers it reuses). WriteOnlyBatch's do the same.
//
// Concurrency: a Batch is used by one goroutine at a time.
type Batch interface {
	Reader
	Set(key, value []byte) error
	Delete(key []byte) error
	// DeleteRange deletes every key in [start, end).
	DeleteRange(start, end []byte) error
	// Empty reports whether the batch holds no writes.
	Empty() bool
	// Commit writes the batch and the applied index atomically, without a
	// sync, and releases the batch. appliedIndex must not be lower than the
	// engine's current applied index.
	Commit(appliedIndex uint64) error
	// CommitWith commits the batch's writes followed by those of tails, in
	// order, and the applied index, atomically, as Commit does; it releases
	// the batch and the tails. Tails are built on other goroutines (see
	// WriteOnlyBatch); what they write is not visible to reads through the
	// batch before the commit, so a caller appends as tails only writes
	// that no later read of the batch depends on.
	CommitWith(appliedIndex uint64, tails []WriteOnlyBatch) error
	// Close discards an uncommitted batch. It is a no-op after Commit.
	Close() error
}

// WriteOnlyBatch collects writes that nothing reads back before they
// commit, as part of a Batch (Batch.CommitWith). Without the index a Batch
// keeps for its reads it is cheaper to build, and since it does not read
// it can be built on any goroutine: recovery fills several in parallel.
//
// Concurrency: a WriteOnlyBatch is used by one goroutine at a time.
type WriteOnlyBatch interface {
	Set(key, value []byte) error
	Delete(key []byte) error
	// Close discards the writes. It is a no-op once committed.
	Close() error
}

// Snapshot is a consistent, read-only view of the engine at one instant.
type Snapshot interface {
	Reader
	Close() error
}

// Engine is the state machine's storage.
//
// Concurrency: batches may be committed from one goroutine (the applier);
// reads, snapshots, Flush and DurableIndex are safe from any goroutine.
type Engine interface {
	Reader
	NewBatch() Batch
	// NewWriteOnlyBatch returns an empty WriteOnlyBatch; it may be called
	// from any goroutine.
	NewWriteOnlyBatch() WriteOnlyBatch
	NewSnapshot() Snapshot
	// AppliedIndex returns the applied index of the last committed batch
	// (after Open: of the last batch that survived).
	AppliedIndex() uint64
	// DurableIndex returns D: every batch with applied index <= D is durable.
	DurableIndex() uint64
	// Flush makes every batch committed before the call durable, and so
	// advances DurableIndex to at least the AppliedIndex seen at the call.
	Flush() error
	// Checkpoint writes a consistent, durable copy of the engine to dir
	// (which must not exist), flushing first. It returns the applied index
	// the copy holds.
	Checkpoint(dir string) (uint64, error)
	// CompactAll asks the engine to rewrite its files to reclaim space. It
	// does not block reads or writes.
	CompactAll() error
	// DiskSize returns the bytes the engine's files take on disk.
	DiskSize() int64
	// MaxKeySize returns the longest key Set accepts, in bytes, or 0 when
	// the engine enforces no limit of its own (memory aside). Callers that
	// write keys derived from a client's request check them against it
	// before the request is proposed: a committed entry whose keys the
	// engine refuses could not be applied.
	MaxKeySize() int
	Close() error
}
