// Package appendlog implements engine.Engine in the style of Bitcask
// (Sheehy and Smith, 2010; the AppendLog of seed 004, chapter 3.3): every
// write is appended to a data file, an in-memory key directory says where
// each key's latest value is, and old files are merged in the background.
// FORMAT.md is the byte-level specification of the files; this comment is
// the design.
//
// # Files
//
// The engine directory holds data files <id>.alog. Exactly one, the
// active file, is appended to; every other file is immutable. A committed
// batch is one frame in the active file: its records (key, value or
// tombstone), the applied index, and a trailing CRC that acts as the
// commit marker. A frame is written with one write(2) and no fsync: the
// operating system's page cache makes it readable at once, and the raft
// log, not the engine, is what a crash replays from. When the active file
// reaches Options.MaxFileBytes it is synced whole and a new one is created
// (a rotation, on the committing goroutine: one fsync per MaxFileBytes).
//
// # Key directory and ordered iteration
//
// Bitcask's key directory is a hash table, which cannot serve a range.
// strata's MVCC layer reads ranges on every request, so the key directory
// here is ordered: a copy-on-write B-tree (github.com/RaduBerinde/btreemap,
// degree 32), key -> (file, value offset, value length). A point read is
// O(log n) in memory plus one pread(2). A snapshot or an iterator clones
// the tree in O(1) (later commits copy the nodes they change). The tree
// has no cursor, so an iterator refills a buffer of up to 64 entries with
// one descent from its last key: a forward scan costs O(log n / 64) tree
// work and one pread per key it reads the value of (values are never in
// memory). Backward steps cost one descent each.
//
// Memory: every key lives in memory once, with a 24-byte slice header, a
// 24-byte location and its share of the B-tree nodes: 82 bytes of Go heap
// per key with 8-byte keys (BenchmarkEngineHeap in engine/engines). The
// keys must fit in memory (seed 004's first limitation of the design).
//
// # Atomic batches and the durable index
//
// A batch is one frame; the engine.AppliedIndexKey record is the frame's
// last record, so the applied index is committed atomically with the data.
// Recovery replays the files frame by frame and stops at the first frame
// that is incomplete or fails its CRC: what survives is a prefix of the
// committed batches and its applied index says which (FORMAT.md,
// Recovery).
//
// The durable index D is the applied index of the last frame known to be
// on disk: Flush reads the active file's length and the applied index,
// fsyncs the file, and raises D to that index; a rotation syncs the old
// file whole and raises D likewise. Open syncs what it replayed, so
// D = the applied index after Open.
//
// # Hint files
//
// Recovery without help reads every byte of the live files. As in Bitcask,
// each sealed file (a rotated commit file, a merge output, an installed
// snapshot) gets a hint file <id>.hint: each key's last record in the file
// (its value's location, or a deletion), the bytes of the file's records
// that later ones in the same file made garbage, and a CRC, tied to the
// data file by its id, header and length. A background goroutine (the
// hinter) builds it from the file's frames after the file is sealed (off
// the commit path), writes it under a temporary name, syncs and renames
// it; Close writes those still missing. Recovery applies a sealed file's
// hint in the file's place in the replay order, which gives the same key
// directory as scanning the file, and scans the file instead when its
// hint is missing, damaged or describes another file; the newest file is
// always scanned (it may have a torn tail). A hint skips the check of the
// data file's frame CRCs, which a scan makes (as in Bitcask; reads never
// check them). Cost: one more read of each sealed file, and hint files of
// about 20 bytes plus the key per key.
//
// # Merge and incremental snapshots
//
// Overwritten values and tombstones are garbage. A merge (CompactAll, or
// the background merger once garbage exceeds half the immutable bytes)
// rotates the active file, then rewrites every live value held by the
// immutable files into new files, syncs and renames those into place,
// then writes a marker file whose header supersedes every file below the
// cut, and points the key directory's locations to the new files: it
// moves them in a clone of the directory, without the lock, while commits
// record the keys they write; then, in one short step under the lock, it
// takes those keys' locations into the clone (a location a newer commit
// replaced is left as that commit wrote it), installs the clone and drops
// the old files from the set (Engine invariant 8). The old files
// are deleted when the last reader holding them lets go; whichever of them
// a crash leaves behind, recovery ignores them, and outputs without their
// marker change nothing (FORMAT.md, Recovery). Commits and reads go on
// during a merge; they wait for its rotation (a sync of the active file,
// as any rotation) and for that last step, which is in proportion to the
// keys committed during the merge's moves, not to the live keys.
//
// Since files never change once sealed, Checkpoint hard-links every sealed
// file and copies only the active file's committed prefix: a backup taken
// after another needs to copy only the files it does not already hold
// (seed 004's incremental snapshot of immutable files). It first seals an
// active file of at least MaxFileBytes/16, so that what a backup copies
// beyond the files the change wrote is at most that much, not the whole
// active file each time.
//
// # Raft snapshots
//
// A received snapshot is staged (SnapshotWriter) as a data file of frames
// whose header has the reset flag. InstallSnapshot checks it whole,
// renames it into the directory with an id above every file's and syncs
// the directory: that rename is the atomic switch, since the reset flag
// makes recovery ignore every older file.
//
// # Limits
//
//   - Keys must fit in memory (above). Keys are 1 to 65536 bytes.
//   - Each read of a value is a pread: a range of n keys costs n system
//     calls (page-cache hits once the files are warm).
//   - DeleteRange is expanded when it is called into a tombstone per key
//     the batch then sees in the range: O(keys in range).
//   - A batch is at most 256 MiB encoded.
//   - The engine works on the operating system's files only, not on
//     Pebble's vfs.
//   - A merge needs room for the live data again while it runs.
//
// Concurrency: as engine.Engine says. Open starts two goroutines (the
// background merger and the hinter); Close stops them.
package appendlog
