package mvcc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/strata-kv/strata/engine"
)

// WriteBatch is one apply batch: any number of requests, committed as one
// engine batch together with the raft index they apply.
//
// Each request that writes gets the next main revision; its operations get
// sub-revisions 0, 1, ... . Later requests see earlier ones. A request that
// fails (ErrLeaseNotFound, ErrCompacted, ...) writes nothing: a Txn is
// checked whole before its first write, as etcd does.
//
// An engine failure inside a request poisons the batch: every later call
// and Commit return that error, and the caller must not commit.
//
// Concurrency: one goroutine, between Store.Write and Commit or Abort; the
// Store's write lock is held all that time.
type WriteBatch struct {
	s      *Store
	leases Leases        // nil: no lease exists
	b      engine.Batch  // nil in a read-only transaction
	r      engine.Reader // b, or a snapshot for a read-only transaction
	st     state         // revision state as this batch sees it
	start  state
	job    compactJob
	jobCh  bool // job changed
	wait   []compactWaiter
	sub    int64 // operations written by the current request
	err    error // sticky engine error
	done   bool

	// unread holds the batch's writes to the revision index (mr) and the
	// index rows (mi): nil until the first. Keeping them out of b, whose
	// index every read of the batch searches, makes each of them an
	// append instead of an insert into the batch's skiplist (a third to
	// half of a put's writes; docs/bench/performance.md). It commits after
	// b, in one engine batch with it (engine.Batch.CommitWith).
	//
	// Invariant: no read through this batch looks at mr or mi, so nothing
	// misses a write held here. Their readers (Events, HashKV, the
	// compactor, log compaction's Changes and RevisionAtIndex) read
	// snapshots or their own batches after the commit; the one write batch
	// that reads mi (ForgetIndexRevisions) writes nothing here.
	unread engine.WriteOnlyBatch

	// scratchKey and scratchValue hold a put's encoded rows while they
	// are written: every engine's Set copies its arguments (engine.Batch).
	scratchKey, scratchValue []byte
}

// Write starts an apply batch, whose Puts may attach keys to the leases
// leases holds (nil: to none; a Put with a lease then fails with
// ErrLeaseNotFound). Only one may be open at a time: it holds the store's
// write lock until Commit or Abort.
func (s *Store) Write(leases Leases) *WriteBatch {
	s.wmu.Lock()
	st := state{rev: s.rev.Load(), compactRev: s.compactRev.Load()}
	s.mu.Lock()
	job := s.mu.job
	s.mu.Unlock()
	b := s.e.NewBatch()
	return &WriteBatch{s: s, leases: leases, b: b, r: b, st: st, start: st, job: job}
}

// view is what the current request reads: the batch, at the revision it
// is writing if it has written anything (as etcd's txn reads its writes).
func (w *WriteBatch) view() view {
	rev := w.st.rev
	if w.sub > 0 {
		rev++
	}
	v := view{r: w.r, rev: rev, compactRev: w.st.compactRev}
	if w.b != nil {
		// A read-only transaction reads a snapshot (see view.keys).
		v.keys = w.s.keys
	}
	return v
}

// endRequest closes the current request: if it wrote, the revision moves.
func (w *WriteBatch) endRequest() {
	if w.sub > 0 {
		w.st.rev++
	}
	w.sub = 0
}

func (w *WriteBatch) fail(err error) error {
	if w.err == nil {
		w.err = err
	}
	return err
}

func (w *WriteBatch) leaseExists(id int64) bool {
	return id == 0 || (w.leases != nil && w.leases.Exists(id))
}

// put writes key at the current request's revision. The new version goes
// to mc only, as a moved record; the version it replaces moves to mh if
// it was not there yet (doc.go, "Where each version lives").
func (w *WriteBatch) put(key, value []byte, lease int64) error {
	main := w.st.rev + 1
	prev, err := w.view().current(key)
	if err != nil {
		return err
	}
	kv := mvccpb.KeyValue{Key: key, Value: value, CreateRevision: main, ModRevision: main, Version: 1, Lease: lease}
	if prev != nil {
		kv.CreateRevision = prev.kv.CreateRevision
		kv.Version = prev.kv.Version + 1
	}
	if err := w.moveToHistory(prev); err != nil {
		return fmt.Errorf("put %q: %w", key, err)
	}
	w.s.keys.add(key) // before its current record is written (currentkeys.go, invariant 1)
	// The engine batches copy what they are given: the scratch buffers
	// are free again once a write returns.
	w.scratchKey = appendCurrentKey(w.scratchKey[:0], key)
	w.scratchValue = appendMoved(w.scratchValue[:0], w.sub, &kv)
	if err := w.b.Set(w.scratchKey, w.scratchValue); err != nil {
		return fmt.Errorf("put %q: %w", key, err)
	}
	w.scratchKey = appendRevKey(w.scratchKey[:0], main, w.sub)
	w.scratchValue = appendRevValue(w.scratchValue[:0], false, key)
	if err := w.setUnread(w.scratchKey, w.scratchValue); err != nil {
		return fmt.Errorf("put %q: %w", key, err)
	}
	if prev != nil && prev.kv.Lease != 0 && prev.kv.Lease != lease {
		if err := w.b.Delete(leaseKey(prev.kv.Lease, key)); err != nil {
			return fmt.Errorf("put %q: %w", key, err)
		}
	}
	if lease != 0 && (prev == nil || prev.kv.Lease != lease) {
		if err := w.b.Set(leaseKey(lease, key), nil); err != nil {
			return fmt.Errorf("put %q: %w", key, err)
		}
	}
	w.sub++
	return nil
}

// setUnread writes a revision-index or index row (see WriteBatch.unread).
func (w *WriteBatch) setUnread(key, value []byte) error {
	if w.unread == nil {
		w.unread = w.s.e.NewWriteOnlyBatch()
	}
	return w.unread.Set(key, value)
}

// moveToHistory writes a moved current record's version to mh, as it
// stops being current; a copied record's version is there already.
func (w *WriteBatch) moveToHistory(prev *current) error {
	if prev == nil || !prev.moved {
		return nil
	}
	return w.b.Set(historyKey(prev.kv.Key, prev.kv.ModRevision, prev.sub), prev.enc)
}

// del writes a tombstone for prev, the key's current version, which moves
// to history.
func (w *WriteBatch) del(prev *current) error {
	main := w.st.rev + 1
	key := prev.kv.Key
	tomb := &mvccpb.KeyValue{Key: key}
	enc := appendKV(make([]byte, 0, kvSize(tomb)), tomb)
	if err := w.moveToHistory(prev); err != nil {
		return fmt.Errorf("delete %q: %w", key, err)
	}
	if err := w.b.Delete(currentKey(key)); err != nil {
		return fmt.Errorf("delete %q: %w", key, err)
	}
	if err := w.b.Set(historyKey(key, main, w.sub), enc); err != nil {
		return fmt.Errorf("delete %q: %w", key, err)
	}
	if err := w.setUnread(revKey(main, w.sub), revValue(true, key)); err != nil {
		return fmt.Errorf("delete %q: %w", key, err)
	}
	if prev.kv.Lease != 0 {
		if err := w.b.Delete(leaseKey(prev.kv.Lease, key)); err != nil {
			return fmt.Errorf("delete %q: %w", key, err)
		}
	}
	w.sub++
	return nil
}

func (w *WriteBatch) usable() error {
	if w.done {
		return errors.New("mvcc: write batch already committed or aborted")
	}
	return w.err
}

// checkPut is etcd's validation of a Put: the lease exists, and a key that
// ignore_value or ignore_lease refers to exists. It returns the previous
// version when the request needs it.
func (w *WriteBatch) checkPut(v view, r *pb.PutRequest) (*mvccpb.KeyValue, error) {
	if !w.leaseExists(r.Lease) {
		return nil, ErrLeaseNotFound
	}
	if !r.IgnoreValue && !r.IgnoreLease && !r.PrevKv {
		return nil, nil
	}
	prev, err := v.get(r.Key)
	if err != nil {
		return nil, w.fail(err)
	}
	if (r.IgnoreValue || r.IgnoreLease) && prev == nil {
		return nil, ErrKeyNotFound
	}
	return prev, nil
}

// doPut executes a validated Put in the current request.
func (w *WriteBatch) doPut(r *pb.PutRequest, prev *mvccpb.KeyValue) (*pb.PutResponse, error) {
	val, lease := r.Value, r.Lease
	if prev != nil && r.IgnoreValue {
		val = prev.Value
	}
	if prev != nil && r.IgnoreLease {
		lease = prev.Lease
	}
	if err := w.put(r.Key, val, lease); err != nil {
		return nil, w.fail(err)
	}
	resp := &pb.PutResponse{Header: &pb.ResponseHeader{Revision: w.st.rev + 1}}
	if r.PrevKv {
		resp.PrevKv = prev
	}
	return resp, nil
}

// Put applies a PutRequest as its own revision.
func (w *WriteBatch) Put(r *pb.PutRequest) (*pb.PutResponse, error) {
	if err := w.usable(); err != nil {
		return nil, err
	}
	prev, err := w.checkPut(w.view(), r)
	if err != nil {
		return nil, err
	}
	resp, err := w.doPut(r, prev)
	w.endRequest()
	return resp, err
}

// doDeleteRange executes a DeleteRange in the current request.
func (w *WriteBatch) doDeleteRange(r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	curs, err := w.view().currentRange(r.Key, gteRange(r.RangeEnd))
	if err != nil {
		return nil, w.fail(err)
	}
	kvs := make([]*mvccpb.KeyValue, len(curs))
	for i, c := range curs {
		if err := w.del(c); err != nil {
			return nil, w.fail(err)
		}
		kvs[i] = c.kv
	}
	resp := &pb.DeleteRangeResponse{Header: &pb.ResponseHeader{Revision: w.st.rev}, Deleted: int64(len(kvs))}
	if w.sub > 0 {
		resp.Header.Revision = w.st.rev + 1
	}
	if r.PrevKv {
		resp.PrevKvs = kvs
	}
	return resp, nil
}

// DeleteRange applies a DeleteRangeRequest; it takes a revision only if it
// deletes something.
func (w *WriteBatch) DeleteRange(r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	if err := w.usable(); err != nil {
		return nil, err
	}
	resp, err := w.doDeleteRange(r)
	w.endRequest()
	return resp, err
}

// Txn applies a TxnRequest. All compares, of nested transactions too, are
// evaluated first against the state before the transaction; then the
// chosen branches are checked whole (range revisions, leases, keys that
// ignore_value/ignore_lease need); then executed. The transaction takes one
// revision if any operation wrote.
func (w *WriteBatch) Txn(r *pb.TxnRequest) (*pb.TxnResponse, error) {
	if err := w.usable(); err != nil {
		return nil, err
	}
	resp, err := w.txn(r)
	w.endRequest()
	return resp, err
}

func (w *WriteBatch) txn(r *pb.TxnRequest) (*pb.TxnResponse, error) {
	v := w.view()
	var path []bool
	if err := w.compareToPath(v, r, &path); err != nil {
		return nil, w.fail(err)
	}
	pos := 0
	if err := w.checkTxn(v, r, path, &pos); err != nil {
		return nil, err
	}
	pos = 0
	resp, err := w.executeTxn(r, path, &pos)
	if err != nil {
		return nil, w.fail(err)
	}
	resp.Header = &pb.ResponseHeader{Revision: w.view().rev}
	return resp, nil
}

// compareToPath appends, in pre-order, whether each transaction on the
// executed path (this one, then nested ones in its chosen branch) succeeds.
func (w *WriteBatch) compareToPath(v view, r *pb.TxnRequest, path *[]bool) error {
	ok := true
	for _, c := range r.Compare {
		res, err := applyCompare(v, c)
		if err != nil {
			return err
		}
		if !res {
			ok = false
			break
		}
	}
	*path = append(*path, ok)
	for _, op := range branch(r, ok) {
		if t := op.GetRequestTxn(); t != nil {
			if err := w.compareToPath(v, t, path); err != nil {
				return err
			}
		}
	}
	return nil
}

func branch(r *pb.TxnRequest, ok bool) []*pb.RequestOp {
	if ok {
		return r.Success
	}
	return r.Failure
}

func (w *WriteBatch) checkTxn(v view, r *pb.TxnRequest, path []bool, pos *int) error {
	ok := path[*pos]
	*pos++
	for _, op := range branch(r, ok) {
		switch {
		case op.GetRequestRange() != nil:
			if err := v.checkRange(op.GetRequestRange()); err != nil {
				return err
			}
		case op.GetRequestPut() != nil:
			if _, err := w.checkPut(v, op.GetRequestPut()); err != nil {
				return err
			}
		case op.GetRequestTxn() != nil:
			if err := w.checkTxn(v, op.GetRequestTxn(), path, pos); err != nil {
				return err
			}
		}
	}
	return nil
}

func (w *WriteBatch) executeTxn(r *pb.TxnRequest, path []bool, pos *int) (*pb.TxnResponse, error) {
	ok := path[*pos]
	*pos++
	ops := branch(r, ok)
	resp := &pb.TxnResponse{Succeeded: ok, Responses: make([]*pb.ResponseOp, len(ops)), Header: &pb.ResponseHeader{}}
	for i, op := range ops {
		switch {
		case op.GetRequestRange() != nil:
			rr, err := w.view().executeRange(op.GetRequestRange())
			if err != nil {
				return nil, fmt.Errorf("txn range: %w", err)
			}
			resp.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{ResponseRange: rr}}
		case op.GetRequestPut() != nil:
			p := op.GetRequestPut()
			var prev *mvccpb.KeyValue
			if p.IgnoreValue || p.IgnoreLease || p.PrevKv {
				var err error
				if prev, err = w.view().get(p.Key); err != nil {
					return nil, err
				}
			}
			pr, err := w.doPut(p, prev)
			if err != nil {
				return nil, err
			}
			resp.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponsePut{ResponsePut: pr}}
		case op.GetRequestDeleteRange() != nil:
			dr, err := w.doDeleteRange(op.GetRequestDeleteRange())
			if err != nil {
				return nil, err
			}
			resp.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseDeleteRange{ResponseDeleteRange: dr}}
		case op.GetRequestTxn() != nil:
			tr, err := w.executeTxn(op.GetRequestTxn(), path, pos)
			if err != nil {
				return nil, err
			}
			resp.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseTxn{ResponseTxn: tr}}
		default:
			resp.Responses[i] = &pb.ResponseOp{}
		}
	}
	return resp, nil
}

// applyCompare is etcd's compare: every key in the range must satisfy it;
// an empty range compares a zero KeyValue, except that a VALUE compare on
// no key fails.
func applyCompare(v view, c *pb.Compare) (bool, error) {
	kvs, _, err := v.rangeKeys(c.Key, gteRange(c.RangeEnd), 0, 0, false)
	if err != nil {
		return false, err
	}
	if len(kvs) == 0 {
		if c.Target == pb.Compare_VALUE {
			return false, nil
		}
		return compareKV(c, &mvccpb.KeyValue{}), nil
	}
	for _, kv := range kvs {
		if !compareKV(c, kv) {
			return false, nil
		}
	}
	return true, nil
}

func compareKV(c *pb.Compare, kv *mvccpb.KeyValue) bool {
	var res int
	switch c.Target {
	case pb.Compare_VALUE:
		res = compareBytes(kv.Value, c.GetValue())
	case pb.Compare_CREATE:
		res = compareInt(kv.CreateRevision, c.GetCreateRevision())
	case pb.Compare_MOD:
		res = compareInt(kv.ModRevision, c.GetModRevision())
	case pb.Compare_VERSION:
		res = compareInt(kv.Version, c.GetVersion())
	case pb.Compare_LEASE:
		res = compareInt(kv.Lease, c.GetLease())
	}
	switch c.Result {
	case pb.Compare_EQUAL:
		return res == 0
	case pb.Compare_NOT_EQUAL:
		return res != 0
	case pb.Compare_GREATER:
		return res > 0
	case pb.Compare_LESS:
		return res < 0
	}
	return true
}

func compareInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func compareBytes(a, b []byte) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			if a[i] < b[i] {
				return -1
			}
			return 1
		}
	}
	return compareInt(int64(len(a)), int64(len(b)))
}

// ReadTxn answers a transaction without writes (only Range operations in
// both branches) from a consistent snapshot, from any goroutine.
func (s *Store) ReadTxn(r *pb.TxnRequest) (*pb.TxnResponse, error) {
	if !IsTxnReadOnly(r) {
		return nil, errors.New("mvcc: ReadTxn given a transaction that writes")
	}
	v, snap, err := s.snapshotView()
	if err != nil {
		return nil, err
	}
	defer snap.Close()
	w := &WriteBatch{s: s, r: snap, st: state{rev: v.rev, compactRev: v.compactRev}}
	return w.txn(r)
}

// IsTxnReadOnly reports whether neither branch of r has anything but
// Range operations. A nested transaction counts as a write even if it only
// reads, as in etcd (txn.IsTxnReadonly): such a transaction goes through
// raft there, and so it does here.
func IsTxnReadOnly(r *pb.TxnRequest) bool {
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			if op.GetRequestRange() == nil {
				return false
			}
		}
	}
	return true
}

// Compact records the new compact revision in the batch: from the next
// request on, reads below it fail with ErrCompacted. Physical removal of the
// superseded versions runs after Commit, in the background, in chunks, and
// resumes after a restart; the returned channel closes when it is done.
// Like etcd, a compaction takes no revision.
func (w *WriteBatch) Compact(r *pb.CompactionRequest) (*pb.CompactionResponse, <-chan struct{}, error) {
	if err := w.usable(); err != nil {
		return nil, nil, err
	}
	if r.Revision <= w.st.compactRev {
		return nil, nil, ErrCompacted
	}
	if r.Revision > w.st.rev {
		return nil, nil, ErrFutureRev
	}
	w.st.compactRev = r.Revision
	if w.job.target > 0 && !w.job.pending() {
		// The last job finished; start just before its target so that
		// deletions it kept at its target revision are dropped now.
		w.job.doneMain, w.job.doneSub = w.job.target-1, math.MaxInt64
	}
	w.job.target = r.Revision
	w.jobCh = true
	ch := make(chan struct{})
	w.wait = append(w.wait, compactWaiter{rev: r.Revision, done: ch})
	return &pb.CompactionResponse{Header: &pb.ResponseHeader{Revision: w.st.rev}}, ch, nil
}

// SetMeta stores small replicated state (raft ConfState, membership) under
// name in the same batch.
func (w *WriteBatch) SetMeta(name string, value []byte) error {
	if err := w.usable(); err != nil {
		return err
	}
	if err := w.b.Set([]byte(prefixUser+name), value); err != nil {
		return w.fail(fmt.Errorf("set meta %q: %w", name, err))
	}
	return nil
}

// LeaseKeys returns the keys attached to lease id as this batch sees them.
func (w *WriteBatch) LeaseKeys(id int64) ([][]byte, error) {
	if err := w.usable(); err != nil {
		return nil, err
	}
	return leaseKeys(w.r, id)
}

// Batch exposes the engine batch, for packages (lease, auth) that keep
// their own state in their own key spaces and must commit with the
// requests. They must not write in the mvcc key spaces ("m" prefix).
func (w *WriteBatch) Batch() engine.Batch { return w.b }

// Rev returns the revision as this batch sees it (the store's revision plus
// the revisions its requests took so far).
func (w *WriteBatch) Rev() int64 { return w.st.rev }

// Commit writes the batch with the raft index it applies, as one engine
// batch; then readers see the new revision. It releases the write lock,
// also on error.
func (w *WriteBatch) Commit(appliedIndex uint64) error {
	return w.commit(appliedIndex, nil)
}

// commit commits the batch followed by tails (engine.Batch.CommitWith).
func (w *WriteBatch) commit(appliedIndex uint64, tails []engine.WriteOnlyBatch) error {
	if w.unread != nil {
		tails = append([]engine.WriteOnlyBatch{w.unread}, tails...)
		w.unread = nil // released with the other tails from here on
	}
	handedOver := false // CommitWith releases the tails
	defer func() {
		if !handedOver {
			for _, t := range tails {
				_ = t.Close()
			}
		}
	}()
	if w.done {
		return errors.New("mvcc: commit: write batch already committed or aborted")
	}
	s := w.s
	defer w.release()
	if w.err != nil {
		return fmt.Errorf("mvcc: commit at index %d: batch failed earlier: %w", appliedIndex, w.err)
	}
	if w.st != w.start {
		if err := w.b.Set(metaState, w.st.encode()); err != nil {
			return fmt.Errorf("mvcc: commit at index %d: %w", appliedIndex, err)
		}
	}
	if w.jobCh {
		if err := w.b.Set(metaCompact, w.job.encode()); err != nil {
			return fmt.Errorf("mvcc: commit at index %d: %w", appliedIndex, err)
		}
	}
	recordLayout := !s.layoutRecorded.Load()
	if recordLayout {
		if err := w.b.Set(metaLayout, binary.BigEndian.AppendUint64(nil, layoutCurrent)); err != nil {
			return fmt.Errorf("mvcc: commit at index %d: %w", appliedIndex, err)
		}
	}
	handedOver = true
	s.changes.Add(1) // odd: the engine may move ahead of rev (Store.changes)
	if err := w.b.CommitWith(appliedIndex, tails); err != nil {
		// Whether any of the batch is in is unknown: changes stays odd,
		// and readers take the state from their snapshots from now on.
		return fmt.Errorf("mvcc: commit at index %d: %w", appliedIndex, err)
	}
	s.rev.Store(w.st.rev)
	s.compactRev.Store(w.st.compactRev)
	s.changes.Add(1)
	if recordLayout {
		s.layoutRecorded.Store(true)
	}
	if w.jobCh {
		s.mu.Lock()
		s.mu.job = w.job
		s.mu.waiters = append(s.mu.waiters, w.wait...)
		s.mu.Unlock()
		s.wakeCompactor()
	}
	return nil
}

// Abort discards the batch and releases the write lock.
func (w *WriteBatch) Abort() {
	if w.done {
		return
	}
	_ = w.b.Close()
	w.release()
}

func (w *WriteBatch) release() {
	if w.done {
		return
	}
	w.done = true
	_ = w.b.Close()
	if w.unread != nil {
		_ = w.unread.Close()
		w.unread = nil
	}
	w.s.wmu.Unlock()
}

// after returns the revision-index key just after (main, sub).
func after(main, sub int64) []byte {
	if sub == math.MaxInt64 {
		return revKey(main+1, 0)
	}
	return revKey(main, sub+1)
}
