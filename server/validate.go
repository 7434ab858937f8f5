package server

import (
	"bytes"
	"errors"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-kv/strata/auth"
	"github.com/strata-kv/strata/mvcc"
)

// The checks below reproduce etcd's request validation, error for error, so
// that a client sees the same refusal from strata as from etcd.

func checkRange(r *pb.RangeRequest) error {
	if len(r.Key) == 0 {
		return rpctypes.ErrGRPCEmptyKey
	}
	if _, ok := pb.RangeRequest_SortOrder_name[int32(r.SortOrder)]; !ok {
		return rpctypes.ErrGRPCInvalidSortOption
	}
	if _, ok := pb.RangeRequest_SortTarget_name[int32(r.SortTarget)]; !ok {
		return rpctypes.ErrGRPCInvalidSortOption
	}
	return nil
}

func checkPut(r *pb.PutRequest) error {
	if len(r.Key) == 0 {
		return rpctypes.ErrGRPCEmptyKey
	}
	if r.IgnoreValue && len(r.Value) != 0 {
		return rpctypes.ErrGRPCValueProvided
	}
	if r.IgnoreLease && r.Lease != 0 {
		return rpctypes.ErrGRPCLeaseProvided
	}
	return nil
}

// checkTxn checks sizes and operations. maxTxnOps bounds each branch and the
// compares; a nested txn is bounded by what its parent leaves, as in etcd.
func checkTxn(r *pb.TxnRequest, maxTxnOps int) error {
	ops := max(len(r.Compare), len(r.Success), len(r.Failure))
	if ops > maxTxnOps {
		return rpctypes.ErrGRPCTooManyOps
	}
	for _, c := range r.Compare {
		if len(c.Key) == 0 {
			return rpctypes.ErrGRPCEmptyKey
		}
	}
	for _, branch := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range branch {
			if err := checkRequestOp(op, maxTxnOps-ops); err != nil {
				return err
			}
		}
	}
	return nil
}

func checkRequestOp(op *pb.RequestOp, maxTxnOps int) error {
	switch v := op.GetRequest().(type) {
	case *pb.RequestOp_RequestRange:
		return checkRange(v.RequestRange)
	case *pb.RequestOp_RequestPut:
		return checkPut(v.RequestPut)
	case *pb.RequestOp_RequestDeleteRange:
		if len(v.RequestDeleteRange.GetKey()) == 0 {
			return rpctypes.ErrGRPCEmptyKey
		}
		return nil
	case *pb.RequestOp_RequestTxn:
		return checkTxn(v.RequestTxn, maxTxnOps)
	default:
		// An empty operation: etcd answers "key not found".
		return rpctypes.ErrGRPCKeyNotFound
	}
}

// The refusals of keys and names the member's engine cannot hold
// (engine.Engine.MaxKeySize: bbolt's 32 KiB, appendlog's and hybridlog's
// 64 KiB, less strata's own key layout). etcd has no such limit, so these
// are strata's messages, in etcd's style and with its code for a bad
// argument.
var (
	errGRPCKeyTooLarge      = status.Error(codes.InvalidArgument, "etcdserver: key is too large")
	errGRPCUserNameTooLarge = status.Error(codes.InvalidArgument, "etcdserver: user name is too large")
	errGRPCRoleNameTooLarge = status.Error(codes.InvalidArgument, "etcdserver: role name is too large")
)

// checkKeySizes refuses a write whose keys or names st's engine could not
// hold, before it is proposed: a committed entry the engine refuses could
// not be applied. It covers every request that writes a key named by the
// client: Put, a txn's puts at any depth (a lease attached to a key writes
// no longer key than the put), and the user and role a request creates
// (other auth requests name users and roles that exist, so they fit).
func checkKeySizes(st *mvcc.Store, req *pb.InternalRaftRequest) error {
	limit := st.MaxKeySize()
	if limit <= 0 {
		return nil
	}
	switch {
	case req.Put != nil:
		return checkKeySize(st, req.Put.Key)
	case req.Txn != nil:
		return checkTxnKeySizes(st, req.Txn)
	case req.AuthUserAdd != nil:
		if len(req.AuthUserAdd.Name) > auth.MaxNameSize(limit) {
			return errGRPCUserNameTooLarge
		}
	case req.AuthRoleAdd != nil:
		if len(req.AuthRoleAdd.Name) > auth.MaxNameSize(limit) {
			return errGRPCRoleNameTooLarge
		}
	}
	return nil
}

func checkTxnKeySizes(st *mvcc.Store, r *pb.TxnRequest) error {
	for _, branch := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range branch {
			var err error
			switch v := op.GetRequest().(type) {
			case *pb.RequestOp_RequestPut:
				err = checkKeySize(st, v.RequestPut.GetKey())
			case *pb.RequestOp_RequestTxn:
				err = checkTxnKeySizes(st, v.RequestTxn)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func checkKeySize(st *mvcc.Store, key []byte) error {
	if err := st.CheckKey(key); errors.Is(err, mvcc.ErrKeyTooLarge) {
		return errGRPCKeyTooLarge
	} else if err != nil {
		return err
	}
	return nil
}

// interval is a half-open key range [begin, end); an empty end means no
// upper bound, a nil end a single key. This is etcd's "affine" interval, in
// which a range end of "\x00" (below every key) makes an empty interval.
type interval struct{ begin, end []byte }

func (iv interval) contains(key []byte) bool {
	if iv.end == nil {
		return bytes.Equal(iv.begin, key)
	}
	if bytes.Compare(key, iv.begin) < 0 {
		return false
	}
	return len(iv.end) == 0 || bytes.Compare(key, iv.end) < 0
}

type intervals []interval

func (s intervals) contains(key []byte) bool {
	for _, iv := range s {
		if iv.contains(key) {
			return true
		}
	}
	return false
}

// checkIntervals refuses a txn branch that writes a key twice: two puts of
// one key, or a put of a key that a delete in the same branch covers. Puts
// in the two branches of a nested txn may overlap, since only one runs. It
// returns the branch's puts and deletes for the caller's own check.
func checkIntervals(reqs []*pb.RequestOp) (map[string]struct{}, intervals, error) {
	var dels intervals
	for _, req := range reqs {
		d, ok := req.GetRequest().(*pb.RequestOp_RequestDeleteRange)
		if !ok || d.RequestDeleteRange == nil {
			continue
		}
		iv := interval{begin: d.RequestDeleteRange.Key}
		if len(d.RequestDeleteRange.RangeEnd) != 0 {
			iv.end = d.RequestDeleteRange.RangeEnd
		}
		dels = append(dels, iv)
	}
	puts := map[string]struct{}{}
	for _, req := range reqs {
		t, ok := req.GetRequest().(*pb.RequestOp_RequestTxn)
		if !ok {
			continue
		}
		putsThen, delsThen, err := checkIntervals(t.RequestTxn.Success)
		if err != nil {
			return nil, dels, err
		}
		putsElse, delsElse, err := checkIntervals(t.RequestTxn.Failure)
		if err != nil {
			return nil, dels, err
		}
		for k := range putsThen {
			if _, dup := puts[k]; dup || dels.contains([]byte(k)) {
				return nil, dels, rpctypes.ErrGRPCDuplicateKey
			}
			puts[k] = struct{}{}
		}
		for k := range putsElse {
			if _, dup := puts[k]; dup {
				if _, fromThen := putsThen[k]; !fromThen {
					return nil, dels, rpctypes.ErrGRPCDuplicateKey
				}
			}
			if dels.contains([]byte(k)) {
				return nil, dels, rpctypes.ErrGRPCDuplicateKey
			}
			puts[k] = struct{}{}
		}
		dels = append(dels, delsThen...)
		dels = append(dels, delsElse...)
	}
	for _, req := range reqs {
		p, ok := req.GetRequest().(*pb.RequestOp_RequestPut)
		if !ok || p.RequestPut == nil {
			continue
		}
		k := string(p.RequestPut.Key)
		if _, dup := puts[k]; dup || dels.contains(p.RequestPut.Key) {
			return nil, dels, rpctypes.ErrGRPCDuplicateKey
		}
		puts[k] = struct{}{}
	}
	return puts, dels, nil
}
