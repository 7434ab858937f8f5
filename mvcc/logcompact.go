package mvcc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/strata-kv/strata/engine"
)

// What log compaction needs from the store (docs/design.md, "The log
// format" and "The history horizon").
//
// Log compaction rewrites a run of applied raft entries as one record per
// key version that recovery must rebuild. Those versions are already in the
// store: every write left its KeyValue in mh and its revision in mr. What
// the store did not know is which revisions a run of raft indexes produced.
// The applier therefore calls RecordIndex after every request, in the same
// batch:
//
//	mi<index>   -> revision before, revision after (8 bytes each, big-endian)
//
// so IndexRevisions(first, last) is one short scan and RevisionAtIndex one
// seek. Indexes that wrote
// nothing have no row: the revision is unchanged across them. ForgetIndexes
// drops rows once the log no longer holds their entries.
//
// Replay goes the other way: SetKeyState writes one recorded version back
// idempotently (history, revision index, and -- since records replay in
// log order and the last record of a key is its final state -- the current
// version and its lease attachment), so replaying a compacted batch on a
// state at any index inside it ends at the state of its last index.

// prefixIndexRev is the key space of the index -> revision rows.
const prefixIndexRev = "mi"

func indexRevKey(index uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte(prefixIndexRev), index)
}

// IsIndexRevisionKey reports whether key, an engine key, is in the key
// space of the index -> revision rows. The rows describe the raft log that
// wrote them: a restore, which starts a new cluster whose log begins at
// index 1 again, drops them (member.Restore).
func IsIndexRevisionKey(key []byte) bool {
	return bytes.HasPrefix(key, []byte(prefixIndexRev))
}

// RecordIndex notes that the request applied at raft index moved the
// revision from revBefore (w.Rev() before the request) to w.Rev(). It
// writes a row for every request, those that wrote nothing included, so
// that a missing row tells log compaction the entry was applied before
// rows were kept (a data directory from an older release).
func (w *WriteBatch) RecordIndex(index uint64, revBefore int64) error {
	if err := w.usable(); err != nil {
		return err
	}
	var v [16]byte
	binary.BigEndian.PutUint64(v[0:8], uint64(revBefore))
	binary.BigEndian.PutUint64(v[8:16], uint64(w.st.rev))
	if err := w.setUnread(indexRevKey(index), v[:]); err != nil {
		return w.fail(fmt.Errorf("record revision of index %d: %w", index, err))
	}
	return nil
}

// ForgetIndexRevisions drops the index -> revision rows below index,
// except the last of them, which RevisionAtIndex(index-1) still needs. It
// takes the write lock and commits at the current applied index, so it
// may run on any goroutine (the log compactor's, once the log's first
// index has passed index).
func (s *Store) ForgetIndexRevisions(below uint64) error {
	w := s.Write(nil)
	// Keep the newest row below the bound.
	keepFrom, err := func() (key []byte, err error) {
		it := w.r.NewIter([]byte(prefixIndexRev), indexRevKey(below))
		defer func() {
			if cerr := it.Close(); err == nil && cerr != nil {
				err = cerr
			}
		}()
		if !it.Last() {
			return nil, nil
		}
		return append([]byte(nil), it.Key()...), nil
	}()
	if err != nil || keepFrom == nil {
		w.Abort()
		return err
	}
	if err := w.b.DeleteRange([]byte(prefixIndexRev), keepFrom); err != nil {
		w.Abort()
		return fmt.Errorf("forget index revisions below %d: %w", below, err)
	}
	return w.Commit(s.e.AppliedIndex())
}

// IndexRevision is what one raft index did to the revision.
type IndexRevision struct {
	Index         uint64
	Before, After int64
}

// IndexRevisions returns, in index order, the rows of the indexes in
// [first, last].
func (s *Store) IndexRevisions(first, last uint64) (rows []IndexRevision, err error) {
	snap := s.e.NewSnapshot()
	defer snap.Close()
	it := snap.NewIter(indexRevKey(first), indexRevKey(last+1))
	defer func() {
		if cerr := it.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("index revisions %d..%d: %w", first, last, cerr)
		}
	}()
	for valid := it.First(); valid; valid = it.Next() {
		r, err := decodeIndexRev(it.Key(), it.Value())
		if err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// RevisionAtIndex returns the store's revision after the request at index
// was applied (index itself need not have written). With no row at or
// below index it returns 1, the revision of an empty store: rows are
// written from the first write on, and forgotten only below the log's
// first entry, which log compaction never asks about.
func (s *Store) RevisionAtIndex(index uint64) (rev int64, err error) {
	snap := s.e.NewSnapshot()
	defer snap.Close()
	it := snap.NewIter([]byte(prefixIndexRev), indexRevKey(index+1))
	defer func() {
		if cerr := it.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("revision at index %d: %w", index, cerr)
		}
	}()
	if !it.Last() {
		return 1, nil
	}
	r, err := decodeIndexRev(it.Key(), it.Value())
	if err != nil {
		return 0, err
	}
	return r.After, nil
}

func decodeIndexRev(k, v []byte) (IndexRevision, error) {
	if len(k) != len(prefixIndexRev)+8 || len(v) != 16 {
		return IndexRevision{}, fmt.Errorf("%w: index revision row of %d+%d bytes", errCorrupt, len(k), len(v))
	}
	return IndexRevision{
		Index:  binary.BigEndian.Uint64(k[len(prefixIndexRev):]),
		Before: int64(binary.BigEndian.Uint64(v[0:8])),
		After:  int64(binary.BigEndian.Uint64(v[8:16])),
	}, nil
}

// KeyChange is one version written to a key: a put (KV set) or a deletion.
type KeyChange struct {
	Main, Sub int64
	Key       []byte
	// KV is the key's state after a put; nil for a deletion.
	KV *mvccpb.KeyValue
}

// ErrChangesCompacted is returned by Changes for a revision range whose
// versions physical revision compaction may have removed.
var ErrChangesCompacted = errors.New("mvcc: revision compaction has reached the range of changes")

// Changes returns, in revision order, every key version written in
// revisions (from, to]: the versions log compaction turns into a batch's
// records. The slices are owned by the caller.
//
// Invariant (log compaction's, kept here): Changes never returns the
// versions of a range that physical compaction may have touched. Compaction
// at revision T removes versions below T only (each key's superseded
// versions and its deletions older than T); the compact revision is
// recorded, in the same engine batch as the job, before any removal. So
// Changes reads the compact revision from the same engine snapshot as the
// versions and, if it is above from+1 (the first revision of the range),
// refuses with ErrChangesCompacted: a deletion or an overwritten version
// of the range may be gone, and a batch built without it would leave a
// replaying member with the key live (a deleted key brought back) or with
// the wrong version and create revision. The run of entries then stays in
// the raft log, redelivered through raft after a crash, until the log's
// truncation below the engine's durable index removes it.
func (s *Store) Changes(from, to int64) (out []KeyChange, err error) {
	if to <= from {
		return nil, nil
	}
	v, snap, err := s.snapshotView()
	if err != nil {
		return nil, fmt.Errorf("changes (%d, %d]: %w", from, to, err)
	}
	defer snap.Close()
	if v.compactRev > from+1 {
		return nil, fmt.Errorf("%w: changes (%d, %d], compact revision %d", ErrChangesCompacted, from, to, v.compactRev)
	}
	it := snap.NewIter(revKey(from+1, 0), revKey(to+1, 0))
	defer func() {
		if cerr := it.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("changes (%d, %d]: %w", from, to, cerr)
		}
	}()
	for valid := it.First(); valid; valid = it.Next() {
		c, err := readVersion(snap, it.Key(), it.Value())
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// SetKeyState writes version c back: its history entry and revision index
// row, and makes it the key's current state (moving the lease attachment).
// Writing a version the store already holds rewrites the same bytes, so it
// is idempotent; replaying a key's versions in order leaves the last one
// current, whatever the state was before. It also raises the revision to
// c.Main if it is below.
func (w *WriteBatch) SetKeyState(c KeyChange) error {
	if err := w.usable(); err != nil {
		return err
	}
	cur, err := w.view().current(c.Key)
	if err != nil {
		return w.fail(err)
	}
	p := prepareKeyState(c, cur)
	return w.SetPreparedKeyState(&p)
}

// PreparedKeyState is a KeyChange made ready for SetPreparedKeyState: its
// encoding, and the lease the key was attached to before it. Preparing is
// the costly part of a replay (a read of the key's current version and an
// encoding) and needs no write batch, so PrepareKeyStates does it for many
// keys at once, in parallel.
//
// A replayed version is written as a copied current record (and to
// history), so that replaying it again rewrites the same bytes; a moved
// record it replaces moves to history first (doc.go, "Where each version
// lives").
type PreparedKeyState struct {
	change    KeyChange
	enc       []byte
	prevLease int64
	// move is the key's moved current record that this version replaces,
	// or nil.
	move *current
}

// prepareKeyState prepares c over cur, the key's current record before it
// (nil: none, or a version prepared before c).
func prepareKeyState(c KeyChange, cur *current) PreparedKeyState {
	kv := c.KV
	if kv == nil {
		kv = &mvccpb.KeyValue{Key: c.Key}
	}
	enc := appendKV(make([]byte, 0, kvSize(kv)), kv)
	p := PreparedKeyState{change: c, enc: enc}
	if cur != nil {
		p.prevLease = cur.kv.Lease
		if cur.moved {
			p.move = cur
		}
	}
	return p
}

// minParallelPrepare is the number of changes below which PrepareKeyStates
// works on the calling goroutine: fewer are not worth the goroutines.
const minParallelPrepare = 512

// PrepareKeyStates prepares changes, in order, on up to workers goroutines.
// Changes to one key are independent of changes to every other key, so the
// keys are split among the workers by hash; each worker walks the changes
// of its keys in order, reading a key's current version from the engine's
// committed state at its first change and taking the previous change's
// lease after that.
//
// Precondition: the result is applied, in order, by SetPreparedKeyState
// on a batch in which nothing else changes these keys' current versions
// between the engine's committed state now and those writes (true of a
// compacted batch's replay: its kept entries write no key).
func (s *Store) PrepareKeyStates(changes []KeyChange, workers int) ([]PreparedKeyState, error) {
	out := make([]PreparedKeyState, len(changes))
	if len(changes) < minParallelPrepare {
		workers = 1
	}
	workers = max(workers, 1)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for worker := range workers {
		wg.Go(func() {
			// lease[key] is the key's lease after the worker's last
			// prepared change of it.
			lease := map[string]int64{}
			for i, c := range changes {
				if workers > 1 && int(keyShard(c.Key)%uint32(workers)) != worker {
					continue
				}
				prev, seen := lease[string(c.Key)]
				var cur *current
				if !seen {
					var err error
					if cur, err = (view{r: s.e}).current(c.Key); err != nil {
						errs[worker] = err
						return
					}
				}
				p := prepareKeyState(c, cur)
				if seen {
					p.prevLease = prev
				}
				out[i] = p
				lease[string(c.Key)] = p.change.lease()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// keyShard is FNV-1a of key: which worker prepares its changes.
func keyShard(key []byte) uint32 {
	h := uint32(2166136261)
	for _, b := range key {
		h = (h ^ uint32(b)) * 16777619
	}
	return h
}

// lease is the lease the key is attached to after the change.
func (c KeyChange) lease() int64 {
	if c.KV == nil {
		return 0
	}
	return c.KV.Lease
}

// SetPreparedKeyState writes a prepared version back, as SetKeyState does.
func (w *WriteBatch) SetPreparedKeyState(p *PreparedKeyState) error {
	if err := w.usable(); err != nil {
		return err
	}
	if p.change.KV != nil {
		w.s.keys.add(p.change.Key) // currentkeys.go, invariant 1
	}
	if err := p.write(w.b); err != nil {
		return w.fail(err)
	}
	w.st.rev = max(w.st.rev, p.change.Main)
	return nil
}

// CommitWithKeyStates writes prepared, in order, after everything else in
// the batch, and commits at appliedIndex as Commit does (releasing the
// write lock, also on error). The states are written on up to workers
// goroutines into write-only batches, split by key as PrepareKeyStates
// splits them, so that each key's states keep their order; states of
// different keys write different engine keys. Nothing reads the batch
// after them, which is why they come last.
func (w *WriteBatch) CommitWithKeyStates(appliedIndex uint64, prepared []PreparedKeyState, workers int) error {
	if err := w.usable(); err != nil {
		w.Abort()
		return err
	}
	if len(prepared) < minParallelPrepare {
		workers = 1
	}
	workers = max(workers, 1)
	for i := range prepared {
		if prepared[i].change.KV != nil {
			w.s.keys.add(prepared[i].change.Key) // currentkeys.go, invariant 1
		}
	}
	tails := make([]engine.WriteOnlyBatch, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for worker := range workers {
		tails[worker] = w.s.e.NewWriteOnlyBatch()
		wg.Go(func() {
			for i := range prepared {
				p := &prepared[i]
				if workers > 1 && int(keyShard(p.change.Key)%uint32(workers)) != worker {
					continue
				}
				if err := p.write(tails[worker]); err != nil {
					errs[worker] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, t := range tails {
			_ = t.Close()
		}
		w.Abort()
		return fmt.Errorf("mvcc: commit at index %d: %w", appliedIndex, err)
	}
	for i := range prepared {
		w.st.rev = max(w.st.rev, prepared[i].change.Main)
	}
	return w.commit(appliedIndex, tails)
}

// keyStateWriter is where a prepared state is written: a WriteBatch's
// engine batch or a write-only batch.
type keyStateWriter interface {
	Set(key, value []byte) error
	Delete(key []byte) error
}

// write writes the version's history entry and revision index row, makes
// it the key's current state, and moves the lease attachment.
func (p *PreparedKeyState) write(b keyStateWriter) error {
	c := p.change
	lease := c.lease()
	var err error
	if p.move != nil {
		err = b.Set(historyKey(c.Key, p.move.kv.ModRevision, p.move.sub), p.move.enc)
	}
	if err == nil && c.KV != nil {
		err = b.Set(currentKey(c.Key), p.enc)
	} else if err == nil {
		err = b.Delete(currentKey(c.Key))
	}
	if err == nil {
		err = b.Set(historyKey(c.Key, c.Main, c.Sub), p.enc)
	}
	if err == nil {
		err = b.Set(revKey(c.Main, c.Sub), revValue(c.KV == nil, c.Key))
	}
	if err == nil && p.prevLease != 0 && p.prevLease != lease {
		err = b.Delete(leaseKey(p.prevLease, c.Key))
	}
	if err == nil && lease != 0 {
		err = b.Set(leaseKey(lease, c.Key), nil)
	}
	if err != nil {
		return fmt.Errorf("set state of %q at %d.%d: %w", c.Key, c.Main, c.Sub, err)
	}
	return nil
}

// RaiseRevision raises the store's revision to rev if it is below: the
// revision after a compacted batch, some of whose writes left no record.
func (w *WriteBatch) RaiseRevision(rev int64) error {
	if err := w.usable(); err != nil {
		return err
	}
	w.st.rev = max(w.st.rev, rev)
	return nil
}

// RaiseCompactRev raises the compact revision to rev, capped at the
// revision this write batch has reached, if it is below, as a revision compaction to rev does:
// reads below it fail with ErrCompacted from the commit on, and physical
// compaction removes the versions it supersedes (a job is recorded, as
// Compact records one). It is for the replay of a compacted batch that
// dropped versions superseded at or below rev (the history horizon rule):
// without it, reads at the revisions of those versions would answer
// without them instead of failing. A rev of 0 or less (nothing dropped)
// changes nothing.
func (w *WriteBatch) RaiseCompactRev(rev int64) error {
	if err := w.usable(); err != nil {
		return err
	}
	rev = min(rev, w.st.rev)
	if rev <= 0 || rev <= w.st.compactRev {
		return nil
	}
	if _, _, err := w.Compact(&pb.CompactionRequest{Revision: rev}); err != nil {
		return fmt.Errorf("raise compact revision from %d to %d: %w", w.st.compactRev, rev, err)
	}
	return nil
}

// DropLeaseRecord deletes lease id's record and its key attachments, but
// no key: the replay of a revocation whose key deletions are records of
// their own in the compacted batch.
func (w *WriteBatch) DropLeaseRecord(id int64) error {
	if err := w.usable(); err != nil {
		return err
	}
	err := w.b.Delete(leaseRecordKey(id))
	if err == nil {
		p := leasePrefix(id)
		err = w.b.DeleteRange(p, prefixEndBytes(p))
	}
	if err != nil {
		return w.fail(fmt.Errorf("drop lease %x: %w", id, err))
	}
	return nil
}

// prefixEndBytes is the smallest key above every key starting with p.
func prefixEndBytes(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// CheckpointLease records the remaining TTL of lease id, if its record
// exists, as the lessor's Checkpoint does: the replay of a checkpoint
// before the lessor exists.
func (w *WriteBatch) CheckpointLease(id, remaining int64) error {
	if err := w.usable(); err != nil {
		return err
	}
	if remaining < 0 {
		return nil // the lessor ignores it too
	}
	k := leaseRecordKey(id)
	v, err := w.r.Get(k)
	if errors.Is(err, engine.ErrNotFound) {
		return nil
	}
	if err != nil {
		return w.fail(fmt.Errorf("checkpoint lease %x: %w", id, err))
	}
	rec, err := decodeLeaseRecord(k, v)
	if err != nil {
		return w.fail(err)
	}
	rec.RemainingTTL = remaining
	return w.PutLease(rec)
}

// LeaseRecordExists reports whether lease id has a record, as the batch
// sees it.
func (w *WriteBatch) LeaseRecordExists(id int64) (bool, error) {
	if err := w.usable(); err != nil {
		return false, err
	}
	_, err := w.r.Get(leaseRecordKey(id))
	if errors.Is(err, engine.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, w.fail(fmt.Errorf("read lease %x: %w", id, err))
	}
	return true, nil
}
