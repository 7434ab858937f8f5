// Package watch is the hub behind etcd's Watch service: it turns committed
// revisions of the mvcc store into the WatchResponses of many watchers on
// many streams, with etcd's semantics (start revisions in the past, a
// negative one refused as compacted, compaction, key ranges, prev_kv,
// filters, progress notifications), and
// without letting a slow watcher block writes or grow memory.
//
// # Where events come from
//
// The hub keeps no event history in memory. The applier tells it, after
// each engine commit, that the store's revision moved (Notify, a
// non-blocking signal: the apply path pays one channel send). The hub's
// goroutine then reads the events of the new revisions from the store's
// revision index (mvcc.Store.Events, an engine snapshot) and hands them
// to the watchers that match. Reading back what was just written costs a
// memtable scan, and the applier never waits for it.
//
// # Synced and unsynced watchers
//
// As in etcd, every watcher is in one of two groups:
//
//   - synced: it has been offered every event up to the hub's revision
//     (Hub.mu.rev). One scan of the new revisions serves the whole group.
//   - unsynced: it still needs events from its own next revision, which is
//     at or below the hub's revision. A watcher starts here when its start
//     revision is in the past, and falls back here when its stream's queue
//     is full. A catch-up pass scans the revision index once, from the
//     lowest next revision of the unsynced watchers whose streams have
//     room, at most ScanLimit events, and delivers to each watcher the
//     events at or after its own next revision; a watcher that reaches the
//     hub's revision rejoins the synced group.
//
// etcd keeps a third group, victims, holding events already read that did
// not fit; here a watcher whose response does not fit keeps nothing: it
// goes to unsynced and reads those events again from the engine later. So
// the memory a watcher costs is its fixed state, plus at most its stream's
// queue (QueueLen responses and QueueBytes of keys and values, give or
// take one response), however far it falls behind; and all queues together
// hold at most TotalQueueBytes plus one response per stream.
//
// # Invariants
//
//  1. A watcher sees each event at most once and in revision order: its
//     next revision moves forward only when a response carrying every
//     matching event below it has been queued, and queues are FIFO.
//  2. A revision's events are never split between two responses of the
//     hub (the server may fragment one response on the wire, as etcd does).
//  3. A response queued at hub revision R, and every response queued on the
//     same stream before it, covers every event up to R for its watcher;
//     progress notifications therefore carry the hub's revision, never the
//     store's (which may be ahead).
//  4. Nothing the hub does blocks the applier: Notify never blocks, and
//     queue pushes from the hub never wait.
//  5. A progress notification at revision R, requested or periodic, is
//     queued only if every watcher it speaks for is synced, has a next
//     revision at most R+1 and a start revision, if the client chose one,
//     at most R (as etcd's progressIfSync), and no response queued before
//     it on the stream carries a revision above R. So progress revisions
//     never go back on a stream, nor below what a watcher's start revision
//     told its client it held (a client resuming at N on a member still
//     catching up). A RequestProgress that cannot be answered yet is
//     answered once it can; one on a stream with no live watch is not
//     answered at all, as in etcd (no watcher to speak for). A periodic
//     notification waits for the next tick, and skips the tick after
//     events were queued for its watcher (etcd elides it after a key
//     update). The tick is the hub's, for every stream at once; etcd
//     jitters each stream's by up to a tenth of the interval.
//
// # Known difference from etcd
//
// etcd hands each revision's events to its synced watchers as the
// revision commits; this hub reads them from the store shortly after. If
// a compaction above the hub's revision commits in between (a compaction
// to within a few revisions of the head, while the hub lags), the events
// between are compacted before the hub reads them, and its synced
// watchers are canceled with the compact revision, where etcd would have
// delivered them. Clients resume as after any compaction.
//
// # Concurrency
//
// Hub.Start runs one goroutine (dispatch, catch-up, periodic progress)
// until Close. A Stream is driven by two goroutines of the gRPC handler:
// one calls Watch, Cancel and RequestProgress, the other Next. Lock order:
// Hub.mu, then Stream.qmu.
package watch
