package mvcc

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// TestIsTxnReadOnly: etcd's rule (txn.IsTxnReadonly): read-only means only
// Range operations at the top level; a nested transaction, even one that
// only reads, makes the transaction a write, which goes through raft (so it
// is linearizable and refused under a CORRUPT alarm, as in etcd). strata
// looked inside nested transactions and answered such a one from the local
// store, without a read barrier if its ranges were serializable.
func TestIsTxnReadOnly(t *testing.T) {
	nested := func(ops ...*pb.RequestOp) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Success: ops}}}
	}
	for _, tc := range []struct {
		name string
		txn  *pb.TxnRequest
		want bool
	}{
		{"no ops", &pb.TxnRequest{}, true},
		{"ranges", &pb.TxnRequest{Success: []*pb.RequestOp{rng("a", "")}, Failure: []*pb.RequestOp{rng("b", "c")}}, true},
		{"a put", &pb.TxnRequest{Success: []*pb.RequestOp{rng("a", ""), put("a", "1")}}, false},
		{"a delete in failure", &pb.TxnRequest{Failure: []*pb.RequestOp{del("a", "")}}, false},
		{"a nested txn of ranges", &pb.TxnRequest{Success: []*pb.RequestOp{nested(rng("a", ""))}}, false},
		{"an empty nested txn", &pb.TxnRequest{Failure: []*pb.RequestOp{nested()}}, false},
	} {
		if got := IsTxnReadOnly(tc.txn); got != tc.want {
			t.Errorf("%s: IsTxnReadOnly = %v, want %v", tc.name, got, tc.want)
		}
	}
}
