// Package hybridlog implements engine.Engine in the style of FASTER's
// HybridLog (Chandramouli et al., SIGMOD 2018; the HybridLog of seed 004,
// chapter 3.4): a log of records whose tail is mutable in memory, whose
// middle is read-only in memory, and whose head is on disk, with a hash
// index from keys to log records.
//
// # Regions
//
// Records live at increasing log addresses. With memStart <= ro <= tail:
//
//	[0, memStart)   written to the stable region and evicted
//	[memStart, ro)  read-only, in memory: waiting to be written, or (a
//	                flush's region) written and being evicted
//	[ro, tail)      mutable, in memory
//
// A write to a key whose latest record is in the mutable region updates
// that record in place (FASTER's in-place update: no new record, no new
// index entry); otherwise it appends a record at the tail (read-copy-
// update). Deletions are tombstone records, kept until they reach the
// stable region.
//
// The stable region is an engine/appendlog store in <dir>/stable: seed
// 004's implementation also built its HybridLog's disk part as its
// AppendLog's files and merge. So a key whose records were all evicted is
// found through the AppendLog's key directory, not by following a log
// address into the file, as FASTER does; that costs a second index (the
// AppendLog's, ordered) in memory for the evicted keys.
//
// # Indexes and ordered iteration
//
// The hash index (a Go map, key -> its latest in-memory record) serves
// point reads and the commit's in-place check in O(1). FASTER has no
// ordered access; strata's ranges need it, so the in-memory records are
// also in a copy-on-write B-tree (github.com/RaduBerinde/btreemap),
// key -> record, cloned in O(1) for views. A range read merges that tree
// with an iterator of the stable region, newest first. Each key in memory
// is thus held twice (the map's string and the tree's slice): the cost of
// both O(1) points and ordered ranges.
//
// # Views and in-place updates
//
// A record updated in place changes under any reader holding it, so
// readers on other goroutines (iterators, snapshots, export views,
// checkpoints) first move ro to the tail: every record they can see is
// then read-only, and later writes to those keys append. Only the applier
// commits, so a batch's own reads (on the applier's goroutine, before its
// commit) need no such seal. Under strata's load, where ranges are served
// through iterators, the mutable region is therefore the records written
// since the last read view, flush or seal, and in-place updates pay off
// for keys written repeatedly between reads: the applied index key, which
// every batch writes, is one.
//
// # Durability
//
// Durable means written to the stable region and synced there. A flush
// takes the read-only records [memStart, ro) as one AppendLog batch, whose
// applied index is the one at which ro was last moved (ro only moves
// between batches), commits it to the stable region and then evicts the
// records, a few thousand per hold of the lock. Flush seals (ro = tail),
// flushes, and syncs the stable region:
// DurableIndex is the stable region's. After a power cut the stable region
// holds a prefix of its batches (engine/appendlog), each the state at a
// seal point, so what Open reads back is a prefix point of strata's
// batches, whose applied index the stable region holds. The memory
// regions hold nothing that a restart needs: the raft log replays it.
//
// When the memory regions hold more than Options.MemBytes the commit seals
// and a background goroutine flushes (without a sync); at twice that,
// Commit waits for it (a write stall). Nothing else makes a commit, or a
// batch's reads, wait for a flush's write to the stable region: a view
// takes the in-memory tree, then the stable region's snapshot, and tries
// again if a flush started in between (Engine invariant 5); a flush evicts
// in steps. Nor do they wait for the stable region's merge, which moves its
// key directory to the merged files outside its lock (engine/appendlog).
//
// # Snapshots and checkpoints
//
// The staged snapshot file, its install, Checkpoint and CompactAll (a
// merge) are the stable region's (engine/appendlog), after a flush: their
// sealed files are immutable, so checkpoints hard-link them. Commits and
// reads go on during CompactAll's flush and merge (above); during an
// install, views wait for it (the applier, which installs, does not
// commit meanwhile).
//
// # Limits
//
//   - Memory: the in-memory records (up to twice MemBytes before a stall),
//     both indexes over them, and the stable region's key directory.
//   - Readers on other goroutines seal the mutable region (above).
//   - A view, and so a batch's first read, waits for the stable region to
//     apply a flushed region to its key directory (one batch, applied
//     under the stable region's lock: in proportion to the region's
//     keys), though not for the flush's write or sync; and for one step
//     of a flush's eviction (evictStep records).
//   - The limits of engine/appendlog apply to the stable region.
//
// Concurrency: as engine.Engine says. Open starts one goroutine (the
// flusher) besides the stable region's; Close stops them.
package hybridlog
