package server

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/coreos/go-semver/semver"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/api/v3/version"
)

// EtcdVersion is the etcd version strata reports in Status: the version of
// the etcd API it implements, so that tools that gate features on the
// server version treat strata as that etcd.
var EtcdVersion = version.Version

// Maintenance implements etcd's Maintenance service. Status, HashKV and
// MoveLeader need only the Backend; Snapshot, Hash, Defragment and alarms
// need a MaintenanceBackend (package maintenance), and answer
// codes.Unimplemented without one. Downgrade checks its target as etcd does
// and refuses a valid one: strata has one storage version.
type Maintenance struct {
	pb.UnimplementedMaintenanceServer
	b     Backend
	mb    MaintenanceBackend // nil: Snapshot, Hash, Defragment and alarms unimplemented
	mover LeaderMover        // nil: MoveLeader unimplemented
	quota int64

	requestTimeout time.Duration
}

// MaintenanceBackend is what the Maintenance service needs beyond Backend
// (maintenance.Maintainer).
type MaintenanceBackend interface {
	// WriteBackup streams a snapshot of a consistent view of the store to
	// w in etcd's format (package etcddb) and returns the bytes written.
	WriteBackup(ctx context.Context, w io.Writer) (int64, error)
	// Hash hashes the whole MVCC key space and returns the revision the
	// hashed view holds.
	Hash() (hash uint32, rev int64, err error)
	// Defragment starts reclaiming space and returns.
	Defragment() error
	// Alarms lists the raised alarms.
	Alarms() []*pb.AlarmMember
	// ProposeAlarm replicates an alarm (de)activation.
	ProposeAlarm(ctx context.Context, r *pb.AlarmRequest) (*pb.AlarmResponse, error)
}

// NewMaintenance returns the Maintenance service over b and mb (nil: the
// services it provides answer codes.Unimplemented). quota is
// --quota-backend-bytes (0: no quota), reported by Status; requestTimeout
// bounds an alarm's proposal, as etcd bounds every proposal.
func NewMaintenance(b Backend, mb MaintenanceBackend, mover LeaderMover, quota int64, requestTimeout time.Duration) *Maintenance {
	return &Maintenance{b: b, mb: mb, mover: mover, quota: quota, requestTimeout: requestTimeout}
}

// Status reports the member's raft and storage state, as `etcdctl endpoint
// status` shows it. DbSize and DbSizeInUse are both the engine's files on
// disk: an LSM tree has no free pages inside its files to tell apart.
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
		StorageVersion:   StorageVersion,
		DbSizeQuota:      m.quota,
		DowngradeInfo:    &pb.DowngradeInfo{Enabled: false},
	}
	if resp.Leader == 0 {
		resp.Errors = append(resp.Errors, "etcdserver: no leader")
	}
	if mb := m.mb; mb != nil {
		for _, a := range mb.Alarms() {
			resp.Errors = append(resp.Errors, fmt.Sprintf("memberID:%d alarm:%s", a.MemberID, a.Alarm))
		}
	}
	fillHeader(m.b, &resp.Header, m.b.Store().Rev())
	return resp, nil
}

// StorageVersion is the storage version Status reports: etcd's major.minor
// whose API strata serves.
var StorageVersion = func() string {
	v := EtcdVersion
	if i := strings.LastIndexByte(v, '.'); i > 0 {
		return v[:i] + ".0"
	}
	return v
}()

// Alarm lists, raises or clears alarms. GET lists the raised alarms of the
// type asked (NONE: all); ACTIVATE and DEACTIVATE go through raft, so every
// member applies them, and answer the alarms they changed, as etcd does.
func (m *Maintenance) Alarm(ctx context.Context, r *pb.AlarmRequest) (*pb.AlarmResponse, error) {
	mb, ok := m.mb, m.mb != nil
	resp := &pb.AlarmResponse{}
	switch {
	case r.Action == pb.AlarmRequest_GET:
		if ok {
			for _, a := range mb.Alarms() {
				if r.Alarm == pb.AlarmType_NONE || a.Alarm == r.Alarm {
					resp.Alarms = append(resp.Alarms, a)
				}
			}
		}
	case !ok:
		return m.UnimplementedMaintenanceServer.Alarm(ctx, r)
	default:
		pctx, cancel := context.WithTimeout(ctx, m.requestTimeout)
		defer cancel()
		var err error
		if resp, err = mb.ProposeAlarm(pctx, r); err != nil {
			return nil, toGRPCError(err)
		}
	}
	fillHeader(m.b, &resp.Header, m.b.Store().Rev())
	return resp, nil
}

// Hash hashes the whole MVCC key space at the current revision (etcd's
// Hash over its whole backend). Its value depends on strata's engine
// layout and on physical compaction; compare members with HashKV.
func (m *Maintenance) Hash(ctx context.Context, r *pb.HashRequest) (*pb.HashResponse, error) {
	mb, ok := m.mb, m.mb != nil
	if !ok {
		return m.UnimplementedMaintenanceServer.Hash(ctx, r)
	}
	h, rev, err := mb.Hash()
	if err != nil {
		return nil, toGRPCError(err)
	}
	resp := &pb.HashResponse{Hash: h}
	fillHeader(m.b, &resp.Header, rev)
	return resp, nil
}

// Defragment asks the engine to rewrite its files and returns at once: a
// compaction runs in the background and blocks neither reads nor writes.
func (m *Maintenance) Defragment(ctx context.Context, r *pb.DefragmentRequest) (*pb.DefragmentResponse, error) {
	mb, ok := m.mb, m.mb != nil
	if !ok {
		return m.UnimplementedMaintenanceServer.Defragment(ctx, r)
	}
	if err := mb.Defragment(); err != nil {
		return nil, toGRPCError(err)
	}
	resp := &pb.DefragmentResponse{}
	fillHeader(m.b, &resp.Header, m.b.Store().Rev())
	return resp, nil
}

// snapshotChunk is the blob size of one Snapshot message (etcd's).
const snapshotChunk = 32 << 10

// Snapshot streams a backup of this member's store: a strata snapshot
// stream padded to 512 bytes and followed by its SHA-256, so that `etcdctl
// snapshot save` accepts and checks it as it does etcd's bbolt file
// (snapshot/FORMAT.md). RemainingBytes is not known in advance and is 0;
// the first message carries the version, as etcd 3.6's does.
func (m *Maintenance) Snapshot(r *pb.SnapshotRequest, srv pb.Maintenance_SnapshotServer) error {
	mb, ok := m.mb, m.mb != nil
	if !ok {
		return m.UnimplementedMaintenanceServer.Snapshot(r, srv)
	}
	cw := &chunkSender{srv: srv, b: m.b, buf: make([]byte, 0, snapshotChunk)}
	if _, err := mb.WriteBackup(srv.Context(), cw); err != nil {
		return toGRPCError(fmt.Errorf("snapshot: %w", err))
	}
	return cw.flush()
}

// chunkSender cuts what is written to it into Snapshot messages.
type chunkSender struct {
	srv  pb.Maintenance_SnapshotServer
	b    Backend
	buf  []byte
	sent bool
}

func (c *chunkSender) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(len(p), snapshotChunk-len(c.buf))
		c.buf = append(c.buf, p[:k]...)
		p = p[k:]
		if len(c.buf) == snapshotChunk {
			if err := c.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (c *chunkSender) flush() error {
	if len(c.buf) == 0 && c.sent {
		return nil
	}
	resp := &pb.SnapshotResponse{Blob: c.buf}
	if !c.sent {
		resp.Version = StorageVersion // etcd's: the backend's storage version
		fillHeader(c.b, &resp.Header, c.b.Store().Rev())
	}
	if err := c.srv.Send(resp); err != nil {
		return err
	}
	c.sent = true
	c.buf = make([]byte, 0, snapshotChunk)
	return nil
}

// Downgrade answers etcd's downgrade requests with etcd's checks: a target
// of the form major.minor[.patch], one minor below the cluster version; and a
// cancel with no downgrade in progress answers the cluster version, after a
// linearizable read, as etcd answers it. A valid target is refused, for
// validation as for enabling: etcd's downgrade has its members write the
// older version's storage and then be replaced by the older binary, and
// strata's data directory is not etcd's. The way to an etcd cluster is a
// snapshot (etcdctl snapshot save) restored by etcdutl.
func (m *Maintenance) Downgrade(ctx context.Context, r *pb.DowngradeRequest) (*pb.DowngradeResponse, error) {
	cluster := version.Cluster(EtcdVersion)
	switch r.Action {
	case pb.DowngradeRequest_VALIDATE, pb.DowngradeRequest_ENABLE:
		target, err := semver.NewVersion(r.Version)
		if err != nil {
			// etcd accepts major.minor too.
			if target, err = semver.NewVersion(r.Version + ".0"); err != nil {
				return nil, rpctypes.ErrGRPCWrongDowngradeVersionFormat
			}
		}
		current := semver.Must(semver.NewVersion(cluster + ".0"))
		if target.Major != current.Major || target.Minor != current.Minor-1 {
			return nil, rpctypes.ErrGRPCInvalidDowngradeTargetVersion
		}
		return nil, status.Errorf(codes.FailedPrecondition,
			"etcdserver: strata cannot downgrade to etcd %d.%d: its data directory is not etcd's (save a snapshot with etcdctl snapshot save and restore it with etcdutl)",
			target.Major, target.Minor)
	case pb.DowngradeRequest_CANCEL:
		if err := m.b.ReadBarrier(ctx); err != nil {
			return nil, toGRPCError(err)
		}
		resp := &pb.DowngradeResponse{Version: cluster}
		fillHeader(m.b, &resp.Header, m.b.Store().Rev())
		return resp, nil
	default:
		return nil, status.Errorf(codes.InvalidArgument, "etcdserver: unknown downgrade action %d", r.Action)
	}
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
	if m.mover == nil {
		return m.UnimplementedMaintenanceServer.MoveLeader(ctx, r)
	}
	if err := m.mover.MoveLeader(ctx, r.TargetID); err != nil {
		return nil, membershipError(err)
	}
	resp := &pb.MoveLeaderResponse{}
	fillHeader(m.b, &resp.Header, m.b.Store().Rev())
	return resp, nil
}
