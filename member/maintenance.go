package member

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/strata-kv/strata/datadir"
	"github.com/strata-kv/strata/engine"
	pebbleengine "github.com/strata-kv/strata/engine/pebble"
	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/snapshot"
)

// This file is the member's side of etcd's Maintenance service: backups
// (the Snapshot RPC) and restoring them into a new data directory, the
// space quota and its NOSPACE alarm, alarms in general (replicated through
// raft, see apply/alarm.go), Hash, Defragment and the corruption check.

// WriteBackup streams a backup of a consistent view of the engine to w
// (snapshot.WriteBackup's format, see snapshot/FORMAT.md) and returns the
// bytes written.
func (m *Member) WriteBackup(ctx context.Context, w io.Writer) (int64, error) {
	view, err := m.engine.NewExportView()
	if err != nil {
		return 0, err
	}
	defer view.Close()
	forEach := func(fn func(key, value []byte) error) error {
		return view.ForEach(func(key, value []byte) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			return fn(key, value)
		})
	}
	return snapshot.WriteBackup(w, view.AppliedIndex(), forEach)
}

// The MVCC key spaces Hash covers (mvcc/keys.go is their definition):
// current values, history, the revision index and lease attachments. Lease
// records (mg: TTLs) are not key-value data and are left out, as are the
// store's own bookkeeping (mm: revisions and compaction progress) and the
// applier's metadata (mu: membership, conf state, alarms), so
// members that agree on the data agree on the hash.
var hashSpaces = [][2]string{{"mc", "md"}, {"mh", "mi"}, {"ml", "mm"}, {"mr", "ms"}}

// mvccStateKey is where the MVCC store keeps its current and compact
// revisions (mvcc/keys.go: metaState, two big-endian int64s).
var mvccStateKey = []byte("mmstate")

// Hash implements etcd's Hash over strata's engine: a CRC-32C (etcd's
// polynomial) of every key and value of the MVCC key spaces in one
// consistent engine view, and the revision that view holds. Like etcd's, it
// depends on how far physical compaction has gone, so only members at the
// same revision and compaction state agree; unlike etcd's, it hashes
// strata's engine layout, so its value is not comparable with etcd's.
// HashKV is the check to compare members with.
func (m *Member) Hash() (hash uint32, rev int64, err error) {
	snap := m.engine.NewSnapshot()
	defer snap.Close()
	rev = 1
	if b, err := snap.Get(mvccStateKey); err == nil && len(b) == 16 {
		rev = int64(binary.BigEndian.Uint64(b))
	} else if err != nil && !errors.Is(err, engine.ErrNotFound) {
		return 0, 0, fmt.Errorf("hash: read revision: %w", err)
	}
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	for _, sp := range hashSpaces {
		it := snap.NewIter([]byte(sp[0]), []byte(sp[1]))
		for ok := it.First(); ok; ok = it.Next() {
			h.Write(it.Key())
			h.Write(it.Value())
		}
		if err := it.Close(); err != nil {
			return 0, 0, fmt.Errorf("hash %s: %w", sp[0], err)
		}
	}
	return h.Sum32(), rev, nil
}

// maintenanceState is the member's Maintenance bookkeeping.
type maintenanceState struct {
	// defragRunning is set while a Defragment-triggered compaction runs.
	defragRunning atomic.Bool
	// quotaSize caches the engine's size for the quota check.
	quotaSize diskSizeCache
}

// Defragment starts a full engine compaction in the background and
// returns: an LSM tree reclaims space by rewriting files, which never
// blocks reads or writes, so there is nothing to wait for. A request while
// one runs is a no-op.
func (m *Member) Defragment() error {
	if !m.maint.defragRunning.CompareAndSwap(false, true) {
		return nil
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer m.maint.defragRunning.Store(false)
		start := time.Now()
		if err := m.engine.CompactAll(); err != nil {
			m.logger.Warn("defragment: engine compaction failed", zap.Error(err))
			return
		}
		m.logger.Info("defragment: engine compacted", zap.Duration("took", time.Since(start)),
			zap.Int64("disk-size", m.engine.DiskSize()))
	}()
	return nil
}

// Alarms returns the raised alarms.
func (m *Member) Alarms() []*pb.AlarmMember { return m.applier.Alarms() }

// ProposeAlarm replicates an alarm activation or deactivation and returns
// the alarms it changed.
func (m *Member) ProposeAlarm(ctx context.Context, r *pb.AlarmRequest) (*pb.AlarmResponse, error) {
	res, err := m.Propose(ctx, &pb.InternalRaftRequest{Alarm: r})
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

// diskSizeCache keeps the engine's size for the quota check, refreshed at
// most every quotaRefresh: reading Pebble's metrics on every put would cost
// more than the put.
type diskSizeCache struct {
	size atomic.Int64
	at   atomic.Int64 // unix nanoseconds of the last refresh
}

const quotaRefresh = 100 * time.Millisecond

// checkQuota refuses a request that would grow the store beyond
// --quota-backend-bytes, and raises the NOSPACE alarm, as etcd's quota
// check does before proposing. The size is the engine's DiskSize: the
// files on disk, not data still in the memtable. A quota of 0 or less
// means none (strata's LSM has no file-size ceiling to protect).
func (m *Member) checkQuota(ctx context.Context, r *pb.InternalRaftRequest) error {
	quota := m.cfg.QuotaBackendBytes
	if quota <= 0 {
		return nil
	}
	cost := requestCost(r)
	if cost == 0 {
		return nil
	}
	now := time.Now().UnixNano()
	if now-m.maint.quotaSize.at.Load() > int64(quotaRefresh) {
		m.maint.quotaSize.size.Store(m.engine.DiskSize())
		m.maint.quotaSize.at.Store(now)
	}
	if m.maint.quotaSize.size.Load()+cost <= quota {
		return nil
	}
	raised := false
	for _, am := range m.Alarms() {
		if am.MemberID == m.memberID && am.Alarm == pb.AlarmType_NOSPACE {
			raised = true
		}
	}
	if !raised {
		m.logger.Warn("space quota exceeded, raising NOSPACE",
			zap.Int64("quota", quota), zap.Int64("disk-size", m.maint.quotaSize.size.Load()))
		if _, err := m.ProposeAlarm(ctx, &pb.AlarmRequest{
			Action: pb.AlarmRequest_ACTIVATE, MemberID: m.memberID, Alarm: pb.AlarmType_NOSPACE,
		}); err != nil {
			m.logger.Warn("raise NOSPACE alarm", zap.Error(err))
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

// corruptCheck compares this member's HashKV at its current revision with
// every peer's at the same revision, asked over the peer URLs (as etcd asks
// /members/hashkv on them: no client credentials or auth token needed),
// and raises CORRUPT when a peer at the same compact revision disagrees.
// The start-up check blames this member (it is the one that just came back
// with data from disk); the leader's periodic check blames the peer. A peer
// that has not reached the revision, has compacted past it or cannot be
// reached is skipped: it is compared next time.
func (m *Member) corruptCheck(ctx context.Context, initial bool) {
	hash, rev, compactRev, err := m.store.HashKV(0)
	if err != nil {
		m.logger.Warn("corruption check: local hash", zap.Error(err))
		return
	}
	for _, peer := range m.Members() {
		if peer.ID == m.memberID || len(peer.PeerURLs) == 0 {
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
		blame := peer.ID
		if initial {
			blame = m.memberID
		}
		m.logger.Error("corruption check: hashes differ, raising CORRUPT",
			zap.Int64("revision", rev), zap.Int64("compact-revision", compactRev),
			zap.Uint32("local-hash", hash), zap.Uint32("peer-hash", resp.Hash),
			zap.String("peer", fmt.Sprintf("%x", peer.ID)), zap.String("blamed", fmt.Sprintf("%x", blame)))
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = m.ProposeAlarm(pctx, &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: blame, Alarm: pb.AlarmType_CORRUPT})
		cancel()
		if err != nil {
			m.logger.Warn("corruption check: raise CORRUPT", zap.Error(err))
		}
	}
}

// peerHashKV asks a peer's peer-port Maintenance service for its HashKV at
// rev.
func (m *Member) peerHashKV(ctx context.Context, peerURL string, rev int64) (*pb.HashKVResponse, error) {
	addr, err := hostPort(peerURL)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(m.dialCreds(peerURL, m.cfg.TLS.Peer)))
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
	m *Member
}

// HashKV answers a peer's corruption check.
func (p peerMaintenance) HashKV(ctx context.Context, r *pb.HashKVRequest) (*pb.HashKVResponse, error) {
	hash, hashRev, compactRev, err := p.m.store.HashKV(r.Revision)
	if err != nil {
		return nil, err
	}
	return &pb.HashKVResponse{
		Header: &pb.ResponseHeader{ClusterId: p.m.clusterID, MemberId: p.m.memberID, Revision: p.m.store.Rev()},
		Hash:   hash, HashRevision: hashRev, CompactRevision: compactRev,
	}, nil
}

// registerPeerMaintenance adds peerMaintenance to the peer gRPC server; it
// must run before the server serves.
func (m *Member) registerPeerMaintenance() {
	pb.RegisterMaintenanceServer(m.peerGRPC, peerMaintenance{m: m})
}

// startMaintenance launches the corruption checks the configuration asks
// for: once after start-up (InitialCorruptCheck, once the member has caught
// up with the leader) and every CorruptCheckTime on the leader.
func (m *Member) startMaintenance(ctx context.Context) {
	if !m.cfg.InitialCorruptCheck && m.cfg.CorruptCheckTime <= 0 {
		return
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		if m.cfg.InitialCorruptCheck {
			if err := m.WaitReady(ctx); err != nil {
				return
			}
			m.corruptCheck(ctx, true)
		}
		if m.cfg.CorruptCheckTime <= 0 {
			return
		}
		t := time.NewTicker(m.cfg.CorruptCheckTime)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if m.node.Leader() == m.memberID {
				m.corruptCheck(ctx, false)
			}
		}
	}()
}

// RestoreConfig says where a backup goes and which new cluster it starts,
// in etcdutl snapshot restore's terms.
type RestoreConfig struct {
	// Backup is the file `etcdctl snapshot save` wrote.
	Backup  string
	Name    string
	DataDir string
	// InitialCluster maps member names to peer URLs; with the token it
	// gives the new member and cluster IDs, as at a cluster's bootstrap.
	InitialCluster      map[string][]string
	InitialClusterToken string
	Logger              *zap.Logger
	// FS holds the data directory; nil means the real file system (tests
	// cut its power). The backup is read from the real file system.
	FS vfs.FS
}

// RestoreResult describes a restored data directory.
type RestoreResult struct {
	MemberID, ClusterID uint64
	// AppliedIndex is the raft index the backed-up member had applied; the
	// new cluster's log starts afresh regardless.
	AppliedIndex uint64
	Records      uint64
}

// Restore builds a new data directory from a backup: the engine holds the
// backup's key-value data, leases and revisions, without the old cluster's
// membership, conf state, alarms or applied index, and the identity is the
// new member's. The member started on it with the same --name,
// --initial-cluster and --initial-cluster-token bootstraps a fresh raft log
// for the new cluster, as a member of a new cluster does.
//
// The directory is built under a temporary name beside it and renamed into
// place once whole (the parent directory synced), so a failure or a crash
// leaves no data directory: a member started on a half-built one would
// bootstrap a cluster on an empty or partial engine. A temporary directory
// a crashed restore left is removed by the next one.
func Restore(cfg RestoreConfig) (RestoreResult, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.FS == nil {
		cfg.FS = vfs.Default
	}
	if _, err := cfg.FS.Stat(cfg.DataDir); err == nil {
		return RestoreResult{}, fmt.Errorf("data-dir %q exists", cfg.DataDir)
	}
	final := cfg.DataDir
	cfg.DataDir = final + ".restoring"
	if err := cfg.FS.RemoveAll(cfg.DataDir); err != nil {
		return RestoreResult{}, fmt.Errorf("remove the leftover of an earlier restore: %w", err)
	}
	res, err := restoreInto(cfg)
	if err != nil {
		_ = cfg.FS.RemoveAll(cfg.DataDir)
		return RestoreResult{}, err
	}
	if err := cfg.FS.Rename(cfg.DataDir, final); err != nil {
		return RestoreResult{}, fmt.Errorf("move the restored data dir into place: %w", err)
	}
	parent, err := cfg.FS.OpenDir(filepath.Dir(final))
	if err == nil {
		err = parent.Sync()
		_ = parent.Close()
	}
	if err != nil {
		return RestoreResult{}, fmt.Errorf("sync the directory of the restored data dir: %w", err)
	}
	return res, nil
}

// restoreInto builds the restored data directory in cfg.DataDir.
func restoreInto(cfg RestoreConfig) (RestoreResult, error) {
	if _, ok := cfg.InitialCluster[cfg.Name]; !ok {
		return RestoreResult{}, fmt.Errorf("--initial-cluster has no member named %q (--name)", cfg.Name)
	}
	f, err := os.Open(cfg.Backup)
	if err != nil {
		return RestoreResult{}, fmt.Errorf("open backup: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return RestoreResult{}, fmt.Errorf("stat backup: %w", err)
	}
	fs := cfg.FS
	engineDir := datadir.Engine(cfg.DataDir)
	if err := datadir.MkdirAllSynced(fs, engineDir); err != nil {
		return RestoreResult{}, fmt.Errorf("create data dir: %w", err)
	}
	eng, err := pebbleengine.Open(engineDir, pebbleengine.Options{FS: fs, Logger: cfg.Logger.Named("engine")})
	if err != nil {
		return RestoreResult{}, fmt.Errorf("open engine: %w", err)
	}
	defer eng.Close()
	table := filepath.Join(cfg.DataDir, "restore.sst")
	w, err := eng.NewSnapshotWriter(table)
	if err != nil {
		return RestoreResult{}, err
	}
	applied, records, err := snapshot.ReadBackup(f, st.Size(), restoreFilter{w})
	if err != nil {
		w.Abort()
		return RestoreResult{}, fmt.Errorf("read backup %s: %w", cfg.Backup, err)
	}
	if err := w.Finish(); err != nil {
		return RestoreResult{}, err
	}
	if _, err := eng.InstallSnapshot(table); err != nil {
		return RestoreResult{}, err
	}
	_ = fs.Remove(table)
	if err := eng.Flush(); err != nil {
		return RestoreResult{}, fmt.Errorf("flush restored engine: %w", err)
	}
	id, err := datadir.BootstrapID(cfg.Name, cfg.InitialCluster, cfg.InitialClusterToken)
	if err != nil {
		return RestoreResult{}, err
	}
	if err := datadir.WriteID(fs, cfg.DataDir, id); err != nil {
		return RestoreResult{}, err
	}
	return RestoreResult{MemberID: id.MemberID, ClusterID: id.ClusterID, AppliedIndex: applied, Records: records}, nil
}

// restoreDropped are the keys a restore leaves out: the old cluster's
// raft and membership state (apply/apply.go, apply/alarm.go). The applied
// index is kept at zero, so the new log's entries all apply. The old
// cluster's index -> revision rows (mvcc.IsIndexRevisionKey) are left out
// too: they describe the old log, and the new one starts from index 1
// again, where log compaction would take them for its own.
var restoreDropped = map[string]bool{
	"muraft/confstate":  true,
	"mucluster/members": true,
	"mucluster/alarms":  true,
}

// restoreFilter passes a backup's records to the table writer, minus the
// old cluster's state.
type restoreFilter struct{ w snapshot.Sink }

func (r restoreFilter) Add(key, value []byte) error {
	if restoreDropped[string(key)] || mvcc.IsIndexRevisionKey(key) {
		return nil
	}
	if string(key) == string(pebbleengine.AppliedIndexKey) {
		var zero [8]byte
		return r.w.Add(key, zero[:])
	}
	return r.w.Add(key, value)
}

// quotaAdmission admits proposals under the space quota (checkQuota).
type quotaAdmission struct{ m *Member }

// Admit implements propose.Admission.
func (q quotaAdmission) Admit(ctx context.Context, r *pb.InternalRaftRequest) error {
	return q.m.checkQuota(ctx, r)
}
