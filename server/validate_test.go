package server

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

func put(k string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(k)}}}
}

func del(k, end string) *pb.RequestOp {
	r := &pb.DeleteRangeRequest{Key: []byte(k)}
	if end != "" {
		r.RangeEnd = []byte(end)
	}
	return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: r}}
}

func get(k string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte(k)}}}
}

func txn(then, els []*pb.RequestOp) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Success: then, Failure: els}}}
}

// The cases follow etcd's rules for keys written twice in one txn branch.
func TestCheckIntervals(t *testing.T) {
	for _, tc := range []struct {
		name string
		ops  []*pb.RequestOp
		dup  bool
	}{
		{name: "distinct puts", ops: []*pb.RequestOp{put("a"), put("b")}},
		{name: "two puts of one key", ops: []*pb.RequestOp{put("a"), put("a")}, dup: true},
		{name: "put inside a deleted range", ops: []*pb.RequestOp{del("a", "c"), put("b")}, dup: true},
		{name: "put at a deleted range's end", ops: []*pb.RequestOp{del("a", "c"), put("c")}},
		{name: "put of a deleted key", ops: []*pb.RequestOp{put("a"), del("a", "")}, dup: true},
		{name: "two deletes of one key", ops: []*pb.RequestOp{del("a", ""), del("a", "")}},
		{name: "reads never conflict", ops: []*pb.RequestOp{get("a"), put("a"), get("a")}},
		{name: "range end \\x00 deletes nothing", ops: []*pb.RequestOp{del("b", "\x00"), put("c")}},
		{name: "nested then and else may share a key", ops: []*pb.RequestOp{txn([]*pb.RequestOp{put("a")}, []*pb.RequestOp{put("a")})}},
		{name: "nested put clashes with outer put", ops: []*pb.RequestOp{put("a"), txn([]*pb.RequestOp{put("a")}, nil)}, dup: true},
		{name: "nested delete covers outer put", ops: []*pb.RequestOp{put("b"), txn([]*pb.RequestOp{del("a", "z")}, nil)}, dup: true},
		{name: "two nested txns put one key", ops: []*pb.RequestOp{txn([]*pb.RequestOp{put("a")}, nil), txn(nil, []*pb.RequestOp{put("a")})}, dup: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := checkIntervals(tc.ops)
			if tc.dup && err != rpctypes.ErrGRPCDuplicateKey {
				t.Fatalf("got %v, want duplicate key", err)
			}
			if !tc.dup && err != nil {
				t.Fatalf("got %v, want no error", err)
			}
		})
	}
}

func TestCheckTxn(t *testing.T) {
	many := func(n int) []*pb.RequestOp {
		ops := make([]*pb.RequestOp, n)
		for i := range ops {
			ops[i] = get("k")
		}
		return ops
	}
	for _, tc := range []struct {
		name string
		req  *pb.TxnRequest
		want error
	}{
		{name: "at the limit", req: &pb.TxnRequest{Success: many(4)}},
		{name: "over the limit", req: &pb.TxnRequest{Success: many(5)}, want: rpctypes.ErrGRPCTooManyOps},
		{name: "compares count too", req: &pb.TxnRequest{Compare: make([]*pb.Compare, 5)}, want: rpctypes.ErrGRPCTooManyOps},
		{name: "compare without key", req: &pb.TxnRequest{Compare: []*pb.Compare{{}}}, want: rpctypes.ErrGRPCEmptyKey},
		{name: "empty op", req: &pb.TxnRequest{Success: []*pb.RequestOp{{}}}, want: rpctypes.ErrGRPCKeyNotFound},
		{name: "put without key", req: &pb.TxnRequest{Failure: []*pb.RequestOp{put("")}}, want: rpctypes.ErrGRPCEmptyKey},
		{name: "nested over what is left", req: &pb.TxnRequest{Success: []*pb.RequestOp{txn(many(4), nil)}}, want: rpctypes.ErrGRPCTooManyOps},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := checkTxn(tc.req, 4); err != tc.want {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}
