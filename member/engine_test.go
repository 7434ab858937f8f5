package member

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/strata-kv/strata/datadir"
	"github.com/strata-kv/strata/engine/engines"
	"github.com/strata-kv/strata/maintenance"
	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/server"
)

// TestEngineChoice runs a member on each engine other than Pebble: it
// serves, keeps its data across a restart, refuses to restart on another
// engine (naming both), and its snapshot, in etcd's format, restores into a
// data directory on Pebble with the same keys and revision.
func TestEngineChoice(t *testing.T) {
	for _, name := range engines.Names() {
		if name == engines.Pebble {
			continue
		}
		t.Run(name, func(t *testing.T) { testEngineChoice(t, name) })
	}
}

func testEngineChoice(t *testing.T, engineName string) {
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	start := func(engineName string) (*Member, error) {
		return Start(Config{
			Name: "e", DataDir: dataDir, Engine: engineName,
			ListenClientURLs: []string{"http://127.0.0.1:0"}, AdvertiseClientURLs: []string{"http://127.0.0.1:0"},
			ListenPeerURLs: []string{"http://127.0.0.1:0"}, AdvertisePeerURLs: []string{"http://127.0.0.1:2380"},
			InitialCluster: map[string][]string{"e": {"http://127.0.0.1:2380"}}, InitialClusterState: "new",
			InitialClusterToken: "e-test", AutoCompactionMode: "periodic", AutoCompactionRetention: "0",
			Client: server.ClientOptions{Limits: server.Limits{MaxRequestBytes: 1 << 20, MaxTxnOps: 128}}, CatchUpEntries: 10, SnapshotCount: 20,
			HeartbeatInterval: 10 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond,
		})
	}
	ready := func(m *Member) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	m, err := start(engineName)
	if err != nil {
		t.Fatal(err)
	}
	ready(m)
	ctx := context.Background()
	for i := range 100 {
		if res, err := m.Propose(ctx, &pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte(fmt.Sprintf("k%02d", i%40)), Value: []byte(fmt.Sprint(i))}}); err != nil || res.Err != nil {
			t.Fatalf("put: %v %v", err, res.Err)
		}
	}
	if res, err := m.Propose(ctx, &pb.InternalRaftRequest{DeleteRange: &pb.DeleteRangeRequest{Key: []byte("k1"), RangeEnd: []byte("k2")}}); err != nil || res.Err != nil {
		t.Fatalf("delete: %v %v", err, res.Err)
	}
	rev := m.Store().Rev()
	snapPath := filepath.Join(dir, "snap.db")
	f, err := os.Create(snapPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.maintainer.WriteBackup(ctx, f); err != nil {
		t.Fatalf("snapshot of a member on %s: %v", engineName, err)
	}
	f.Close()
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}

	if _, err := start(engines.Pebble); !errors.Is(err, datadir.ErrEngineMismatch) || !strings.Contains(err.Error(), engineName) || !strings.Contains(err.Error(), "pebble") {
		t.Fatalf("restart on pebble: %v; want a refusal naming both engines", err)
	}
	m, err = start(engineName)
	if err != nil {
		t.Fatal(err)
	}
	ready(m)
	got, err := m.Store().Range(&pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l")})
	if err != nil || got.Count != 30 || m.Store().Rev() != rev {
		t.Fatalf("after restart: %d keys at revision %d (%v); want 30 at %d", got.Count, m.Store().Rev(), err, rev)
	}
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}

	restored := filepath.Join(dir, "restored")
	if _, err := maintenance.Restore(maintenance.RestoreConfig{Backup: snapPath, Name: "r", DataDir: restored, Engine: engines.Pebble,
		InitialCluster: map[string][]string{"r": {"http://127.0.0.1:2380"}}, InitialClusterToken: "r"}); err != nil {
		t.Fatal(err)
	}
	eng, err := engines.Open(engines.Pebble, datadir.Engine(restored), engines.Options{FS: vfs.Default})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	store, err := mvcc.Open(eng, mvcc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if got, err := store.Range(&pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l")}); err != nil || got.Count != 30 || store.Rev() != rev {
		t.Fatalf("restored on pebble: %d keys at revision %d (%v); want 30 at %d", got.Count, store.Rev(), err, rev)
	}
}
