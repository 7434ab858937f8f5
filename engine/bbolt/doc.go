// Package bbolt implements engine.Engine on go.etcd.io/bbolt, the B+tree
// that etcd itself stores its state in. It is strata's baseline for seed
// 001's experiment (an LSM tree against bbolt under the same server): the
// rest of strata (raft log, MVCC layout, apply path) stays the same, only
// the engine changes.
//
// # Files
//
//	<dir>/bbolt.db   one bbolt file: bucket "data" holds every engine key,
//	                 engine.AppliedIndexKey included; bucket "meta" holds
//	                 the install generation (see InstallSnapshot)
//	<dir>/bbolt.db.compact   CompactAll's copy until it is renamed over
//	                 bbolt.db (removed on Open if a crash left it)
//
// # Why an in-memory overlay
//
// bbolt has no write-ahead log: a committed read-write transaction is made
// durable by its own fsyncs (the data pages, then the meta page that
// points at them). strata's rule is that the engine never syncs on the
// write path (docs/design.md, durability rule 2), and bbolt's NoSync mode
// is not a way out: without the fsync between the data pages and the meta
// page, a power cut can leave a meta page pointing at pages that never
// reached the disk, and pages freed after the last synced commit can be
// reused and overwritten by unsynced ones; the file is then corrupt, not
// merely behind. bbolt's own documentation calls NoSync unsafe.
//
// So the engine does what etcd's backend does with its batch transaction
// and read buffer, made explicit: a committed batch goes to an in-memory
// ordered overlay (a copy-on-write B-tree, the "memtable"), visible to
// every reader at once, and is written to bbolt later, many batches in one
// synced bbolt transaction (a "flush"). The bbolt file is touched only by
// flushes, and each flush is one ordinary, synced bbolt commit, so after a
// power cut the file holds exactly the state at the last completed flush:
// a prefix point of the applied batches, with its applied index.
//
// When the overlay reaches Options.MemBytes it is frozen and a background
// goroutine flushes it; commits go on into a new overlay meanwhile. With
// too many frozen overlays waiting, Commit waits for the flusher (a write
// stall, as Pebble stalls on too many memtables). Engine.Flush freezes the
// overlay and flushes everything frozen before it returns.
//
// # Reads
//
// A read merges, newest first: the batch's own writes (for reads through
// a Batch), the overlay, the frozen overlays, then a bbolt read
// transaction. Deletions are tombstones in the overlays. A snapshot is a
// copy-on-write clone of the overlays (O(1)) and a bbolt read transaction
// held until it is closed.
//
// # Costs and limits
//
//   - Memory: up to (1 + 2 frozen) x MemBytes of overlay, plus what bbolt's
//     transaction holds while it writes a flush.
//   - DeleteRange is expanded, when it is called, into a deletion of every
//     key the batch then sees in the range: O(keys in range), not O(1) as
//     Pebble's range tombstone.
//   - Keys: bbolt refuses empty keys and keys above 32768 bytes; Set
//     returns an error for them (an etcd key near that size does not fit
//     this engine's MVCC keys).
//   - bbolt never shrinks its file (freed pages are reused). CompactAll
//     copies every key into a new file and swaps it in while reads go on
//     (compact.go); meanwhile flushes wait, so commits stall if the
//     overlay fills, and the disk holds both files.
//   - A raft snapshot is installed in one bbolt transaction, which holds
//     the whole new state's dirty pages in memory until it commits.
//   - bbolt remaps its file when it outgrows the mapping, and a remap
//     waits for every open read transaction. A goroutine that holds an
//     iterator and opens another read while a flush remaps deadlocks
//     (bbolt's documented rule for nested transactions). The mapping
//     starts at Options.InitialMmapSize (default 10 GiB, etcd's default),
//     so a remap happens only once the file outgrows it.
//   - bbolt works on the operating system's files only: the engine cannot
//     run on Pebble's vfs (no in-memory or crashable file system).
//
// # Reserved keys
//
// Keys beginning with 0x00 0x00 are reserved for the engine, as in
// engine/pebble.
//
// Concurrency: as engine.Engine says: batches are committed by one
// goroutine; reads, snapshots, Flush, DurableIndex and Checkpoint are safe
// from any. Open starts one goroutine (the flusher); Close stops it.
package bbolt
