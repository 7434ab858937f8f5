package apply

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/lease"
	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/raftlog"
)

// Log compaction, the applier's half (docs/design.md, "The log format" and
// "The history horizon"; raftlog/FORMAT.md, "Compacted batch files").
//
// BuildCompactedBatch turns a run of applied entries into a compacted
// batch. Key writes (Put, DeleteRange, Txn) are not kept: what they did is
// in the store, one version per key write, and the revisions a run of
// indexes produced are recorded by the applier (mvcc.RecordIndex). Each
// version becomes a record, except a version superseded by a later
// version of the same key at or below the horizon -- the compact revision
// that holds after recovery -- which nothing observable depends on:
// reads below the compact revision fail, and etcd keeps only the newest
// version of a key at or below it. With --history latest the horizon is
// the batch's last revision and only each key's final version remains.
// The batch records the compact revision that covers what it dropped
// (CompactedBatch.CompactRevision), and replay raises the store's to it,
// so that reads of the dropped versions' revisions fail as compacted.
// Lease grants, revokes and checkpoints, revision compactions and member
// attributes are kept verbatim; a run holding any other request (auth,
// alarms) is not compacted.
//
// ReplayCompactedBatch is the inverse, run by recovery on the store before
// raft starts: records after the applied index are written back
// idempotently, kept entries are applied, and the batch commits with the
// batch's last index as the applied index, so the state equals the state
// the entries themselves would have produced.
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
var ErrNotCompactable = errors.New("apply: entries cannot be compacted")

// BuildCompactedBatch builds the compacted batch for entries (consecutive,
// all applied to store) under horizon, the revision compaction point that
// holds after recovery: store.CompactRev(), or the store's revision for
// --history latest.
func BuildCompactedBatch(store *mvcc.Store, entries []*raftpb.Entry, horizon int64) (*raftlog.CompactedBatch, error) {
	if len(entries) == 0 {
		return nil, fmt.Errorf("%w: no entries", ErrNotCompactable)
	}
	first, last := entries[0].GetIndex(), entries[len(entries)-1].GetIndex()
	if applied := store.AppliedIndex(); last > applied {
		return nil, fmt.Errorf("%w: entry %d is not applied (applied %d)", ErrNotCompactable, last, applied)
	}
	b := &raftlog.CompactedBatch{FirstIndex: first, LastIndex: last, LastTerm: entries[len(entries)-1].GetTerm()}
	rows, err := store.IndexRevisions(first, last)
	if err != nil {
		return nil, fmt.Errorf("apply: compact entries %d..%d: %w", first, last, err)
	}
	revBefore, err := store.RevisionAtIndex(first - 1)
	if err != nil {
		return nil, fmt.Errorf("apply: compact entries %d..%d: %w", first, last, err)
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
	var kept []raftlog.BatchRecord
	for i, e := range entries {
		if e.GetIndex() != first+uint64(i) {
			return nil, fmt.Errorf("apply: compact entries: entry %d follows %d", e.GetIndex(), first+uint64(i)-1)
		}
		if e.GetType() != raftpb.EntryNormal {
			return nil, fmt.Errorf("%w: entry %d changes the configuration", ErrNotCompactable, e.GetIndex())
		}
		if len(e.GetData()) == 0 {
			continue
		}
		var req pb.InternalRaftRequest
		if err := proto.Unmarshal(e.GetData(), &req); err != nil {
			return nil, fmt.Errorf("apply: compact entries: decode entry %d: %w", e.GetIndex(), err)
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
			req.LeaseCheckpoint == nil && req.ClusterMemberAttrSet == nil:
			// Auth, alarms, unknown kinds: their appliers are set up after
			// recovery replays batches; leave the segment as it is.
			return nil, fmt.Errorf("%w: entry %d is not a request replay supports", ErrNotCompactable, e.GetIndex())
		case req.Compaction != nil && req.Compaction.Revision > revAt(e.GetIndex()):
			// It failed (a future revision) and changed nothing; replay
			// raises the revision to the batch's last first, where it
			// would succeed.
			continue
		}
		kept = append(kept, raftlog.BatchRecord{Kind: raftlog.RecordEntry, Index: e.GetIndex(), Entry: e})
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
			return nil, fmt.Errorf("apply: compact entries %d..%d: %w", first, last, err)
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
	recs := make([]raftlog.BatchRecord, 0, len(changes)+len(kept))
	k := 0
	for _, c := range changes {
		at := indexOf(c.Main)
		for k < len(kept) && kept[k].Index < at {
			recs = append(recs, kept[k])
			k++
		}
		r := raftlog.BatchRecord{Index: at, Main: c.Main, Sub: c.Sub, Key: c.Key}
		if c.KV == nil {
			r.Kind = raftlog.RecordDelete
		} else {
			r.Kind = raftlog.RecordPut
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

// compactRevAfter is the compact revision a store must have once it has
// replayed b: the one b records, or, for a batch read from a version 1
// file, which does not record it, the most the history horizon it may
// have been built with allows (min(horizon, b.Revision): the batch's
// revision with --history latest).
func compactRevAfter(b *raftlog.CompactedBatch, horizon int64) int64 {
	if b.CompactRevision == raftlog.UnknownCompactRevision {
		return min(horizon, b.Revision)
	}
	return b.CompactRevision
}

// ReplayCompactedBatch applies b to the store in one write batch
// committed at b.LastIndex: the records and kept entries after the store's
// applied index (those at or below it are in the store already), and the
// compact revision raised to b's (a version 1 batch, which does not
// record it: to its revision). It runs during recovery, before Run; a
// batch at or below the applied index is skipped. minTTL is the lessor's
// minimum TTL, applied to replayed grants when no lessor is set (recovery
// runs before the member creates it).
func (a *Applier) ReplayCompactedBatch(b *raftlog.CompactedBatch, minTTL int64) error {
	return a.replayBatch(b, math.MaxInt64, minTTL)
}

// replayBatch is ReplayCompactedBatch, with the history horizon b may have
// been built with, for compactRevAfter.
func (a *Applier) replayBatch(b *raftlog.CompactedBatch, horizon, minTTL int64) error {
	applied := a.store.AppliedIndex()
	if b.LastIndex <= applied {
		return nil
	}
	if b.FirstIndex > applied+1 {
		return fmt.Errorf("apply: compacted batch %d..%d does not follow the applied index %d", b.FirstIndex, b.LastIndex, applied)
	}
	return a.replayRecords(b.FirstIndex, b.LastIndex, b.Revision, compactRevAfter(b, horizon), b.Records, minTTL)
}

// replayRecords writes records after the applied index in one batch
// committed at last, the revision raised to rev first and the compact
// revision to compactRev after the kept entries (a revision compaction
// among them applies as it did).
func (a *Applier) replayRecords(first, last uint64, rev, compactRev int64, records []raftlog.BatchRecord, minTTL int64) error {
	applied := a.store.AppliedIndex()
	w := a.store.Write()
	members := append([]*pb.Member(nil), a.Members()...)
	membersChanged := false
	if err := w.RaiseRevision(rev); err != nil {
		w.Abort()
		return err
	}
	// Replay is applied in parallel where records are independent. Each
	// key's records are independent of every other key's, and kept
	// entries write no key, so the key records are prepared (current
	// version read, state encoded) in parallel, split by key. The records
	// after the last kept entry, usually nearly all of them, are also
	// written in parallel into write-only batches that commit after the
	// rest (nothing reads them before the commit); the others are written
	// in log order into the batch, where the kept entries that follow them
	// (a revision compaction, a lease revocation) read them.
	workers := runtime.GOMAXPROCS(0)
	var changes []mvcc.KeyChange
	tailFrom := len(records) // records[tailFrom:] are key records
	for i, r := range records {
		if r.Index <= applied {
			continue
		}
		if r.Kind == raftlog.RecordEntry {
			tailFrom = len(records)
			continue
		}
		changes = append(changes, keyChangeOf(r))
		if tailFrom == len(records) {
			tailFrom = i
		}
	}
	prepared, err := a.store.PrepareKeyStates(changes, workers)
	if err != nil {
		w.Abort()
		return fmt.Errorf("apply: replay compacted batch %d..%d: %w", first, last, err)
	}
	for _, r := range records[:tailFrom] {
		if r.Index <= applied {
			continue
		}
		var err error
		switch r.Kind {
		case raftlog.RecordPut, raftlog.RecordDelete:
			err = w.SetPreparedKeyState(&prepared[0])
			prepared = prepared[1:]
		case raftlog.RecordEntry:
			var changed bool
			changed, err = a.replayKept(w, r.Entry, &members, minTTL)
			membersChanged = membersChanged || changed
		}
		if err != nil {
			w.Abort()
			return fmt.Errorf("apply: replay compacted batch %d..%d at index %d: %w", first, last, r.Index, err)
		}
	}
	// The versions dropped under the history horizon are missing below
	// compactRev: reads there must fail as compacted, not answer without
	// them.
	if err := w.RaiseCompactRev(compactRev); err != nil {
		w.Abort()
		return fmt.Errorf("apply: replay compacted batch %d..%d: %w", first, last, err)
	}
	// The revision at last, for RevisionAtIndex when the next batch is
	// built (the replayed indexes have no rows of their own).
	if err := w.RecordIndex(last, w.Rev()); err != nil {
		w.Abort()
		return err
	}
	if membersChanged {
		raw, err := proto.Marshal(&pb.MemberListResponse{Members: members})
		if err == nil {
			err = w.SetMeta(metaMembers, raw)
		}
		if err != nil {
			w.Abort()
			return fmt.Errorf("apply: replay compacted batch %d..%d: membership: %w", first, last, err)
		}
	}
	if err := w.CommitWithKeyStates(last, prepared, workers); err != nil {
		return fmt.Errorf("apply: replay compacted batch %d..%d: %w", first, last, err)
	}
	a.members.Store(&members)
	a.applied.Store(last)
	return nil
}

// Recovery strategies (seed 000, section 3.4) for the compacted batches
// after the applied index.
const (
	// RecoveryNaive replays the batches in ascending order, one engine
	// batch each.
	RecoveryNaive = "naive"
	// RecoveryDescending reads the batches newest-first and keeps, per
	// key, only the records the history horizon still needs (for each key
	// the records down to and including its newest one at or below the
	// horizon), then applies that minimal set, with every kept entry, in
	// one engine batch.
	RecoveryDescending = "descending"
)

// ReplayTimings says how long each recovery step took (seed 000, Table 4).
type ReplayTimings struct {
	Batches, Records, Applied int
	Select, Apply             time.Duration
}

// ReplayCompactedBatches replays batches (oldest first, as
// raftlog.CompactedBatches returns them) with strategy. horizon is the
// revision compaction point known to hold after recovery (the store's
// compact revision before replay is always safe).
func (a *Applier) ReplayCompactedBatches(batches []*raftlog.CompactedBatch, strategy string, horizon, minTTL int64) (ReplayTimings, error) {
	var t ReplayTimings
	applied := a.store.AppliedIndex()
	var live []*raftlog.CompactedBatch
	for _, b := range batches {
		if b.LastIndex > applied {
			live = append(live, b)
			t.Records += len(b.Records)
		}
	}
	t.Batches = len(live)
	if len(live) == 0 {
		return t, nil
	}
	if live[0].FirstIndex > applied+1 {
		return t, fmt.Errorf("apply: compacted batch %d..%d does not follow the applied index %d", live[0].FirstIndex, live[0].LastIndex, applied)
	}
	for i := 1; i < len(live); i++ {
		if live[i].FirstIndex != live[i-1].LastIndex+1 {
			return t, fmt.Errorf("apply: compacted batches %d..%d and %d..%d leave a gap",
				live[i-1].FirstIndex, live[i-1].LastIndex, live[i].FirstIndex, live[i].LastIndex)
		}
	}
	switch strategy {
	case RecoveryNaive, "":
		start := time.Now()
		for _, b := range live {
			if err := a.replayBatch(b, horizon, minTTL); err != nil {
				return t, err
			}
			t.Applied += len(b.Records)
		}
		t.Apply = time.Since(start)
		return t, nil
	case RecoveryDescending:
		start := time.Now()
		// newest[key] is the newest revision seen so far, walking back,
		// that is at or below the horizon: older records of the key are
		// superseded at or below the horizon and dropped, and the compact
		// revision is raised to it (see dropSuperseded), and to the
		// batches' own.
		newest := map[string]int64{}
		var compactRev int64
		var keep [][]raftlog.BatchRecord
		for i := len(live) - 1; i >= 0; i-- {
			compactRev = max(compactRev, compactRevAfter(live[i], horizon))
			recs := live[i].Records
			var kept []raftlog.BatchRecord
			for j := len(recs) - 1; j >= 0; j-- {
				r := recs[j]
				if r.Index <= applied {
					break
				}
				if r.Kind != raftlog.RecordEntry {
					if n, ok := newest[string(r.Key)]; ok {
						compactRev = max(compactRev, n)
						continue
					}
					if r.Main <= horizon {
						newest[string(r.Key)] = r.Main
					}
				}
				kept = append(kept, r)
			}
			slices.Reverse(kept)
			keep = append(keep, kept)
		}
		slices.Reverse(keep)
		minimal := slices.Concat(keep...)
		t.Select = time.Since(start)
		start = time.Now()
		last := live[len(live)-1]
		if err := a.replayRecords(live[0].FirstIndex, last.LastIndex, last.Revision, compactRev, minimal, minTTL); err != nil {
			return t, err
		}
		t.Apply, t.Applied = time.Since(start), len(minimal)
		return t, nil
	}
	return t, fmt.Errorf("apply: unknown recovery strategy %q (want %s or %s)", strategy, RecoveryNaive, RecoveryDescending)
}

// replayKept applies a kept entry and reports whether the membership
// changed. A lease revocation drops only the lease record: the deletions
// of its keys are records of their own. Recovery replays before the
// member creates its lessor, so without one, grants and checkpoints are
// written as the lessor would write them; with one (tests), the lessor
// sees grants and checkpoints but not revocations, and must be reloaded.
func (a *Applier) replayKept(w *mvcc.WriteBatch, e *raftpb.Entry, members *[]*pb.Member, minTTL int64) (bool, error) {
	var req pb.InternalRaftRequest
	if err := proto.Unmarshal(e.GetData(), &req); err != nil {
		return false, fmt.Errorf("decode kept entry %d: %w", e.GetIndex(), err)
	}
	switch {
	case req.LeaseRevoke != nil:
		return false, w.DropLeaseRecord(req.LeaseRevoke.ID)
	case req.LeaseGrant != nil && a.lessor == nil:
		g := req.LeaseGrant
		// The lessor's refusals (lease.Lessor.Grant) changed nothing.
		if g.ID == 0 || g.TTL > lease.MaxLeaseTTL {
			return false, nil
		}
		if ok, err := w.LeaseRecordExists(g.ID); err != nil || ok {
			return false, err
		}
		return false, w.PutLease(mvcc.LeaseRecord{ID: g.ID, TTL: max(g.TTL, minTTL)})
	case req.LeaseCheckpoint != nil && a.lessor == nil:
		for _, cp := range req.LeaseCheckpoint.Checkpoints {
			if err := w.CheckpointLease(cp.ID, cp.Remaining_TTL); err != nil {
				return false, err
			}
		}
		return false, nil
	}
	_, changed, err := a.applyRequest(w, &req, members)
	return changed, err
}

// keyChangeOf is the key version a put or delete record stands for.
func keyChangeOf(r raftlog.BatchRecord) mvcc.KeyChange {
	c := mvcc.KeyChange{Main: r.Main, Sub: r.Sub, Key: r.Key}
	if r.Kind == raftlog.RecordPut {
		c.KV = &mvccpb.KeyValue{Key: r.Key, Value: r.Value, CreateRevision: r.CreateRevision, ModRevision: r.Main,
			Version: r.Version, Lease: r.Lease}
	}
	return c
}
