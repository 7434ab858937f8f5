// Package maintenance is a member's side of etcd's Maintenance service:
// backups of a consistent engine view (the Snapshot RPC) and restoring them
// into a new data directory, Hash, Defragment, alarms (replicated through
// raft, see apply/alarm.go; the space quota that raises NOSPACE is checked
// where requests are proposed, propose/quota.go), and the corruption check,
// which compares HashKV with every peer over the peer URLs.
package maintenance

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/strata-kv/strata/apply"
	"github.com/strata-kv/strata/auth"
	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/etcddb"
	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/tlsconfig"
	"github.com/strata-kv/strata/transport"
)

// State is what the maintainer reads of the replicated cluster state (the
// applier's).
type State interface {
	Alarms() []*pb.AlarmMember
	Members() []*pb.Member
}

// Raft is what the maintainer needs of raft: whether this member leads,
// the term (recorded in snapshots), and a read barrier (the initial
// corruption check waits until the member has caught up).
type Raft interface {
	Leader() uint64
	Term() uint64
	ReadBarrier(ctx context.Context) error
}

// Proposer replicates a request and returns its applied result
// (propose.Proposer).
type Proposer interface {
	Propose(ctx context.Context, req *pb.InternalRaftRequest) (apply.Result, error)
}

// Config is a maintainer's collaborators and settings.
type Config struct {
	MemberID, ClusterID uint64
	Engine              engine.Transferable
	Store               *mvcc.Store
	State               State
	Raft                Raft
	Proposer            Proposer
	// PeerTLS dials peers for their HashKV.
	PeerTLS tlsconfig.Info
	// TempDir holds a snapshot's database while it is built (etcd's
	// format needs a file, on the operating system's file system): best
	// the data directory's, which has room for a copy of the data; empty
	// means the system's temporary directory.
	TempDir string
	// SeekReads makes a backup read each key version's value by seeking
	// one reused iterator instead of a Get (engines.SeeksCheaperThanGets):
	// a backup reads one value per version, which on Pebble cost most of
	// its CPU.
	SeekReads bool
	// InitialCorruptCheck and CorruptCheckTime are etcd's corruption
	// checks (--experimental-initial-corrupt-check, --corrupt-check-time;
	// 0: no periodic check).
	InitialCorruptCheck bool
	CorruptCheckTime    time.Duration
	Logger              *zap.Logger
}

// Maintainer serves the maintenance operations of one member. Safe for
// concurrent use.
type Maintainer struct {
	cfg    Config
	logger *zap.Logger
	// defragRunning is set while a Defragment-triggered compaction runs.
	defragRunning atomic.Bool
	// background counts the goroutines Defragment started.
	background sync.WaitGroup
}

// New returns a maintainer; Run starts its corruption checks.
func New(cfg Config) *Maintainer {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &Maintainer{cfg: cfg, logger: cfg.Logger}
}

// Wait waits for the background work Defragment started.
func (m *Maintainer) Wait() { m.background.Wait() }

// WriteBackup writes a snapshot of a consistent view of the engine to w
// in etcd's format (package etcddb: etcd's bbolt database followed by its
// SHA-256), which etcdctl and etcdutl read and etcd restores from, and
// returns the bytes written.
func (m *Maintainer) WriteBackup(ctx context.Context, w io.Writer) (int64, error) {
	view, err := m.cfg.Engine.NewExportView()
	if err != nil {
		return 0, err
	}
	defer view.Close()
	// Everything is read from the one view: the snapshot is one instant of
	// the state machine.
	r := view.Reader()
	revs, err := mvcc.ReadRevisionState(r)
	if err != nil {
		return 0, err
	}
	leases, err := mvcc.ReadLeases(r)
	if err != nil {
		return 0, err
	}
	authState, err := auth.ReadState(r)
	if err != nil {
		return 0, err
	}
	cluster, err := apply.ReadClusterState(r)
	if err != nil {
		return 0, err
	}
	contents := etcddb.Contents{
		ConsistentIndex: view.AppliedIndex(), Term: m.cfg.Raft.Term(), ConfState: cluster.ConfState,
		Revisions: revs, Leases: leases, Auth: authState, Members: cluster.Members, Removed: cluster.Removed, Alarms: cluster.Alarms,
	}
	versions := r
	if m.cfg.SeekReads {
		sr := &seekReader{Reader: r}
		defer sr.Close()
		versions = sr
	}
	return etcddb.Write(w, m.cfg.TempDir, contents, func(fn func(mvcc.KeyChange) error) error {
		return mvcc.ForEachVersion(versions, func(c mvcc.KeyChange) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			return fn(c)
		})
	})
}

// mvccStateKey is where the MVCC store keeps its current and compact
// revisions (mvcc/keys.go: metaState, two big-endian int64s).
var mvccStateKey = []byte("mmstate")

// Hash implements etcd's Hash over strata's engine: a CRC-32C (etcd's
// polynomial) of every key and value of the MVCC key-value spaces in one
// consistent engine view (mvcc.WriteKeySpaces, which writes them in one
// layout whichever way the versions were stored), and the revision that
// view holds. Like etcd's, it depends on how far physical compaction has
// gone, so only members at the same revision and compaction state agree;
// unlike etcd's, it hashes strata's engine layout, so its value is not
// comparable with etcd's. HashKV is the check to compare members with.
func (m *Maintainer) Hash() (hash uint32, rev int64, err error) {
	snap := m.cfg.Engine.NewSnapshot()
	defer snap.Close()
	rev = 1
	if b, err := snap.Get(mvccStateKey); err == nil && len(b) == 16 {
		rev = int64(binary.BigEndian.Uint64(b))
	} else if err != nil && !errors.Is(err, engine.ErrNotFound) {
		return 0, 0, fmt.Errorf("hash: read revision: %w", err)
	}
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	if err := mvcc.WriteKeySpaces(snap, h); err != nil {
		return 0, 0, fmt.Errorf("hash: %w", err)
	}
	return h.Sum32(), rev, nil
}

// Defragment starts a full engine compaction in the background and
// returns: an LSM tree reclaims space by rewriting files, which never
// blocks reads or writes, so there is nothing to wait for. A request while
// one runs is a no-op.
func (m *Maintainer) Defragment() error {
	if !m.defragRunning.CompareAndSwap(false, true) {
		return nil
	}
	m.background.Add(1)
	go func() {
		defer m.background.Done()
		defer m.defragRunning.Store(false)
		start := time.Now()
		if err := m.cfg.Engine.CompactAll(); err != nil {
			m.logger.Warn("defragment: engine compaction failed", zap.Error(err))
			return
		}
		m.logger.Info("defragment: engine compacted", zap.Duration("took", time.Since(start)),
			zap.Int64("disk-size", m.cfg.Engine.DiskSize()))
	}()
	return nil
}

// Alarms returns the raised alarms.
func (m *Maintainer) Alarms() []*pb.AlarmMember { return m.cfg.State.Alarms() }

// ProposeAlarm replicates an alarm activation or deactivation and returns
// the alarms it changed.
func (m *Maintainer) ProposeAlarm(ctx context.Context, r *pb.AlarmRequest) (*pb.AlarmResponse, error) {
	res, err := m.cfg.Proposer.Propose(ctx, &pb.InternalRaftRequest{Alarm: r})
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		return nil, res.Err
	}
	resp, _ := res.Response.(*pb.AlarmResponse)
	if resp == nil {
		resp = &pb.AlarmResponse{}
	}
	return resp, nil
}

// ErrInconsistent is the start-up corruption check's verdict: this
// member's data differs from a peer's at the same revision.
var ErrInconsistent = errors.New("found data inconsistency with peers")

// corruptCheck compares this member's HashKV at its current revision with
// every peer's at the same revision, asked over the peer URLs (as etcd asks
// /members/hashkv on them: no client credentials or auth token needed).
// When a peer at the same compact revision disagrees, the start-up check
// returns ErrInconsistent, and the member stops, as etcd refuses to start
// such a member (it is the one that just came back with data from disk; an
// alarm would stop the whole cluster's writes); the leader's periodic check
// raises CORRUPT for the peer, as etcd's does. A peer that has not reached
// the revision, has compacted past it or cannot be reached is skipped: it
// is compared next time.
func (m *Maintainer) corruptCheck(ctx context.Context, initial bool) error {
	hash, rev, compactRev, err := m.cfg.Store.HashKV(0)
	if err != nil {
		m.logger.Warn("corruption check: local hash", zap.Error(err))
		return nil
	}
	for _, peer := range m.cfg.State.Members() {
		if peer.ID == m.cfg.MemberID || len(peer.PeerURLs) == 0 {
			continue
		}
		resp, err := m.peerHashKV(ctx, peer.PeerURLs[0], rev)
		if err != nil {
			m.logger.Debug("corruption check: peer hash", zap.String("peer", fmt.Sprintf("%x", peer.ID)), zap.Error(err))
			continue
		}
		if resp.CompactRevision != compactRev || resp.Hash == hash {
			continue
		}
		if initial {
			m.logger.Error("corruption check at start-up: hashes differ; this member stops",
				zap.Int64("revision", rev), zap.Int64("compact-revision", compactRev),
				zap.Uint32("local-hash", hash), zap.Uint32("peer-hash", resp.Hash),
				zap.String("peer", fmt.Sprintf("%x", peer.ID)))
			return fmt.Errorf("%x %w (peer %x at revision %d)", m.cfg.MemberID, ErrInconsistent, peer.ID, rev)
		}
		m.logger.Error("corruption check: hashes differ, raising CORRUPT",
			zap.Int64("revision", rev), zap.Int64("compact-revision", compactRev),
			zap.Uint32("local-hash", hash), zap.Uint32("peer-hash", resp.Hash),
			zap.String("peer", fmt.Sprintf("%x", peer.ID)))
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = m.ProposeAlarm(pctx, &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: peer.ID, Alarm: pb.AlarmType_CORRUPT})
		cancel()
		if err != nil {
			m.logger.Warn("corruption check: raise CORRUPT", zap.Error(err))
		}
	}
	return nil
}

// peerHashKV asks a peer's peer-port Maintenance service for its HashKV at
// rev.
func (m *Maintainer) peerHashKV(ctx context.Context, peerURL string, rev int64) (*pb.HashKVResponse, error) {
	addr, err := transport.HostPort(peerURL)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(m.cfg.PeerTLS.DialCreds(peerURL, m.logger)))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", peerURL, err)
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return pb.NewMaintenanceClient(conn).HashKV(cctx, &pb.HashKVRequest{Revision: rev})
}

// peerMaintenance serves HashKV, and nothing else of the Maintenance
// service, on the peer port, for other members' corruption checks. The
// peer port is the cluster's own (peer TLS secures it when configured);
// clients use the client URLs, where auth applies.
type peerMaintenance struct {
	pb.UnimplementedMaintenanceServer
	m *Maintainer
}

// HashKV answers a peer's corruption check.
func (p peerMaintenance) HashKV(ctx context.Context, r *pb.HashKVRequest) (*pb.HashKVResponse, error) {
	hash, hashRev, compactRev, err := p.m.cfg.Store.HashKV(r.Revision)
	if err != nil {
		return nil, err
	}
	return &pb.HashKVResponse{
		Header: &pb.ResponseHeader{ClusterId: p.m.cfg.ClusterID, MemberId: p.m.cfg.MemberID, Revision: p.m.cfg.Store.Rev()},
		Hash:   hash, HashRevision: hashRev, CompactRevision: compactRev,
	}, nil
}

// RegisterPeer adds the peer-port HashKV service (peerMaintenance) to
// the peer gRPC server; it must run before the server serves.
func (m *Maintainer) RegisterPeer(s *grpc.Server) {
	pb.RegisterMaintenanceServer(s, peerMaintenance{m: m})
}

// Run runs the corruption checks the configuration asks for, until ctx
// ends: once after start-up (InitialCorruptCheck, once the member has
// caught up with the leader; its ErrInconsistent is returned, and the
// member stops) and every CorruptCheckTime on the leader.
func (m *Maintainer) Run(ctx context.Context) error {
	if m.cfg.InitialCorruptCheck {
		if err := m.cfg.Raft.ReadBarrier(ctx); err != nil {
			return nil
		}
		if err := m.corruptCheck(ctx, true); err != nil {
			return err
		}
	}
	if m.cfg.CorruptCheckTime <= 0 {
		return nil
	}
	t := time.NewTicker(m.cfg.CorruptCheckTime)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if m.cfg.Raft.Leader() == m.cfg.MemberID {
			_ = m.corruptCheck(ctx, false) // it raises CORRUPT itself
		}
	}
}
