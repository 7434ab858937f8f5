package apply

import (
	"fmt"
	"runtime"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/lease"
	"github.com/strata-kv/strata/logcompact"
	"github.com/strata-kv/strata/mvcc"
)

// Replay of compacted batches, the applier's half: logcompact builds
// batches and chooses, per recovery strategy, what to replay
// (logcompact.Replay); the applier writes it, since a kept entry (a lease
// grant, a revision compaction, member attributes) applies as the applier
// applies it. The state after a run equals the state the entries
// themselves would have produced.

// ReplayRun writes run to the store in one engine batch (logcompact.Run
// says what that is), for log compaction's recovery (logcompact.Replay)
// before Run starts. Records at or below the applied index are in the
// store already and skipped; a run that does not reach past the applied
// index changes nothing. minTTL is the lessor's minimum TTL, applied to
// replayed grants when no lessor is set (recovery runs before the member
// creates it).
func (a *Applier) ReplayRun(run logcompact.Run, minTTL int64) error {
	first, last, records := run.FirstIndex, run.LastIndex, run.Records
	applied := a.store.AppliedIndex()
	if last <= applied {
		return nil
	}
	if first > applied+1 {
		return fmt.Errorf("apply: compacted batch %d..%d does not follow the applied index %d", first, last, applied)
	}
	w := a.store.Write(a.leases())
	ms := a.memberState()
	if err := w.RaiseRevision(run.Revision); err != nil {
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
		if r.Kind == logcompact.RecordEntry {
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
		case logcompact.RecordPut, logcompact.RecordDelete:
			err = w.SetPreparedKeyState(&prepared[0])
			prepared = prepared[1:]
		case logcompact.RecordEntry:
			err = a.replayKept(w, r.Entry, ms, minTTL)
		}
		if err != nil {
			w.Abort()
			return fmt.Errorf("apply: replay compacted batch %d..%d at index %d: %w", first, last, r.Index, err)
		}
	}
	// The versions dropped under the history horizon are missing below
	// run.CompactRevision: reads there must fail as compacted, not answer without
	// them.
	if err := w.RaiseCompactRev(run.CompactRevision); err != nil {
		w.Abort()
		return fmt.Errorf("apply: replay compacted batch %d..%d: %w", first, last, err)
	}
	// The revision at last, for RevisionAtIndex when the next batch is
	// built (the replayed indexes have no rows of their own).
	if err := w.RecordIndex(last, w.Rev()); err != nil {
		w.Abort()
		return err
	}
	if err := ms.write(w); err != nil {
		w.Abort()
		return fmt.Errorf("apply: replay compacted batch %d..%d: membership: %w", first, last, err)
	}
	if err := w.CommitWithKeyStates(last, prepared, workers); err != nil {
		return fmt.Errorf("apply: replay compacted batch %d..%d: %w", first, last, err)
	}
	a.publish(ms)
	a.applied.Store(last)
	return nil
}

// replayKept applies a kept entry. A lease request that the alarms or auth refused changes
// nothing, as it changed nothing when it was applied. A lease revocation
// drops only the lease record: the deletions of its keys are records of
// their own. Recovery replays before the member creates its lessor, so
// without one, grants and checkpoints are written as the lessor would
// write them; with one (tests), the lessor sees grants and checkpoints but
// not revocations, and must be reloaded.
func (a *Applier) replayKept(w *mvcc.WriteBatch, e *raftpb.Entry, ms *memberState, minTTL int64) error {
	if t := e.GetType(); t == raftpb.EntryConfChange || t == raftpb.EntryConfChangeV2 {
		// Only a logger's batches keep them (logcompact.BuildOptions):
		// the member list changes as Run changes it, refusals included;
		// no ConfState is recorded (a replay outside raft has none to
		// record).
		_, _, err := ms.applyChange(e, a.cfg.MaxLearners)
		return err
	}
	var req pb.InternalRaftRequest
	if err := proto.Unmarshal(e.GetData(), &req); err != nil {
		return fmt.Errorf("decode kept entry %d: %w", e.GetIndex(), err)
	}
	if req.LeaseRevoke != nil || req.LeaseGrant != nil || req.LeaseCheckpoint != nil {
		// The live applier decided them against the alarms and auth state
		// at their index, which is the state replay starts from: a run
		// holding an alarm or auth request is never compacted, and
		// batches follow the applied index with no gap.
		if res, handled, err := a.gate(w, &req); handled || err != nil {
			if err == nil && res.Err == nil {
				err = fmt.Errorf("kept entry %d: a lease request handled as an auth request", e.GetIndex())
			}
			if err != nil {
				return err
			}
			return nil // refused: it changed nothing
		}
	}
	switch {
	case req.LeaseRevoke != nil:
		return w.DropLeaseRecord(req.LeaseRevoke.ID)
	case req.LeaseGrant != nil && a.lessor == nil:
		g := req.LeaseGrant
		// The lessor's refusals (lease.Lessor.Grant) changed nothing.
		if g.ID == 0 || g.TTL > lease.MaxLeaseTTL {
			return nil
		}
		if ok, err := w.LeaseRecordExists(g.ID); err != nil || ok {
			return err
		}
		return w.PutLease(mvcc.LeaseRecord{ID: g.ID, TTL: max(g.TTL, minTTL)})
	case req.LeaseCheckpoint != nil && a.lessor == nil:
		for _, cp := range req.LeaseCheckpoint.Checkpoints {
			if err := w.CheckpointLease(cp.ID, cp.Remaining_TTL); err != nil {
				return err
			}
		}
		return nil
	}
	_, err := a.applyRequest(w, &req, ms, e.GetIndex())
	return err
}

// keyChangeOf is the key version a put or delete record stands for.
func keyChangeOf(r logcompact.Record) mvcc.KeyChange {
	c := mvcc.KeyChange{Main: r.Main, Sub: r.Sub, Key: r.Key}
	if r.Kind == logcompact.RecordPut {
		c.KV = &mvccpb.KeyValue{Key: r.Key, Value: r.Value, CreateRevision: r.CreateRevision, ModRevision: r.Main,
			Version: r.Version, Lease: r.Lease}
	}
	return c
}
