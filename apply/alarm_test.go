package apply

import (
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/strata-kv/strata/node"
)

func alarmReq(id uint64, action pb.AlarmRequest_AlarmAction, member uint64, typ pb.AlarmType) *pb.InternalRaftRequest {
	return &pb.InternalRaftRequest{Header: &pb.RequestHeader{ID: id},
		Alarm: &pb.AlarmRequest{Action: action, MemberID: member, Alarm: typ}}
}

// Alarms are applied in log order, answer what they changed, refuse the
// writes etcd refuses while raised, and survive a restart.
func TestAlarms(t *testing.T) {
	fs := vfs.NewMem()
	eng, store := openStore(t, fs)
	a, err := New(Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	act, deact := pb.AlarmRequest_ACTIVATE, pb.AlarmRequest_DEACTIVATE
	txnPut := &pb.InternalRaftRequest{Header: &pb.RequestHeader{ID: 99}, Txn: &pb.TxnRequest{
		Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{
			Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("t")}}}}}}}}}}
	del := &pb.InternalRaftRequest{Header: &pb.RequestHeader{ID: 98}, DeleteRange: &pb.DeleteRangeRequest{Key: []byte("a")}}
	index := uint64(0)
	for _, tc := range []struct {
		name string
		req  *pb.InternalRaftRequest
		// changed is how many alarms the answer lists; err the refusal.
		changed int
		err     error
		alarms  []*pb.AlarmMember
	}{
		{name: "put without alarms", req: put(1, "a", "1")},
		{name: "raise NOSPACE", req: alarmReq(2, act, 7, pb.AlarmType_NOSPACE), changed: 1,
			alarms: []*pb.AlarmMember{{MemberID: 7, Alarm: pb.AlarmType_NOSPACE}}},
		{name: "raise it again", req: alarmReq(3, act, 7, pb.AlarmType_NOSPACE), changed: 1,
			alarms: []*pb.AlarmMember{{MemberID: 7, Alarm: pb.AlarmType_NOSPACE}}},
		{name: "put refused", req: put(4, "b", "2"), err: rpctypes.ErrGRPCNoSpace,
			alarms: []*pb.AlarmMember{{MemberID: 7, Alarm: pb.AlarmType_NOSPACE}}},
		{name: "nested txn put refused", req: txnPut, err: rpctypes.ErrGRPCNoSpace,
			alarms: []*pb.AlarmMember{{MemberID: 7, Alarm: pb.AlarmType_NOSPACE}}},
		{name: "delete allowed", req: del,
			alarms: []*pb.AlarmMember{{MemberID: 7, Alarm: pb.AlarmType_NOSPACE}}},
		{name: "raise CORRUPT for another member", req: alarmReq(5, act, 3, pb.AlarmType_CORRUPT), changed: 1,
			alarms: []*pb.AlarmMember{{MemberID: 3, Alarm: pb.AlarmType_CORRUPT}, {MemberID: 7, Alarm: pb.AlarmType_NOSPACE}}},
		{name: "clear one not raised", req: alarmReq(6, deact, 7, pb.AlarmType_CORRUPT),
			alarms: []*pb.AlarmMember{{MemberID: 3, Alarm: pb.AlarmType_CORRUPT}, {MemberID: 7, Alarm: pb.AlarmType_NOSPACE}}},
		{name: "clear NOSPACE", req: alarmReq(7, deact, 7, pb.AlarmType_NOSPACE), changed: 1,
			alarms: []*pb.AlarmMember{{MemberID: 3, Alarm: pb.AlarmType_CORRUPT}}},
		{name: "delete refused under CORRUPT", req: del, err: rpctypes.ErrGRPCCorrupt,
			alarms: []*pb.AlarmMember{{MemberID: 3, Alarm: pb.AlarmType_CORRUPT}}},
	} {
		index++
		w := a.cfg.Waiters.Register(requestID(tc.req))
		if err := a.applyBatches([]node.Committed{{Entries: []*raftpb.Entry{normal(t, index, tc.req)}}}); err != nil {
			t.Fatalf("%s: apply: %v", tc.name, err)
		}
		res := <-w
		if !errors.Is(res.Err, tc.err) {
			t.Errorf("%s: err %v, want %v", tc.name, res.Err, tc.err)
		}
		if resp, ok := res.Response.(*pb.AlarmResponse); ok && len(resp.Alarms) != tc.changed {
			t.Errorf("%s: answer lists %v, want %d alarms", tc.name, resp.Alarms, tc.changed)
		}
		if got := a.Alarms(); !sameAlarms(got, tc.alarms) {
			t.Errorf("%s: alarms %v, want %v", tc.name, got, tc.alarms)
		}
	}
	want := a.Alarms()
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	_, store = openStore(t, fs)
	b, err := New(Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Alarms(); !sameAlarms(got, want) {
		t.Errorf("after reopen: alarms %v, want %v", got, want)
	}
}

func sameAlarms(a, b []*pb.AlarmMember) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].MemberID != b[i].MemberID || a[i].Alarm != b[i].Alarm {
			return false
		}
	}
	return true
}
