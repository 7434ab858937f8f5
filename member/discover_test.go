package member

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/strata-kv/strata/datadir"
	"github.com/strata-kv/strata/server"
)

// TestDiscoverHook: Config.Discover (v3 discovery) is asked for the
// cluster only while the member has none: on an empty data directory, and
// again after a crash between recording the identity and the first raft
// entries (where a different answer is refused); it is not asked on
// restart, and beside --initial-cluster-state=existing on an empty data
// directory it is refused in etcd's words.
func TestDiscoverHook(t *testing.T) {
	const self = "http://127.0.0.1:2380"
	config := func(dataDir, state string, discover func() (map[string][]string, error)) Config {
		return Config{
			Name: "e", DataDir: dataDir, FS: vfs.Default,
			ListenClientURLs: []string{"http://127.0.0.1:0"}, AdvertiseClientURLs: []string{"http://127.0.0.1:0"},
			ListenPeerURLs: []string{"http://127.0.0.1:0"}, AdvertisePeerURLs: []string{self},
			InitialCluster: map[string][]string{"e": {self}}, InitialClusterState: state,
			InitialClusterToken: "discovery-token", AutoCompactionMode: "periodic", AutoCompactionRetention: "0",
			Client:            server.ClientOptions{Limits: server.Limits{MaxRequestBytes: 1 << 20, MaxTxnOps: 128}},
			HeartbeatInterval: 10 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond,
			Discover: discover,
		}
	}
	counting := func(calls *int, cluster map[string][]string) func() (map[string][]string, error) {
		return func() (map[string][]string, error) { *calls++; return cluster, nil }
	}
	one := map[string][]string{"e": {self}}
	serve := func(t *testing.T, cfg Config) {
		t.Helper()
		m, err := Start(cfg)
		if err != nil {
			t.Fatalf("start: %v", err)
		}
		defer func() { _ = m.Stop() }()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("empty data dir, then restart", func(t *testing.T) {
		dataDir := filepath.Join(t.TempDir(), "data")
		calls := 0
		serve(t, config(dataDir, "new", counting(&calls, one)))
		if calls != 1 {
			t.Fatalf("Discover called %d times on an empty data directory, want 1", calls)
		}
		id, _, err := datadir.ReadID(vfs.Default, dataDir)
		if err != nil || id.MemberID != datadir.MemberID([]string{self}, "discovery-token") {
			t.Fatalf("identity %+v, %v: want the ID from the discovery token", id, err)
		}
		serve(t, config(dataDir, "new", counting(&calls, one)))
		if calls != 1 {
			t.Errorf("Discover called again on restart (%d calls)", calls)
		}
	})
	t.Run("existing on an empty data dir", func(t *testing.T) {
		calls := 0
		_, err := Start(config(filepath.Join(t.TempDir(), "data"), "existing", counting(&calls, one)))
		if err == nil || !strings.Contains(err.Error(), "discovery URL should not be set when joining existing initial cluster") || calls != 0 {
			t.Fatalf("error %v after %d calls, want etcd's refusal before discovery", err, calls)
		}
	})
	t.Run("identity recorded, raft log empty", func(t *testing.T) {
		dataDir := filepath.Join(t.TempDir(), "data")
		id, err := datadir.BootstrapID("e", one, "discovery-token")
		if err != nil {
			t.Fatal(err)
		}
		if err := datadir.MkdirAllSynced(vfs.Default, dataDir); err != nil {
			t.Fatal(err)
		}
		if err := datadir.WriteID(vfs.Default, dataDir, id); err != nil {
			t.Fatal(err)
		}
		calls := 0
		other := map[string][]string{"e": {self}, "f": {"http://127.0.0.1:2390"}}
		if _, err := Start(config(dataDir, "new", counting(&calls, other))); err == nil || calls != 1 ||
			!strings.Contains(err.Error(), "but the data directory records cluster") {
			t.Fatalf("error %v after %d calls, want a refusal of a different cluster", err, calls)
		}
		serve(t, config(dataDir, "new", counting(&calls, one)))
		if calls != 2 {
			t.Errorf("Discover called %d times in all, want 2", calls)
		}
	})
	t.Run("discovery fails", func(t *testing.T) {
		errFull := errors.New("failed to join discovery cluster (discovery: cluster is full)")
		_, err := Start(config(filepath.Join(t.TempDir(), "data"), "new", func() (map[string][]string, error) { return nil, errFull }))
		if !errors.Is(err, errFull) {
			t.Fatalf("error %v, want discovery's", err)
		}
	})
}
