package member

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/datadir"
	pebbleengine "github.com/strata-kv/strata/engine/pebble"
	"github.com/strata-kv/strata/logcompact"
	"github.com/strata-kv/strata/maintenance"
	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/snapshot"
)

// TestRestoreDropsIndexRevisionRows restores a backup of a member that
// wrote for a while, and checks that the restored engine holds none of the
// old cluster's index -> revision rows (mvcc's mi<index>, which describe
// the old cluster's raft log), and that log compaction in the restored
// cluster, whose log starts from index 1 again, builds a batch with a
// record for each of its writes: the reviewer's case, five puts and a batch
// ending on an index at which the old cluster wrote and the new one did
// not (a new leader's empty entry). With the old rows kept, that batch
// held no record at all: its last row, the old cluster's, put the revision
// below where the batch started.
func TestRestoreDropsIndexRevisionRows(t *testing.T) {
	const name = "rs"
	ctx := context.Background()
	put := func(m *Member, key, value string) {
		t.Helper()
		res, err := m.Propose(ctx, &pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte(key), Value: []byte(value)}})
		if err != nil || res.Err != nil {
			t.Fatalf("put %s: %v %v", key, err, res.Err)
		}
	}
	src := startInMemory(t, vfs.NewMem(), name, func(*Config) {})
	for i := range 30 {
		put(src, fmt.Sprintf("old%d", i%7), fmt.Sprint(i))
	}
	dir := t.TempDir()
	backup := saveBackupAndStop(t, src, dir)
	data := filepath.Join(dir, "restored")
	if _, err := maintenance.Restore(maintenance.RestoreConfig{Backup: backup, Name: name, DataDir: data,
		InitialCluster:      map[string][]string{name: {"http://127.0.0.1:2380"}},
		InitialClusterToken: name + "-test"}); err != nil {
		t.Fatal(err)
	}

	eng, err := pebbleengine.Open(filepath.Join(data, "engine"), pebbleengine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	it := eng.NewIter([]byte("mi"), []byte("mj"))
	rows := 0
	for ok := it.First(); ok; ok = it.Next() {
		rows++
	}
	if err := it.Close(); err != nil {
		t.Fatal(err)
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Errorf("the restored engine holds %d index -> revision rows of the old cluster", rows)
	}

	// The restored cluster: five puts, then a restart, whose election
	// appends an empty entry (an index without a row of its own).
	start := func() *Member {
		return startInMemory(t, vfs.Default, name, func(cfg *Config) { cfg.DataDir = data })
	}
	m := start()
	for i := range 5 {
		put(m, fmt.Sprintf("new%d", i), fmt.Sprint(i))
	}
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	m = start()
	defer func() {
		if err := m.Stop(); err != nil {
			t.Error(err)
		}
	}()
	last, err := m.log.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for m.applier.AppliedIndex() < last {
		if time.Now().After(deadline) {
			t.Fatalf("applied index %d, log's last %d", m.applier.AppliedIndex(), last)
		}
		time.Sleep(5 * time.Millisecond)
	}
	first, err := m.log.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	entries, err := m.log.Entries(first, last+1, math.MaxUint64)
	if err != nil {
		t.Fatal(err)
	}
	// From the first put to the restart's empty entry after the last.
	lo, hi := -1, -1
	for i, e := range entries {
		var req pb.InternalRaftRequest
		if e.GetType() != raftpb.EntryNormal {
			continue
		}
		if len(e.GetData()) == 0 {
			if lo >= 0 && hi < 0 {
				hi = i
			}
			continue
		}
		if err := proto.Unmarshal(e.GetData(), &req); err != nil {
			t.Fatal(err)
		}
		if req.Put != nil && lo < 0 {
			lo = i
		}
	}
	if lo < 0 || hi < 0 {
		t.Fatalf("no puts followed by an empty entry in the restored log (%d entries)", len(entries))
	}
	b, err := logcompact.Build(m.Store(), entries[lo:hi+1], math.MaxInt64)
	if err != nil {
		t.Fatal(err)
	}
	puts := 0
	for _, r := range b.Records {
		if r.Kind == logcompact.RecordPut {
			puts++
		}
	}
	if puts != 5 {
		t.Fatalf("batch of entries %d..%d holds %d put records, want 5 (records %+v)", b.FirstIndex, b.LastIndex, puts, b.Records)
	}
}

// TestRestoreFailureLeavesNoDataDir: a restore that fails half way (here a
// backup cut short; a crash or power cut likewise) must leave no data
// directory behind: a member started on a half-built one would bootstrap a
// new cluster on an empty or partial engine, and a second restore would
// refuse ("data-dir exists"). The directory appears whole, by a rename, or
// not at all.
func TestRestoreFailureLeavesNoDataDir(t *testing.T) {
	ctx := context.Background()
	src := startInMemory(t, vfs.NewMem(), "rf", func(*Config) {})
	for i := range 20 {
		res, err := src.Propose(ctx, &pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte(fmt.Sprint(i)), Value: []byte("v")}})
		if err != nil || res.Err != nil {
			t.Fatalf("put: %v %v", err, res.Err)
		}
	}
	dir := t.TempDir()
	full := saveBackupAndStop(t, src, dir)
	raw, err := os.ReadFile(full)
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(dir, "cut.db")
	if err := os.WriteFile(cut, raw[:len(raw)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := maintenance.RestoreConfig{Backup: cut, Name: "rf", DataDir: filepath.Join(dir, "restored"),
		InitialCluster: map[string][]string{"rf": {"http://127.0.0.1:2380"}}, InitialClusterToken: "rf-restored"}
	if _, err := maintenance.Restore(cfg); err == nil {
		t.Fatal("restore of a backup cut in half succeeded")
	}
	if _, err := os.Stat(cfg.DataDir); !os.IsNotExist(err) {
		t.Fatalf("a failed restore left the data dir %s (stat: %v)", cfg.DataDir, err)
	}
	// A second restore, of the whole backup, succeeds.
	cfg.Backup = full
	if _, err := maintenance.Restore(cfg); err != nil {
		t.Fatalf("restore after a failed one: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "identity")); err != nil {
		t.Fatalf("restored data dir has no identity: %v", err)
	}
}

// saveBackupAndStop writes src's backup to dir/backup.db, stops src, and
// returns the backup's path.
func saveBackupAndStop(t *testing.T, src *Member, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "backup.db")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.maintainer.WriteBackup(context.Background(), f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := src.Stop(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestRestorePowerCut cuts power at many instants while a restore runs
// (CrashClone of its file system, the unsynced part lost): on every clone
// the data directory is either absent or whole -- an identity and an
// engine holding the backup's revision -- never a directory a member
// would start on as a new cluster with an empty or partial engine.
func TestRestorePowerCut(t *testing.T) {
	src := startInMemory(t, vfs.NewMem(), "rp", func(*Config) {})
	for i := range 200 {
		res, err := src.Propose(context.Background(), &pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte(fmt.Sprint(i)), Value: make([]byte, 512)}})
		if err != nil || res.Err != nil {
			t.Fatalf("put: %v %v", err, res.Err)
		}
	}
	wantRev := src.Store().Rev()
	backup := saveBackupAndStop(t, src, t.TempDir())

	fs := vfs.NewCrashableMem()
	if err := datadir.MkdirAllSynced(fs, "/restore"); err != nil {
		t.Fatal(err)
	}
	cfg := maintenance.RestoreConfig{Backup: backup, Name: "rp", DataDir: "/restore/data", FS: fs,
		InitialCluster: map[string][]string{"rp": {"http://127.0.0.1:2380"}}, InitialClusterToken: "rp-restored"}
	done := make(chan error, 1)
	go func() {
		_, err := maintenance.Restore(cfg)
		done <- err
	}()
	var clones []*vfs.MemFS
	for running := true; running; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			running = false
		default:
			time.Sleep(50 * time.Microsecond)
		}
		clones = append(clones, fs.CrashClone(vfs.CrashCloneCfg{}))
	}
	whole := 0
	for i, clone := range clones {
		if _, err := clone.Stat(cfg.DataDir); err != nil {
			continue // not there: a second restore starts afresh
		}
		if _, err := clone.Stat(cfg.DataDir + "/identity"); err != nil {
			t.Fatalf("clone %d of %d: the data dir exists without an identity: %v", i, len(clones), err)
		}
		eng, err := pebbleengine.Open(cfg.DataDir+"/engine", pebbleengine.Options{FS: clone})
		if err != nil {
			t.Fatalf("clone %d: open the restored engine: %v", i, err)
		}
		store, err := mvcc.Open(eng, mvcc.Options{})
		if err == nil && store.Rev() != wantRev {
			err = fmt.Errorf("revision %d, want the backup's %d", store.Rev(), wantRev)
		}
		_ = eng.Close()
		if err != nil {
			t.Fatalf("clone %d of %d: the restored engine: %v", i, len(clones), err)
		}
		whole++
	}
	if whole == 0 {
		t.Fatalf("no clone of %d held the restored data dir: the last one must", len(clones))
	}
	t.Logf("%d power cuts during a restore: %d with the whole data dir, %d with none", len(clones), whole, len(clones)-whole)
}

// TestRestoreOlderFormat: a backup in the format strata's snapshots had
// before they were etcd's (snapshot/FORMAT.md, written here as the earlier
// release's Maintainer did) still restores, with its revision and keys.
func TestRestoreOlderFormat(t *testing.T) {
	const name = "ro"
	src := startInMemory(t, vfs.NewMem(), name, func(*Config) {})
	for i := range 20 {
		res, err := src.Propose(context.Background(), &pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte(fmt.Sprint(i % 5)), Value: []byte(fmt.Sprint(i))}})
		if err != nil || res.Err != nil {
			t.Fatalf("put: %v %v", err, res.Err)
		}
	}
	wantRev := src.Store().Rev()
	dir := t.TempDir()
	path := filepath.Join(dir, "older.db")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	view, err := src.engine.NewExportView()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := snapshot.WriteBackup(f, view.AppliedIndex(), view.ForEach); err != nil {
		t.Fatal(err)
	}
	view.Close()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := src.Stop(); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "restored")
	if _, err := maintenance.Restore(maintenance.RestoreConfig{Backup: path, Name: name, DataDir: data,
		InitialCluster: map[string][]string{name: {"http://127.0.0.1:2380"}}, InitialClusterToken: name + "-test"}); err != nil {
		t.Fatal(err)
	}
	eng, err := pebbleengine.Open(filepath.Join(data, "engine"), pebbleengine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	store, err := mvcc.Open(eng, mvcc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	got, err := store.Range(&pb.RangeRequest{Key: []byte("4")})
	if err != nil || store.Rev() != wantRev || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "19" {
		t.Fatalf("restored: revision %d (want %d), key 4 = %v, %v", store.Rev(), wantRev, got, err)
	}
}
