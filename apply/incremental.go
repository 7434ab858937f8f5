package apply

import (
	"fmt"
	"math"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/logcompact"
	"github.com/strata-kv/strata/mvcc"
)

// Incremental snapshots, the installing member's half
// (docs/log-compaction.md, "Incremental snapshots", member steps 3-5).
// Instead of replacing the whole engine with the leader's, the member
// reaches the snapshot's state from its own: its own log's committed
// entries up to the base, then the leader's compacted batches, then the
// leader's entries after them.

// CatchUp is what an incremental snapshot brings: see InstallCatchUp.
type CatchUp struct {
	// Base is the index up to which this member's log holds the leader's
	// entries.
	Base uint64
	// OwnEntries reads this member's raft log: entries [lo, hi), at most
	// maxSize bytes but at least one (raft.Storage's Entries).
	OwnEntries func(lo, hi, maxSize uint64) ([]*raftpb.Entry, error)
	// Batches are the leader's compacted batches, consecutive, the first
	// covering Base+1.
	Batches []*logcompact.Batch
	// Entries follow the last batch (or Base) consecutively and end at
	// End.
	Entries []*raftpb.Entry
	// End is the index the engine holds after the install.
	End uint64
	// ConfState is the snapshot's (raft's membership at End).
	ConfState *raftpb.ConfState
	// MinTTL is the lessor's minimum TTL, for kept lease grants replayed
	// without a lessor.
	MinTTL int64
}

// CatchUpStats says what InstallCatchUp applied.
type CatchUpStats struct {
	// OwnEntries were applied from this member's log, up to Base.
	OwnEntries int
	// Records of the batches and Entries of the leader were applied
	// (those at or below the applied index were skipped).
	Records, Entries int
}

// ownEntriesChunk bounds one read of the member's own log.
const ownEntriesChunk = 16 << 20

// InstallCatchUp brings the store from its applied index A to c.End, in
// one engine batch committed at c.End:
//
//  1. if A < c.Base, the entries (A, Base] of the member's own log are
//     applied through the ordinary request path;
//  2. for each batch ending above max(A, Base), the revision is raised to
//     the batch's and its records above that index are replayed as
//     recovery replays them (SetKeyState, kept entries through
//     replayKept);
//  3. the leader's entries above it are applied through the ordinary
//     request path;
//  4. the snapshot's ConfState is written.
//
// Everything is checked (the own log readable up to Base, the batches and
// entries covering the rest without a gap) before anything is written, and
// one commit makes the install atomic: a crash leaves the engine at A or
// at c.End, never in between. (Step 1 once committed on its own: its
// membership entries carry no ConfState -- raft computes those only for
// entries it applies itself -- so an engine left at Base by a crash held
// the new member list with the old ConfState, and raft restarted with a
// stale configuration.) Replaying a batch on a state at any index inside
// it ends at its last index's state, so the store ends at the leader's
// state at c.End.
//
// It runs on the applier goroutine, when the installer (Config.Installer)
// returns an incremental snapshot's catch-up; the applier then has the
// installer make it durable and reloads the lessor and the auth store.
func (a *Applier) InstallCatchUp(c CatchUp) (CatchUpStats, error) {
	var st CatchUpStats
	applied := a.applied.Load()
	if applied >= c.End {
		return st, fmt.Errorf("apply: catch up to %d: already applied %d", c.End, applied)
	}
	var own []*raftpb.Entry
	for next := applied + 1; next <= c.Base; next = applied + 1 + uint64(len(own)) {
		if c.OwnEntries == nil {
			return st, fmt.Errorf("apply: catch up to %d: applied index %d is below the base %d and the log is not readable", c.End, applied, c.Base)
		}
		ents, err := c.OwnEntries(next, c.Base+1, ownEntriesChunk)
		if err != nil {
			return st, fmt.Errorf("apply: catch up to %d: read own entries %d..%d: %w", c.End, next, c.Base, err)
		}
		if len(ents) == 0 {
			return st, fmt.Errorf("apply: catch up to %d: own log gave no entry %d", c.End, next)
		}
		for i, e := range ents {
			if e.GetIndex() != next+uint64(i) || e.GetIndex() > c.Base {
				return st, fmt.Errorf("apply: catch up to %d: own log gave entry %d after %d (base %d)", c.End, e.GetIndex(), next+uint64(i)-1, c.Base)
			}
		}
		own = append(own, ents...)
	}
	// from is the index the store holds once its own entries are applied:
	// the batches and the leader's entries start above it.
	from := max(applied, c.Base)
	// Check that the batches and entries cover (from, End] without a gap
	// before writing anything.
	next := from + 1
	for _, b := range c.Batches {
		if b.LastIndex < next {
			continue
		}
		if b.FirstIndex > next {
			return st, fmt.Errorf("apply: catch up to %d: compacted batch %d..%d does not cover index %d", c.End, b.FirstIndex, b.LastIndex, next)
		}
		next = b.LastIndex + 1
	}
	for _, e := range c.Entries {
		if e.GetIndex() < next {
			continue
		}
		if e.GetIndex() != next {
			return st, fmt.Errorf("apply: catch up to %d: entry %d where %d was due", c.End, e.GetIndex(), next)
		}
		next++
	}
	if next != c.End+1 {
		return st, fmt.Errorf("apply: catch up to %d: the batches and entries end at %d", c.End, next-1)
	}

	w := a.store.Write(a.leases())
	fail := func(err error) (CatchUpStats, error) {
		w.Abort()
		return st, fmt.Errorf("apply: catch up from %d to %d: %w", applied, c.End, err)
	}
	ms := a.memberState()
	var answers []answer
	// applyEntry applies one entry through the ordinary request path.
	applyEntry := func(e *raftpb.Entry) error {
		switch e.GetType() {
		case raftpb.EntryNormal:
			if len(e.GetData()) == 0 {
				return nil // a new leader's empty entry
			}
			var req pb.InternalRaftRequest
			if err := proto.Unmarshal(e.GetData(), &req); err != nil {
				return fmt.Errorf("decode entry %d: %w", e.GetIndex(), err)
			}
			revBefore := w.Rev()
			res, err := a.applyRequest(w, &req, ms, e.GetIndex())
			if err == nil {
				err = w.RecordIndex(e.GetIndex(), revBefore)
			}
			if err != nil {
				return fmt.Errorf("entry %d: %w", e.GetIndex(), err)
			}
			if id := requestID(&req); id != 0 {
				answers = append(answers, answer{id: id, result: res})
			}
		case raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
			// Its ConfState is not known here; the snapshot's, written
			// below in the same batch, is the one at c.End.
			id, refused, err := ms.applyChange(e, a.cfg.MaxLearners)
			if err != nil {
				return fmt.Errorf("conf change %d: %w", e.GetIndex(), err)
			}
			if id != 0 {
				answers = append(answers, answer{id: id, result: Result{Err: refused}})
			}
		}
		return nil
	}
	for _, e := range own {
		if err := applyEntry(e); err != nil {
			return fail(fmt.Errorf("own entries up to base %d: %w", c.Base, err))
		}
		st.OwnEntries++
	}
	for _, b := range c.Batches {
		if b.LastIndex <= from {
			continue
		}
		if err := w.RaiseRevision(b.Revision); err != nil {
			return fail(err)
		}
		for _, r := range b.Records {
			if r.Index <= from {
				continue
			}
			var err error
			switch r.Kind {
			case logcompact.RecordPut, logcompact.RecordDelete:
				err = w.SetKeyState(keyChangeOf(r))
			case logcompact.RecordEntry:
				err = a.replayKeptLive(w, r.Entry, ms, c.MinTTL)
			}
			if err != nil {
				return fail(fmt.Errorf("compacted batch %d..%d at index %d: %w", b.FirstIndex, b.LastIndex, r.Index, err))
			}
			st.Records++
		}
		// The versions the batch dropped under the history horizon are
		// missing below its compact revision, as after recovery (a
		// version 1 batch, from an older leader, does not record it: its
		// revision, which is safe whatever horizon it was built with).
		if err := w.RaiseCompactRev(b.CompactRevisionAfter(math.MaxInt64)); err != nil {
			return fail(fmt.Errorf("compacted batch %d..%d: %w", b.FirstIndex, b.LastIndex, err))
		}
		// The revision at the batch's end, for RevisionAtIndex (the
		// replayed indexes have no rows of their own), as recovery writes.
		if err := w.RecordIndex(b.LastIndex, w.Rev()); err != nil {
			return fail(err)
		}
	}
	for _, e := range c.Entries {
		if e.GetIndex() <= from {
			continue
		}
		st.Entries++
		if err := applyEntry(e); err != nil {
			return fail(err)
		}
	}
	if c.ConfState != nil {
		raw, err := proto.Marshal(c.ConfState)
		if err == nil {
			err = w.SetMeta(metaConfState, raw)
		}
		if err != nil {
			return fail(fmt.Errorf("conf state: %w", err))
		}
	}
	if err := ms.write(w); err != nil {
		return fail(fmt.Errorf("membership: %w", err))
	}
	if err := w.Commit(c.End); err != nil {
		return st, fmt.Errorf("apply: catch up from %d to %d: %w", applied, c.End, err)
	}
	if c.ConfState != nil {
		a.confState.Store(proto.CloneOf(c.ConfState))
	}
	a.publish(ms)
	a.applied.Store(c.End)
	a.cfg.Waiters.answer(answers)
	return st, nil
}

// replayKeptLive is replayKept for an applier that has a lessor: a kept
// revocation drops the lease record (replayKept) and also the lease from
// the lessor's memory, so that a put to it later in the same engine batch
// is refused, as it was where the entries were first applied. (Grants and
// checkpoints already go through the lessor.)
func (a *Applier) replayKeptLive(w *mvcc.WriteBatch, e *raftpb.Entry, ms *memberState, minTTL int64) error {
	if err := a.replayKept(w, e, ms, minTTL); err != nil || a.lessor == nil || e.GetType() != raftpb.EntryNormal {
		return err
	}
	var req pb.InternalRaftRequest
	if err := proto.Unmarshal(e.GetData(), &req); err != nil {
		return fmt.Errorf("decode kept entry %d: %w", e.GetIndex(), err)
	}
	if req.LeaseRevoke != nil {
		a.lessor.Forget(req.LeaseRevoke.ID)
	}
	return nil
}
