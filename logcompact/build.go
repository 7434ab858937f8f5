package logcompact

import (
	"errors"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/mvcc"
)

// Building a batch (docs/design.md, "The log format" and "The history
// horizon").
//
// Build turns a run of applied entries into a batch. Key writes (Put,
// DeleteRange, Txn) are not kept: what they did is in the store, one
// version per key write, and the revisions a run of indexes produced are
// recorded by the applier (mvcc.RecordIndex). Each version becomes a
// record, except a version superseded by a later version of the same key
// at or below the horizon -- the compact revision that holds after
// recovery -- which nothing observable depends on: reads below the compact
// revision fail, and etcd keeps only the newest version of a key at or
// below it. With --history latest the horizon is the batch's last revision
// and only each key's final version remains. The batch records the compact
// revision that covers what it dropped (Batch.CompactRevision), and replay
// raises the store's to it, so that reads of the dropped versions'
// revisions fail as compacted. Lease grants, revokes and checkpoints,
// revision compactions and member attributes are kept verbatim; a run
// holding any other request (auth, alarms) is not compacted.
//
// A run whose revisions physical revision compaction may have reached is
// not compacted either (mvcc.Store.Changes refuses it, ErrNotCompactable
// here): the versions it removed would be missing from the batch.
//
// Entries that change the raft configuration are not compacted
// (ErrNotCompactable): their ConfState is computed by raft as it applies
// them, which a replay outside raft cannot reproduce; a run holding one
// stays a plain segment.

// ErrNotCompactable reports a run of entries log compaction leaves alone.
var ErrNotCompactable = errors.New("logcompact: entries cannot be compacted")

// Build builds the compacted batch for entries (consecutive,
// all applied to store) under horizon, the revision compaction point that
// holds after recovery: store.CompactRev(), or the store's revision for
// --history latest.
func Build(store *mvcc.Store, entries []*raftpb.Entry, horizon int64) (*Batch, error) {
	return BuildWith(store, entries, horizon, BuildOptions{})
}

// BuildOptions change what Build does with entries a member's recovery
// cannot replay.
type BuildOptions struct {
	// KeepAll keeps verbatim, as RecordEntry records in their place, the
	// entries Build refuses otherwise: configuration changes, auth and
	// alarm requests and unknown kinds. Their effect is then the kept
	// entry itself, applied in order by whoever replays the batch through
	// a whole applier (apply.Applier.ReplayRun with an auth store). A
	// member's own recovery replays before its auth store exists and
	// cannot compute a ConfState, so members never build such batches: a
	// strata logger does (docs/logger.md, "Log compaction"), whose batches
	// are read only by Recover's clients (a point-in-time restore).
	KeepAll bool
}

// BuildWith is Build with options.
func BuildWith(store *mvcc.Store, entries []*raftpb.Entry, horizon int64, opts BuildOptions) (*Batch, error) {
	if len(entries) == 0 {
		return nil, fmt.Errorf("%w: no entries", ErrNotCompactable)
	}
	first, last := entries[0].GetIndex(), entries[len(entries)-1].GetIndex()
	if applied := store.AppliedIndex(); last > applied {
		return nil, fmt.Errorf("%w: entry %d is not applied (applied %d)", ErrNotCompactable, last, applied)
	}
	b := &Batch{FirstIndex: first, LastIndex: last, LastTerm: entries[len(entries)-1].GetTerm()}
	rows, err := store.IndexRevisions(first, last)
	if err != nil {
		return nil, fmt.Errorf("logcompact: compact entries %d..%d: %w", first, last, err)
	}
	revBefore, err := store.RevisionAtIndex(first - 1)
	if err != nil {
		return nil, fmt.Errorf("logcompact: compact entries %d..%d: %w", first, last, err)
	}
	if err := checkIndexRevisions(rows, first, last, revBefore); err != nil {
		return nil, fmt.Errorf("%w: entries %d..%d: %w", ErrNotCompactable, first, last, err)
	}
	// revAt is the revision after index i, for i in the batch.
	revAt := func(i uint64) int64 {
		rev := revBefore
		for _, r := range rows {
			if r.Index > i {
				break
			}
			rev = r.After
		}
		return rev
	}
	b.Revision = revAt(last)
	hasRow := make(map[uint64]bool, len(rows))
	for _, r := range rows {
		hasRow[r.Index] = true
	}
	var kept []Record
	for i, e := range entries {
		if e.GetIndex() != first+uint64(i) {
			return nil, fmt.Errorf("logcompact: compact entries: entry %d follows %d", e.GetIndex(), first+uint64(i)-1)
		}
		if e.GetType() != raftpb.EntryNormal && opts.KeepAll {
			kept = append(kept, Record{Kind: RecordEntry, Index: e.GetIndex(), Entry: e})
			continue
		}
		if e.GetType() != raftpb.EntryNormal {
			return nil, fmt.Errorf("%w: entry %d changes the configuration", ErrNotCompactable, e.GetIndex())
		}
		if len(e.GetData()) == 0 {
			continue
		}
		var req pb.InternalRaftRequest
		if err := proto.Unmarshal(e.GetData(), &req); err != nil {
			return nil, fmt.Errorf("logcompact: compact entries: decode entry %d: %w", e.GetIndex(), err)
		}
		if !hasRow[e.GetIndex()] {
			// Applied before the store kept index rows (an older release):
			// what it wrote cannot be told apart.
			return nil, fmt.Errorf("%w: entry %d has no revision row", ErrNotCompactable, e.GetIndex())
		}
		switch {
		case req.Put != nil || req.DeleteRange != nil || req.Txn != nil:
			continue // its effect is in the key records
		case req.Compaction == nil && req.LeaseGrant == nil && req.LeaseRevoke == nil &&
			req.LeaseCheckpoint == nil && req.ClusterMemberAttrSet == nil && !opts.KeepAll:
			// Auth, alarms, unknown kinds: their appliers are set up after
			// recovery replays batches; leave the segment as it is.
			return nil, fmt.Errorf("%w: entry %d is not a request replay supports", ErrNotCompactable, e.GetIndex())
		case req.Compaction != nil && req.Compaction.Revision > revAt(e.GetIndex()):
			// It failed (a future revision) and changed nothing; replay
			// raises the revision to the batch's last first, where it
			// would succeed.
			continue
		}
		kept = append(kept, Record{Kind: RecordEntry, Index: e.GetIndex(), Entry: e})
	}
	var changes []mvcc.KeyChange
	if len(rows) > 0 {
		changes, err = store.Changes(rows[0].Before, rows[len(rows)-1].After)
		if errors.Is(err, mvcc.ErrChangesCompacted) {
			// Physical revision compaction may have removed versions the
			// run wrote (mvcc.Store.Changes): its records cannot be known.
			return nil, fmt.Errorf("%w: entries %d..%d: %w", ErrNotCompactable, first, last, err)
		}
		if err != nil {
			return nil, fmt.Errorf("logcompact: compact entries %d..%d: %w", first, last, err)
		}
	}
	changes, b.CompactRevision = dropSuperseded(changes, horizon)
	// indexOf is the index that wrote revision rev.
	indexOf := func(rev int64) uint64 {
		for _, r := range rows {
			if rev <= r.After {
				return r.Index
			}
		}
		return last
	}
	recs := make([]Record, 0, len(changes)+len(kept))
	k := 0
	for _, c := range changes {
		at := indexOf(c.Main)
		for k < len(kept) && kept[k].Index < at {
			recs = append(recs, kept[k])
			k++
		}
		r := Record{Index: at, Main: c.Main, Sub: c.Sub, Key: c.Key}
		if c.KV == nil {
			r.Kind = RecordDelete
		} else {
			r.Kind = RecordPut
			r.Value, r.CreateRevision, r.Version, r.Lease = c.KV.Value, c.KV.CreateRevision, c.KV.Version, c.KV.Lease
		}
		recs = append(recs, r)
	}
	b.Records = append(recs, kept[k:]...)
	return b, nil
}

// checkIndexRevisions checks that rows (the index -> revision rows of
// [first, last]) describe one run of a log: indexes increasing within the
// run, and each row moving the revision forward from where the one before
// left it -- the first from revBefore, the revision at first-1. Rows that
// do not are another log's (an old cluster's, kept by a restore before
// restores dropped them) or damaged, and would attribute the wrong
// revisions to the run: a batch built on them can miss writes, even all
// of them. The caller refuses such a run as not compactable rather than as
// corruption: its entries stay in the log, which stands for them exactly,
// and log truncation eventually removes the run and its rows
// (Store.ForgetIndexRevisions), after which compaction resumes by itself.
func checkIndexRevisions(rows []mvcc.IndexRevision, first, last uint64, revBefore int64) error {
	prevIndex, prevAfter := first-1, revBefore
	for _, r := range rows {
		switch {
		case r.Index <= prevIndex || r.Index > last:
			return fmt.Errorf("revision row of index %d after index %d (run %d..%d)", r.Index, prevIndex, first, last)
		case r.Before < prevAfter:
			return fmt.Errorf("revision row of index %d starts at revision %d, below %d where index %d left it", r.Index, r.Before, prevAfter, prevIndex)
		case r.After < r.Before:
			return fmt.Errorf("revision row of index %d goes back from revision %d to %d", r.Index, r.Before, r.After)
		}
		prevIndex, prevAfter = r.Index, r.After
	}
	return nil
}

// dropSuperseded removes every version followed, for the same key, by a
// later version at or below horizon (the history horizon rule). changes
// are in revision order. It also returns the compact revision a store
// must have once the rest is all it holds of them: the newest revision
// that superseded a dropped version (0 if none was dropped). Reads at or
// above it see only versions that are kept; reads below it could miss a
// dropped one, so replay refuses them (etcd's compaction at that revision
// keeps the same versions).
func dropSuperseded(changes []mvcc.KeyChange, horizon int64) ([]mvcc.KeyChange, int64) {
	// newest[key] is the latest revision of key at or below horizon.
	newest := map[string]int64{}
	for _, c := range changes {
		if c.Main <= horizon {
			newest[string(c.Key)] = c.Main
		}
	}
	var compactRev int64
	out := changes[:0]
	for _, c := range changes {
		if n, ok := newest[string(c.Key)]; ok && c.Main < n {
			compactRev = max(compactRev, n)
			continue
		}
		out = append(out, c)
	}
	return out, compactRev
}
