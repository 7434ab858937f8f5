package apply

import (
	"errors"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/raftlog"
)

// Log compaction, the applier's half (DESIGN.md, "The log" and "History
// horizon"; raftlog/FORMAT.md, "Compacted batch files").
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
// Every other request is kept verbatim: lease grant, revoke and
// checkpoint, revision compaction, member attributes, alarms.
//
// ReplayCompactedBatch is the inverse, run by recovery on the store before
// raft starts: records after the applied index are written back
// idempotently, kept entries are applied, and the batch commits with the
// batch's last index as the applied index, so the state equals the state
// the entries themselves would have produced.
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
		switch {
		case req.Put != nil || req.DeleteRange != nil || req.Txn != nil:
			continue // its effect is in the key records
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
		if changes, err = store.Changes(rows[0].Before, rows[len(rows)-1].After); err != nil {
			return nil, fmt.Errorf("apply: compact entries %d..%d: %w", first, last, err)
		}
	}
	changes = dropSuperseded(changes, horizon)
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

// dropSuperseded removes every version followed, for the same key, by a
// later version at or below horizon (the history horizon rule). changes
// are in revision order.
func dropSuperseded(changes []mvcc.KeyChange, horizon int64) []mvcc.KeyChange {
	// newestAtHorizon[key] is the latest revision of key at or below horizon.
	newest := map[string]int64{}
	for _, c := range changes {
		if c.Main <= horizon {
			newest[string(c.Key)] = c.Main
		}
	}
	out := changes[:0]
	for _, c := range changes {
		if n, ok := newest[string(c.Key)]; ok && c.Main < n {
			continue
		}
		out = append(out, c)
	}
	return out
}

// ReplayCompactedBatch applies b to the store in one write batch committed
// at b.LastIndex: the records and kept entries after the store's applied
// index (those at or below it are in the store already). It runs during
// recovery, before Run; a batch at or below the applied index is skipped.
func (a *Applier) ReplayCompactedBatch(b *raftlog.CompactedBatch) error {
	applied := a.store.AppliedIndex()
	if b.LastIndex <= applied {
		return nil
	}
	w := a.store.Write()
	members := append([]*pb.Member(nil), a.Members()...)
	if err := w.RaiseRevision(b.Revision); err != nil {
		w.Abort()
		return err
	}
	for _, r := range b.Records {
		if r.Index <= applied {
			continue
		}
		var err error
		switch r.Kind {
		case raftlog.RecordPut:
			err = w.SetKeyState(mvcc.KeyChange{Main: r.Main, Sub: r.Sub, Key: r.Key, KV: kvOf(r)})
		case raftlog.RecordDelete:
			err = w.SetKeyState(mvcc.KeyChange{Main: r.Main, Sub: r.Sub, Key: r.Key})
		case raftlog.RecordEntry:
			err = a.replayKept(w, r.Entry, &members)
		}
		if err != nil {
			w.Abort()
			return fmt.Errorf("apply: replay compacted batch %d..%d at index %d: %w", b.FirstIndex, b.LastIndex, r.Index, err)
		}
	}
	if err := w.Commit(b.LastIndex); err != nil {
		return fmt.Errorf("apply: replay compacted batch %d..%d: %w", b.FirstIndex, b.LastIndex, err)
	}
	a.members.Store(&members)
	a.applied.Store(b.LastIndex)
	return nil
}

// replayKept applies a kept entry. A lease revocation drops only the lease
// record: the deletions of its keys are records of their own.
func (a *Applier) replayKept(w *mvcc.WriteBatch, e *raftpb.Entry, members *[]*pb.Member) error {
	var req pb.InternalRaftRequest
	if err := proto.Unmarshal(e.GetData(), &req); err != nil {
		return fmt.Errorf("decode kept entry %d: %w", e.GetIndex(), err)
	}
	switch {
	case req.LeaseRevoke != nil:
		return w.DropLeaseRecord(req.LeaseRevoke.ID)
	case req.LeaseGrant != nil && a.lessor == nil:
		// No lessor (tests of the store alone): keep the record as asked.
		return w.PutLease(mvcc.LeaseRecord{ID: req.LeaseGrant.ID, TTL: req.LeaseGrant.TTL})
	case req.LeaseCheckpoint != nil && a.lessor == nil:
		return nil
	}
	_, _, err := a.applyRequest(w, &req, members)
	return err
}

func kvOf(r raftlog.BatchRecord) *mvccpb.KeyValue {
	return &mvccpb.KeyValue{Key: r.Key, Value: r.Value, CreateRevision: r.CreateRevision, ModRevision: r.Main,
		Version: r.Version, Lease: r.Lease}
}
