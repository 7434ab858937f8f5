package propose

import (
	"context"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.uber.org/zap"
)

// Quota is the space quota (--quota-backend-bytes), checked before a
// request is proposed, as etcd checks it: a request that would grow the
// store beyond it is refused with etcd's "database space exceeded", and
// the proposer raises the NOSPACE alarm for this member, which then refuses
// writes on every member until it is disarmed.
type Quota struct {
	// Bytes is the quota; 0 or less means none (strata's LSM has no
	// file-size ceiling to protect).
	Bytes int64
	// DiskSize is the engine's size on disk (files, not the memtable).
	DiskSize func() int64
	// Alarms lists the raised alarms (the applier's, apply.Alarms).
	Alarms interface{ List() []*pb.AlarmMember }
	Logger *zap.Logger
}

// quotaRefresh bounds how often the engine's size is read: reading
// Pebble's metrics on every put would cost more than the put.
const quotaRefresh = 100 * time.Millisecond

// quotaState caches the engine's size for the quota check.
type quotaState struct {
	size atomic.Int64
	at   atomic.Int64 // unix nanoseconds of the last refresh
}

// admit refuses a request that would grow the store beyond the quota, and
// raises the NOSPACE alarm if it is not raised yet.
func (p *Proposer) admit(ctx context.Context, r *pb.InternalRaftRequest) error {
	q := p.cfg.Quota
	if q == nil || q.Bytes <= 0 {
		return nil
	}
	cost := requestCost(r)
	if cost == 0 {
		return nil
	}
	now := time.Now().UnixNano()
	if now-p.quota.at.Load() > int64(quotaRefresh) {
		p.quota.size.Store(q.DiskSize())
		p.quota.at.Store(now)
	}
	if p.quota.size.Load()+cost <= q.Bytes {
		return nil
	}
	raised := false
	for _, am := range q.Alarms.List() {
		if am.MemberID == p.cfg.MemberID && am.Alarm == pb.AlarmType_NOSPACE {
			raised = true
		}
	}
	if !raised {
		q.Logger.Warn("space quota exceeded, raising NOSPACE",
			zap.Int64("quota", q.Bytes), zap.Int64("disk-size", p.quota.size.Load()))
		// An alarm request costs nothing, so it passes this check.
		if err := p.Submit(ctx, &pb.InternalRaftRequest{Alarm: &pb.AlarmRequest{
			Action: pb.AlarmRequest_ACTIVATE, MemberID: p.cfg.MemberID, Alarm: pb.AlarmType_NOSPACE,
		}}); err != nil {
			q.Logger.Warn("raise NOSPACE alarm", zap.Error(err))
		}
	}
	return rpctypes.ErrGRPCNoSpace
}

// requestCost estimates the bytes a request adds to the store (etcd's
// backendQuota.Cost): zero for requests that do not grow it.
func requestCost(r *pb.InternalRaftRequest) int64 {
	const overhead = 64 // revision index, history and current entries
	switch {
	case r.Put != nil:
		return int64(len(r.Put.Key)+len(r.Put.Value))*2 + overhead
	case r.Txn != nil:
		var cost int64
		var walk func(t *pb.TxnRequest)
		walk = func(t *pb.TxnRequest) {
			for _, ops := range [][]*pb.RequestOp{t.Success, t.Failure} {
				for _, op := range ops {
					if p := op.GetRequestPut(); p != nil {
						cost += int64(len(p.Key)+len(p.Value))*2 + overhead
					}
					if nt := op.GetRequestTxn(); nt != nil {
						walk(nt)
					}
				}
			}
		}
		walk(r.Txn)
		return cost
	case r.LeaseGrant != nil:
		return overhead
	}
	return 0
}
