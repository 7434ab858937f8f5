package maintenance

import (
	"cmp"
	"fmt"
	"github.com/strata-kv/strata/apply"
	"io"
	"os"
	"path/filepath"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/auth"
	"github.com/strata-kv/strata/datadir"
	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/engine/engines"
	"github.com/strata-kv/strata/etcddb"
	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/snapshot"
)

// RestoreConfig says where a backup goes and which new cluster it starts,
// in etcdutl snapshot restore's terms.
type RestoreConfig struct {
	// Backup is the file `etcdctl snapshot save` wrote: in etcd's format
	// (etcd's or strata's snapshot, or an etcd member's member/snap/db),
	// or in the format strata's snapshots had before they were etcd's
	// (snapshot/FORMAT.md). Ignored when Source is set.
	Backup string
	// Source, if not nil, gives the records to restore instead of Backup
	// (package backup: the keys of a downloaded engine checkpoint). It is
	// called once, after the data directory's engine is open.
	Source  RestoreSource
	Name    string
	DataDir string
	// Engine is the engine the new data directory is built on
	// (engines.Names; "" means the default): a restore may move a member's
	// data to another engine.
	Engine string
	// InitialCluster maps member names to peer URLs; with the token it
	// gives the new member and cluster IDs, as at a cluster's bootstrap.
	InitialCluster      map[string][]string
	InitialClusterToken string
	Logger              *zap.Logger
	// FS holds the data directory; nil means the real file system (tests
	// cut its power). The backup is read from the real file system.
	FS vfs.FS
}

// RestoreSource writes every record of what is restored to sink, in
// strictly increasing key order, the engine's reserved keys included (the
// applied-index key says which raft index the records hold), and returns
// that applied index and the number of records written. Restore filters
// the records (restoreFilter) before they reach the new engine, so a
// source passes them as they were.
type RestoreSource func(sink snapshot.Sink) (applied, records uint64, err error)

// RestoreResult describes a restored data directory.
type RestoreResult struct {
	MemberID, ClusterID uint64
	// AppliedIndex is the raft index the backed-up member had applied; the
	// new cluster's log starts afresh regardless.
	AppliedIndex uint64
	Records      uint64
	// WAL, for a restore from an etcd data directory, says what its WAL
	// added to its database; nil otherwise.
	WAL *WALReplay
}

// WALReplay is what a restore from an etcd data directory read from its
// WAL (member/wal) and applied on top of its database (member/snap/db).
type WALReplay struct {
	// Files is the number of WAL files read.
	Files int
	// ConsistentIndex is the database's: the last entry it held.
	ConsistentIndex uint64
	// Commit is the WAL's commit index (its last HardState's).
	Commit uint64
	// LastIndex is the WAL's last entry.
	LastIndex uint64
	// Entries is the number of entries applied: ConsistentIndex+1 to
	// Commit, or to LastIndex when OneMember (0 if the database held
	// every one).
	Entries uint64
	// OneMember is set when the member was its cluster's only voter:
	// entries past Commit are committed too (etcd acknowledges an entry
	// before it writes the state record that says so, and commits its
	// whole log when it restarts), so they are applied. Otherwise they may
	// be a deposed leader's and are left out: PastCommit counts them.
	OneMember  bool
	PastCommit uint64
	// Torn is set when the WAL ended in a partially written record,
	// never acknowledged, which was left out as etcd leaves it out.
	Torn bool
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
	source := cfg.Source
	etcdFormat := false
	etcdDir := false
	if source == nil {
		if st, err := os.Stat(cfg.Backup); err == nil && st.IsDir() {
			etcdDir, etcdFormat = true, true
			if err := checkEtcdDataDir(cfg.Backup); err != nil {
				return RestoreResult{}, err
			}
		}
	}
	if source == nil && !etcdDir {
		strataFormat, err := isStrataBackup(cfg.Backup)
		if err != nil {
			return RestoreResult{}, err
		}
		etcdFormat = !strataFormat
		source = backupFileSource(cfg.Backup)
	}
	fs := cfg.FS
	engineDir := datadir.Engine(cfg.DataDir)
	if err := datadir.MkdirAllSynced(fs, engineDir); err != nil {
		return RestoreResult{}, fmt.Errorf("create data dir: %w", err)
	}
	eng, err := engines.Open(cfg.Engine, engineDir, engines.Options{FS: fs, Logger: cfg.Logger.Named("engine")})
	if err != nil {
		return RestoreResult{}, fmt.Errorf("open engine: %w", err)
	}
	defer eng.Close()
	var applied, records uint64
	var wal *WALReplay
	switch {
	case etcdDir:
		applied, records, wal, err = restoreEtcdDataDir(cfg, eng)
	case etcdFormat:
		applied, records, err = restoreEtcd(cfg, cfg.Backup, eng, nil)
	default:
		applied, records, err = restoreRecords(cfg, eng, source)
	}
	if err != nil {
		return RestoreResult{}, err
	}
	if err := eng.Flush(); err != nil {
		return RestoreResult{}, fmt.Errorf("flush restored engine: %w", err)
	}
	id, err := datadir.BootstrapID(cfg.Name, cfg.InitialCluster, cfg.InitialClusterToken)
	if err != nil {
		return RestoreResult{}, err
	}
	id.Engine = cmp.Or(cfg.Engine, datadir.DefaultEngine)
	if err := datadir.WriteID(fs, cfg.DataDir, id); err != nil {
		return RestoreResult{}, err
	}
	return RestoreResult{MemberID: id.MemberID, ClusterID: id.ClusterID, AppliedIndex: applied, Records: records, WAL: wal}, nil
}

// restoreRecords installs the records source gives into eng, through one
// table.
func restoreRecords(cfg RestoreConfig, eng engine.Transferable, source RestoreSource) (applied, records uint64, err error) {
	table := filepath.Join(cfg.DataDir, "restore.sst")
	w, err := eng.NewSnapshotWriter(table)
	if err != nil {
		return 0, 0, err
	}
	applied, records, err = source(restoreFilter{w})
	if err != nil {
		w.Abort()
		return 0, 0, err
	}
	if err := w.Finish(); err != nil {
		return 0, 0, err
	}
	if _, err := eng.InstallSnapshot(table); err != nil {
		return 0, 0, err
	}
	_ = cfg.FS.Remove(table)
	return applied, records, nil
}

// isStrataBackup reports whether the file at path is in the format strata's
// snapshots had before they were etcd's: it starts as a full snapshot
// stream does (snapshot.Kind).
func isStrataBackup(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, fmt.Errorf("open backup: %w", err)
	}
	defer f.Close()
	prefix := make([]byte, 8)
	if _, err := io.ReadFull(f, prefix); err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return false, fmt.Errorf("read backup: %w", err)
	}
	return snapshot.Kind(prefix) == snapshot.KindFull, nil
}

// importBatchVersions bounds the key versions restoreEtcd writes in one
// engine batch.
const importBatchVersions = 10000

// restoreEtcd writes the state of an etcd database into eng through the
// MVCC store, as the batches that made it would have: every key version
// at its revision, the revision and compact revision, the lease records and
// the auth state. Like a strata backup's restore, it leaves out the old
// cluster's membership, conf state and alarms, and commits at applied
// index commitAt: 0, so that the new cluster's log applies from its start,
// or, into a staging engine, the database's consistent index, from which
// its WAL is replayed (restoreEtcdDataDir).
func restoreEtcd(cfg RestoreConfig, path string, eng engine.Transferable, commitAt func(c *etcddb.Contents) uint64) (applied, records uint64, err error) {
	store, err := mvcc.Open(eng, mvcc.Options{Logger: cfg.Logger.Named("mvcc")})
	if err != nil {
		return 0, 0, fmt.Errorf("open mvcc store: %w", err)
	}
	defer store.Close()
	w := store.Write(nil)
	defer func() {
		if err != nil {
			w.Abort()
		}
	}()
	inBatch := 0
	contents, err := etcddb.Read(path, func(c mvcc.KeyChange) error {
		if err := w.SetKeyState(c); err != nil {
			return fmt.Errorf("write revision %d.%d of %q: %w", c.Main, c.Sub, c.Key, err)
		}
		records++
		if inBatch++; inBatch == importBatchVersions {
			if err := w.Commit(0); err != nil {
				return err
			}
			w, inBatch = store.Write(nil), 0
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	if err := w.RaiseRevision(contents.Revisions.Rev); err != nil {
		return 0, 0, err
	}
	for _, l := range contents.Leases {
		if err := w.PutLease(l); err != nil {
			return 0, 0, fmt.Errorf("write lease %x: %w", l.ID, err)
		}
	}
	if err := auth.WriteState(w.Batch(), contents.Auth); err != nil {
		return 0, 0, err
	}
	if err := w.RaiseCompactRev(contents.Revisions.CompactRev); err != nil {
		return 0, 0, err
	}
	at := uint64(0)
	if commitAt != nil {
		at = commitAt(&contents)
		// A staging store, whose WAL is replayed next: the entries etcd's
		// alarms refused must be refused there too. The export that
		// follows leaves the alarms out, as every restore does.
		if err := apply.WriteAlarms(w, contents.Alarms); err != nil {
			return 0, 0, err
		}
	}
	if err := w.Commit(at); err != nil {
		return 0, 0, fmt.Errorf("commit restored state: %w", err)
	}
	return contents.ConsistentIndex, records, nil
}

// backupFileSource reads the backup file `etcdctl snapshot save` wrote.
func backupFileSource(path string) RestoreSource {
	return func(sink snapshot.Sink) (uint64, uint64, error) {
		f, err := os.Open(path)
		if err != nil {
			return 0, 0, fmt.Errorf("open backup: %w", err)
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return 0, 0, fmt.Errorf("stat backup: %w", err)
		}
		applied, records, err := snapshot.ReadBackup(f, st.Size(), sink)
		if err != nil {
			return 0, 0, fmt.Errorf("read backup %s: %w", path, err)
		}
		return applied, records, nil
	}
}

// restoreDropped are the keys a restore leaves out: the old cluster's
// raft and membership state, removed members and refused changes
// included, and its alarms (apply.ClusterStateMeta). The applied index is
// kept at zero, so the new log's entries all apply. The old cluster's
// index -> revision rows (mvcc.IsIndexRevisionKey) are left out too: they
// describe the old log, and the new one starts from index 1 again, where
// log compaction would take them for its own.
var restoreDropped = func() map[string]bool {
	keys := map[string]bool{}
	for _, name := range apply.ClusterStateMeta {
		keys[string(mvcc.MetaKey(name))] = true
	}
	return keys
}()

// restoreFilter passes a backup's records to the table writer, minus the
// old cluster's state.
type restoreFilter struct{ w snapshot.Sink }

func (r restoreFilter) Add(key, value []byte) error {
	if restoreDropped[string(key)] || mvcc.IsIndexRevisionKey(key) {
		return nil
	}
	if string(key) == string(engine.AppliedIndexKey) {
		var zero [8]byte
		return r.w.Add(key, zero[:])
	}
	return r.w.Add(key, value)
}
