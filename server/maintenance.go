package server

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/version"
)

// EtcdVersion is the etcd version strata reports in Status: the version of
// the etcd API it implements, so that tools that gate features on the
// server version treat strata as that etcd.
var EtcdVersion = version.Version

// Maintenance implements the parts of etcd's Maintenance service that a
// single member answers today: Status and Alarm listing. The rest answer
// codes.Unimplemented.
type Maintenance struct {
	pb.UnimplementedMaintenanceServer
	b     Backend
	quota int64
}

// NewMaintenance returns the Maintenance service over b. quota is
// --quota-backend-bytes, reported as is (strata enforces no quota).
func NewMaintenance(b Backend, quota int64) *Maintenance {
	return &Maintenance{b: b, quota: quota}
}

// Status reports the member's raft and storage state, as `etcdctl endpoint
// status` shows it.
func (m *Maintenance) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	st := m.b.Status()
	resp := &pb.StatusResponse{
		Version:          EtcdVersion,
		DbSize:           st.DBSize,
		DbSizeInUse:      st.DBSize,
		Leader:           m.b.Leader(),
		RaftIndex:        st.CommitIndex,
		RaftTerm:         m.b.Term(),
		RaftAppliedIndex: st.AppliedIndex,
		IsLearner:        st.IsLearner,
		StorageVersion:   EtcdVersion,
		DbSizeQuota:      m.quota,
	}
	if resp.Leader == 0 {
		resp.Errors = append(resp.Errors, "etcdserver: no leader")
	}
	fillHeader(m.b, &resp.Header, m.b.Store().Rev())
	return resp, nil
}

// Alarm lists alarms. strata raises none yet (no space quota, no
// corruption check), so the list is empty; activating or deactivating an
// alarm is refused as unimplemented by the embedded server.
func (m *Maintenance) Alarm(ctx context.Context, r *pb.AlarmRequest) (*pb.AlarmResponse, error) {
	if r.Action != pb.AlarmRequest_GET {
		return m.UnimplementedMaintenanceServer.Alarm(ctx, r)
	}
	resp := &pb.AlarmResponse{}
	fillHeader(m.b, &resp.Header, m.b.Store().Rev())
	return resp, nil
}

// HashKV hashes the key-value history up to a revision (0: the current
// one), as etcd defines it, so that members can be compared.
func (m *Maintenance) HashKV(ctx context.Context, r *pb.HashKVRequest) (*pb.HashKVResponse, error) {
	hash, hashRev, compactRev, err := m.b.Store().HashKV(r.Revision)
	if err != nil {
		return nil, toGRPCError(err)
	}
	resp := &pb.HashKVResponse{Hash: hash, CompactRevision: compactRev, HashRevision: hashRev}
	fillHeader(m.b, &resp.Header, m.b.Store().Rev())
	return resp, nil
}

// LeaderMover transfers raft leadership.
type LeaderMover interface {
	// MoveLeader makes target the leader; only the leader may ask.
	MoveLeader(ctx context.Context, target uint64) error
}

// MoveLeader hands leadership to another voting member, as etcdctl
// move-leader asks.
func (m *Maintenance) MoveLeader(ctx context.Context, r *pb.MoveLeaderRequest) (*pb.MoveLeaderResponse, error) {
	mover, ok := m.b.(LeaderMover)
	if !ok {
		return m.UnimplementedMaintenanceServer.MoveLeader(ctx, r)
	}
	if err := mover.MoveLeader(ctx, r.TargetID); err != nil {
		return nil, membershipError(err)
	}
	resp := &pb.MoveLeaderResponse{}
	fillHeader(m.b, &resp.Header, m.b.Store().Rev())
	return resp, nil
}
