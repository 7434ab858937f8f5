package apply

import (
	"fmt"
	"slices"
	"sort"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/mvcc"
)

// Alarms are replicated cluster state, as in etcd: a member that finds the
// space quota exceeded, or a corruption check that finds two members'
// hashes differ, proposes an AlarmRequest; every member applies it in log
// order and keeps the list under metaAlarms, in the same engine batch, so
// the list survives restarts and travels in raft snapshots. While an alarm
// is raised the applier refuses the writes etcd refuses (applierV3Capped
// and applierV3Corrupt), identically on every member.

// metaAlarms holds the raised alarms as a marshalled AlarmResponse.
const metaAlarms = "cluster/alarms"

// Alarms is the list of raised alarms as the applier last published it. It
// is its own type, shared by the applier (which writes it) and the
// proposer's quota check (which reads it), because the proposer exists
// before the applier. Safe for concurrent use.
type Alarms struct {
	list atomic.Pointer[[]*pb.AlarmMember]
}

// List returns the raised alarms, ordered by member ID then alarm type.
// The slice is shared: do not modify it.
func (l *Alarms) List() []*pb.AlarmMember {
	if p := l.list.Load(); p != nil {
		return *p
	}
	return nil
}

// Alarms returns the raised alarms, ordered by member ID then alarm type.
// The slice is shared: do not modify it.
func (a *Applier) Alarms() []*pb.AlarmMember { return a.alarms.List() }

// applyAlarm activates or deactivates an alarm (GET never reaches the
// log). The answer lists the alarms changed, as etcd's does: the raised
// alarm for ACTIVATE, the cleared one for DEACTIVATE, nothing when the
// request changed nothing.
//
// The new list is published before the batch commits; a failing commit
// stops the applier (and the member) anyway.
func (a *Applier) applyAlarm(w *mvcc.WriteBatch, r *pb.AlarmRequest) (Result, error) {
	cur := a.Alarms()
	resp := &pb.AlarmResponse{}
	next := make([]*pb.AlarmMember, 0, len(cur)+1)
	found := false
	for _, am := range cur {
		same := am.MemberID == r.MemberID && am.Alarm == r.Alarm
		found = found || same
		if same && r.Action == pb.AlarmRequest_DEACTIVATE {
			resp.Alarms = append(resp.Alarms, am)
			continue
		}
		next = append(next, am)
	}
	switch r.Action {
	case pb.AlarmRequest_ACTIVATE:
		if r.Alarm == pb.AlarmType_NONE {
			return Result{Response: resp}, nil
		}
		am := &pb.AlarmMember{MemberID: r.MemberID, Alarm: r.Alarm}
		resp.Alarms = append(resp.Alarms, am)
		if found {
			return Result{Response: resp}, nil
		}
		next = append(next, am)
	case pb.AlarmRequest_DEACTIVATE:
		if !found {
			return Result{Response: resp}, nil
		}
	default:
		return Result{Response: resp}, nil
	}
	if err := writeAlarms(w, next); err != nil {
		return Result{}, err
	}
	a.alarms.list.Store(&next)
	return Result{Response: resp}, nil
}

// writeAlarms sorts list (by member ID, then alarm type) and stores it as
// the raised alarms.
func writeAlarms(w *mvcc.WriteBatch, list []*pb.AlarmMember) error {
	sort.Slice(list, func(i, j int) bool {
		if list[i].MemberID != list[j].MemberID {
			return list[i].MemberID < list[j].MemberID
		}
		return list[i].Alarm < list[j].Alarm
	})
	raw, err := proto.Marshal(&pb.AlarmResponse{Alarms: list})
	if err != nil {
		return fmt.Errorf("encode alarms: %w", err)
	}
	return w.SetMeta(metaAlarms, raw)
}

// WriteAlarms records alarms as raised in w, as an applier that applied
// their activations would have: for a store built from another one's state
// (an etcd data directory's database), whose log is then replayed and must
// be refused what the alarms refused there. An applier created over the
// store afterwards (New) loads them.
func WriteAlarms(w *mvcc.WriteBatch, alarms []*pb.AlarmMember) error {
	return writeAlarms(w, slices.Clone(alarms))
}

// refusedByAlarm returns the error etcd answers r with while the current
// alarms are raised, or nil if r may be applied. CORRUPT refuses every
// key-value and lease request; NOSPACE refuses what would grow the store
// (puts, transactions with a put, lease grants) and lets deletions and
// compactions through so that an operator can free space.
func (a *Applier) refusedByAlarm(r *pb.InternalRaftRequest) error {
	var noSpace, corrupt bool
	for _, am := range a.Alarms() {
		switch am.Alarm {
		case pb.AlarmType_NOSPACE:
			noSpace = true
		case pb.AlarmType_CORRUPT:
			corrupt = true
		}
	}
	if corrupt && (r.Put != nil || r.DeleteRange != nil || r.Txn != nil || r.Compaction != nil ||
		r.LeaseGrant != nil || r.LeaseRevoke != nil) {
		return rpctypes.ErrGRPCCorrupt
	}
	if noSpace && (r.Put != nil || r.LeaseGrant != nil || (r.Txn != nil && TxnHasPut(r.Txn))) {
		return rpctypes.ErrGRPCNoSpace
	}
	return nil
}

// TxnHasPut reports whether a transaction, nested ones included, holds a
// put in either branch: the transactions a space quota refuses.
func TxnHasPut(t *pb.TxnRequest) bool {
	for _, ops := range [][]*pb.RequestOp{t.Success, t.Failure} {
		for _, op := range ops {
			if op.GetRequestPut() != nil {
				return true
			}
			if nt := op.GetRequestTxn(); nt != nil && TxnHasPut(nt) {
				return true
			}
		}
	}
	return false
}
