package apply

import (
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/strata-kv/strata/auth"
	"github.com/strata-kv/strata/mvcc"
)

// authApplier applies replicated auth requests (the InternalRaftRequest
// Auth* fields and Authenticate) into the entry's write batch, and checks a
// user's write against the auth state as it is when the write is applied
// (etcd's auth applier): a permission revoked after the proposal is
// honoured, identically on every member.
type authApplier struct{ s *auth.Store }

// apply returns handled=false to let the applier apply r itself. A refusal
// is a Result with an error; a returned error is fatal.
func (x *authApplier) apply(w *mvcc.WriteBatch, r *pb.InternalRaftRequest) (res Result, handled bool, err error) {
	if h := r.Header; h != nil && h.Username != "" && x.s.Enabled() {
		// Auth management is decided again at apply time, as etcd's auth
		// applier does: the caller may have lost the root role since.
		if err := x.checkManagement(&auth.Info{Username: h.Username, Revision: h.AuthRevision}, r); err != nil {
			return Result{Err: err}, true, nil
		}
	}
	resp, handled, refused, err := x.s.Apply(w.Batch(), r)
	if err != nil {
		return Result{}, true, err
	}
	if handled {
		return Result{Response: resp, Err: refused}, true, nil
	}
	h := r.Header
	if h == nil || h.Username == "" || !x.s.Enabled() {
		// Auth is off, or the request is the member's own (lease expiry,
		// auto-compaction, attributes), which etcd makes as root.
		return Result{}, false, nil
	}
	refused, err = x.check(w, &auth.Info{Username: h.Username, Revision: h.AuthRevision}, r)
	if err != nil || refused != nil {
		return Result{Err: refused}, true, err
	}
	return Result{}, false, nil
}

// checkManagement permits an auth management request to the root role
// only, a user's change of her own password included, as etcd 3.7's
// needAdminPermission.
func (x *authApplier) checkManagement(info *auth.Info, r *pb.InternalRaftRequest) error {
	switch {
	case r.AuthEnable != nil, r.AuthDisable != nil, r.AuthUserAdd != nil, r.AuthUserDelete != nil,
		r.AuthUserChangePassword != nil, r.AuthUserGrantRole != nil, r.AuthUserRevokeRole != nil,
		r.AuthRoleAdd != nil, r.AuthRoleDelete != nil, r.AuthRoleGrantPermission != nil,
		r.AuthRoleRevokePermission != nil:
		return x.s.IsAdminPermitted(info)
	}
	return nil
}

// check decides a user's write as etcd's auth applier does: refused is
// etcd's answer, err a failure to read the batch (fatal).
func (x *authApplier) check(w *mvcc.WriteBatch, info *auth.Info, r *pb.InternalRaftRequest) (refused, err error) {
	switch {
	case r.Put != nil:
		if err := x.s.IsOpPermitted(info, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: r.Put}}); err != nil {
			return err, nil
		}
		return x.leaseKeys(w, info, r.Put.Lease)
	case r.DeleteRange != nil:
		return x.s.IsOpPermitted(info, &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: r.DeleteRange}}), nil
	case r.Txn != nil:
		if err := x.s.IsTxnPermitted(info, r.Txn); err != nil {
			return err, nil
		}
		return x.txnLeaseKeys(w, info, r.Txn)
	case r.Compaction != nil:
		return x.s.IsAdminPermitted(info), nil
	case r.LeaseRevoke != nil:
		return x.leaseKeys(w, info, r.LeaseRevoke.ID)
	}
	return nil, nil
}

// txnLeaseKeys checks leaseKeys for every put of a txn, nested txns
// included, as etcd's checkTxnReqsPermission checks each put as a Put.
func (x *authApplier) txnLeaseKeys(w *mvcc.WriteBatch, info *auth.Info, txn *pb.TxnRequest) (refused, err error) {
	for _, ops := range [][]*pb.RequestOp{txn.Success, txn.Failure} {
		for _, op := range ops {
			switch {
			case op.GetRequestPut() != nil:
				refused, err = x.leaseKeys(w, info, op.GetRequestPut().Lease)
			case op.GetRequestTxn() != nil:
				refused, err = x.txnLeaseKeys(w, info, op.GetRequestTxn())
			}
			if refused != nil || err != nil {
				return refused, err
			}
		}
	}
	return nil, nil
}

// leaseKeys checks write access to every key attached to a lease: putting
// with a lease, or revoking it, may delete them all.
func (x *authApplier) leaseKeys(w *mvcc.WriteBatch, info *auth.Info, id int64) (refused, err error) {
	if id == 0 {
		return nil, nil
	}
	keys, err := w.LeaseKeys(id)
	if err != nil {
		return nil, fmt.Errorf("keys of lease %x: %w", id, err)
	}
	for _, k := range keys {
		if err := x.s.IsPutPermitted(info, k); err != nil {
			return err, nil
		}
	}
	return nil, nil
}
