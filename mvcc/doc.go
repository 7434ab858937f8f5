// Package mvcc implements etcd's multi-version key space on an
// engine.Engine: revisions, create/mod revisions, versions, leases, Range at
// old revisions, transactions, and revision compaction, with etcd's exact
// semantics.
//
// # Revisions
//
// The store's revision starts at 1. Every write request (a Put, a
// DeleteRange that deletes something, a Txn whose executed branch writes)
// takes the next main revision; its operations take sub-revisions 0, 1, 2...
// A key's create_revision is the main revision of the Put that created it
// (after its last deletion), its mod_revision the main revision of its last
// change, and its version counts Puts since creation (a deletion resets it).
//
// # Using the store
//
// The applier opens a WriteBatch with Store.Write, applies requests to it in
// log order, and commits it with the raft index of the last entry; the
// batch is one engine batch, so the engine's applied index and the state
// never disagree. Readers call Range (or ReadTxn) from any goroutine; each
// reads a consistent engine snapshot.
//
// # Layout in the engine
//
// Eight key spaces, all under the prefix "m" (engine/pebble reserves keys
// starting 0x00 0x00 for itself; other packages must keep off "m"):
//
//	mc<key>                              current version of every live key -> current record
//	mh<esc(key)>\x00\x01<^main><^sub>    every other version still kept     -> KeyValue
//	mr<main><sub>                        revision index                     -> flag, key
//	ml<lease><key>                       keys attached to a lease           -> (empty)
//	mg<lease>                            lease records (lease.go)           -> ttl, remaining ttl
//	mm<name>                             store state: "state" (revision and compact
//	                                     revision), "compact" (physical compaction job)
//	mu<name>                             the applier's SetMeta values
//	mi<index>                            revisions each raft index wrote    -> before, after
//	                                     (for log compaction, logcompact.go)
//
// Other packages write their own key spaces through WriteBatch.Batch, in
// the same engine batch as the entry that changes them:
//
//	ae                                   auth: enabled flag, auth revision (package auth)
//	au<name>                             auth: users                        -> authpb.User
//	ar<name>                             auth: roles                        -> authpb.Role
//
// Numbers are 8-byte big-endian. esc(key) replaces each 0x00 byte with
// 0x00 0xff, and \x00\x01 ends the key, so history entries sort by key as
// raw keys do and no key's entries interleave with another's. ^main and ^sub
// are bitwise complements: a key's newest version sorts first, so one SeekGE
// to mh<esc(key)>\x00\x01<^rev><0...> lands on the newest version at or
// below rev. A deletion is stored in history as a KeyValue holding only the
// key (mod_revision 0), as etcd stores its tombstones; the revision index
// flags it with 1 (a put is 0).
//
// # Where each version lives
//
// Each version is stored once. A Put writes the new version to mc only, as
// a moved record:
//
//	0x00 <sub as uvarint> <KeyValue>
//
// and when a later Put or a deletion replaces it, the same KeyValue bytes
// move to mh<esc(key)>\x00\x01<^main><^sub> (the sub-revision is in the
// record because the history key needs it). A marshalled KeyValue never
// starts with 0x00, so an mc record without the marker is a copied record:
// its version is in mh as well. Data directories written before moved
// records existed hold only copied records, and a replay of compacted log
// batches (SetKeyState) writes copied records, because writing them again
// must rewrite the same bytes. The invariants, kept by write.go,
// logcompact.go and compact.go:
//
//  1. Every version of a key is in mh, except a current version held in a
//     moved record, which is in mc only.
//  2. A moved record moves to mh in the same engine batch that replaces or
//     deletes it.
//  3. Revision compaction treats a moved record as the key's newest
//     version; a copied record's version is found in mh like any other.
//
// So a read of a version (Range at an old revision, Events, HashKV, log
// compaction's Changes) looks at mc first and at mh after. Storing each
// value once halves what a bulk load writes to the engine, and what the
// engine's flushes, compactions and backups carry for data that is not
// being overwritten (docs/bench/performance.md).
//
// What each operation reads:
//   - Range at the current revision: a scan of mc (values inline).
//   - Range at an older revision R: mc and mh side by side in key order;
//     per key, its current version if at or below R, else one SeekGE in mh
//     to R, and one SeekGE to the next key.
//   - Watch from revision R (Store.Events): a scan of mr from R, then per
//     put event one Get in mc and, if the version has moved on, one in mh
//     (the index holds key pointers, not values).
//   - Open: two Gets (mm"state", mm"compact"); nothing scales with the number
//     of keys, unlike etcd's rebuild of its in-memory index.
//
// # Worked example
//
// Starting from an empty store (revision 1):
//
//	rev 2  Put foo=a           mc"foo" = moved {foo a create 2 mod 2 ver 1} (sub 0); mr 2.0 = put foo
//	rev 3  Txn: Put foo=b,     mh"foo"@2.0 = {foo a ...} (moved out of mc);
//	            Put bar=x      mc"foo" = moved {foo b create 2 mod 3 ver 2}; mr 3.0
//	                           mc"bar" = moved {bar x create 3 mod 3 ver 1} (sub 1); mr 3.1
//	rev 4  Delete foo          mh"foo"@3.0 = {foo b ...} (moved out); mc"foo" removed;
//	                           mh"foo"@4.0 = tombstone; mr 4.0 = tomb foo
//	rev 5  Put foo=c           mc"foo" = moved {foo c create 5 mod 5 ver 1} (a new life)
//
// Versions of foo, newest first: 5.0 c (in mc), then in mh 4.0 tombstone,
// 3.0 b, 2.0 a. Range foo at rev 3: mc's version (5) is newer, so seek mh to
// ^3 and find 3.0 (b); at rev 4 the tombstone (no key); at rev 1 nothing.
// bar at rev 4: its current version (3) answers, and bar has no history.
//
// Compact(4) makes reads below revision 4 fail with ErrCompacted at once
// and records a job; the background compactor then visits mr entries up to
// revision 4 and, for each key named there, keeps its newest version at or
// below 4 (unless that is a deletion before revision 4) and drops everything
// older:
//
//	foo: newest <= 4 is the tombstone 4.0 -> keep it (a deletion at the compact
//	     revision stays for watchers from revision 4; the next compaction drops
//	     it), drop 3.0 and 2.0 (and mr 3.0, 2.0); keep 5.0
//	bar: newest <= 4 is 3.1, its moved current record -> keep it; nothing in mh
//
// # Revision compaction
//
// Compact is a replicated request: the batch records the new compact
// revision (reads below it fail from the next request on) and a job
// (target, progress). Physical removal runs after Commit in the Start
// goroutine, CompactChunk revision-index entries per engine batch, each
// batch recording its progress, so it resumes after a restart. It holds the
// write lock only per chunk, and waits CompactPause between chunks. HashKV never counts versions that compaction
// has yet to remove, so it does not depend on whether removal has run.
//
// Concurrency: see Store and WriteBatch.
package mvcc
