// The driver below follows etcd's tests/robustness/main_test.go at the pinned
// version (testRobustness and runScenario are not exported there, and that
// package has only test files, so it cannot be imported). Copyright 2022 The
// etcd Authors, Apache License 2.0. What differs: the scenarios are a fixed,
// short list that every binary can run (no gofail, no last-release binary, no
// LazyFS), and the failpoint of each is named instead of drawn at random.

package robustness

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-semver/semver"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/storage/datadir"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.etcd.io/etcd/tests/v3/framework/e2e"
	"go.etcd.io/etcd/tests/v3/robustness/client"
	"go.etcd.io/etcd/tests/v3/robustness/failpoint"
	"go.etcd.io/etcd/tests/v3/robustness/identity"
	"go.etcd.io/etcd/tests/v3/robustness/model"
	"go.etcd.io/etcd/tests/v3/robustness/report"
	"go.etcd.io/etcd/tests/v3/robustness/scenarios"
	"go.etcd.io/etcd/tests/v3/robustness/traffic"
	"go.etcd.io/etcd/tests/v3/robustness/validate"
	"go.etcd.io/raft/v3/raftpb"
)

var assumeVersion = flag.String("assume-version", "3.7.3",
	"the etcd version to assume for a binary whose --version prints no 'etcd Version:' line (strata); "+
		"the suite uses it to choose flag spellings")

var strataWAL = flag.Bool("strata-wal", true,
	"for a member with no etcd WAL (strata), export its raft log with `etcd inspect log --entries` "+
		"into an etcd WAL so that the watch and serializable-read validations run")

var (
	waitBeforeFailpoint = time.Second
	waitJitter          = 200 * time.Millisecond
	waitAfterFailpoint  = time.Second
)

func TestMain(m *testing.M) {
	e2e.InitFlags()
	// The suite's certificates sit in its module, found relative to the
	// working directory by default; point at the module's copy instead.
	if _, err := os.Stat(e2e.CertPath); err != nil {
		out, lerr := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "go.etcd.io/etcd/tests/v3").Output()
		if lerr != nil {
			fmt.Fprintf(os.Stderr, "locating go.etcd.io/etcd/tests/v3: %v\n", lerr)
			os.Exit(2)
		}
		setCertDir(filepath.Join(strings.TrimSpace(string(out)), "fixtures"))
	}
	orig := e2e.GetVersionFromBinary
	e2e.GetVersionFromBinary = func(path string) (*semver.Version, error) {
		v, err := orig(path)
		if err == nil {
			return v, nil
		}
		if _, serr := os.Stat(path); serr != nil {
			return nil, err
		}
		return semver.NewVersion(*assumeVersion)
	}
	os.Exit(m.Run())
}

func setCertDir(dir string) {
	e2e.CertDir = dir
	e2e.CertPath = dir + "/server.crt"
	e2e.PrivateKeyPath = dir + "/server.key.insecure"
	e2e.CaPath = dir + "/ca.crt"
	e2e.RevokedCertPath = dir + "/server-revoked.crt"
	e2e.RevokedPrivateKeyPath = dir + "/server-revoked.key.insecure"
	e2e.CrlPath = dir + "/revoke.crl"
	e2e.CertPath2 = dir + "/server2.crt"
	e2e.PrivateKeyPath2 = dir + "/server2.key.insecure"
	e2e.CertPath3 = dir + "/server3.crt"
	e2e.PrivateKeyPath3 = dir + "/server3.key.insecure"
}

// robustnessScenarios is the list run by TestRobustness: the suite's traffic
// profiles (etcd's scenarios.Exploratory) on clusters of one and three
// members, each with a failpoint that needs nothing inside the binary: a
// SIGKILL and restart, or the peer proxy dropping a member's traffic.
func robustnessScenarios() []scenarios.TestScenario {
	single := func(opts ...e2e.EPClusterOption) e2e.EtcdProcessClusterConfig {
		base := []e2e.EPClusterOption{
			e2e.WithClusterSize(1),
			e2e.WithSnapshotCount(100),
			e2e.WithWatchProcessNotifyInterval(100 * time.Millisecond),
		}
		return *e2e.NewConfig(append(base, opts...)...)
	}
	triple := func(opts ...e2e.EPClusterOption) e2e.EtcdProcessClusterConfig {
		base := []e2e.EPClusterOption{
			e2e.WithClusterSize(3),
			e2e.WithSnapshotCount(100),
			e2e.WithWatchProcessNotifyInterval(100 * time.Millisecond),
			e2e.WithIsPeerTLS(true),
			e2e.WithPeerProxy(true),
		}
		return *e2e.NewConfig(append(base, opts...)...)
	}
	etcdHigh := traffic.Profile{KeyValue: &traffic.KeyValueHigh, Watch: &traffic.WatchDefault, Compaction: &traffic.CompactionDefault}
	etcdMedium := traffic.Profile{KeyValue: &traffic.KeyValueMedium, Watch: &traffic.WatchDefault, Compaction: &traffic.CompactionDefault}
	return []scenarios.TestScenario{
		{Name: "EtcdHighTraffic/ClusterOfSize1/Kill", Traffic: traffic.EtcdPut, Profile: etcdHigh, Failpoint: failpoint.KillFailpoint, Cluster: single()},
		{Name: "EtcdTrafficDeleteLeases/ClusterOfSize1/Kill", Traffic: traffic.EtcdPutDeleteLease, Profile: etcdMedium, Failpoint: failpoint.KillFailpoint, Cluster: single()},
		{Name: "KubernetesHighTraffic/ClusterOfSize1/Kill", Traffic: traffic.Kubernetes, Profile: etcdHigh, Failpoint: failpoint.KillFailpoint, Cluster: single()},
		{Name: "EtcdHighTraffic/ClusterOfSize3/Kill", Traffic: traffic.EtcdPut, Profile: etcdHigh, Failpoint: failpoint.KillFailpoint, Cluster: triple()},
		{Name: "KubernetesLowTraffic/ClusterOfSize3/BlackholePeerNetwork", Traffic: traffic.Kubernetes, Profile: etcdMedium, Failpoint: failpoint.BlackholePeerNetwork, Cluster: triple()},
		{Name: "EtcdTrafficDeleteLeases/ClusterOfSize3/DelayPeerNetwork", Traffic: traffic.EtcdPutDeleteLease, Profile: etcdMedium, Failpoint: failpoint.DelayPeerNetwork, Cluster: triple()},
	}
}

func TestRobustness(t *testing.T) {
	e2e.BeforeTest(t)
	for _, s := range robustnessScenarios() {
		t.Run(s.Name, func(t *testing.T) {
			lg := zaptest.NewLogger(t)
			s.Cluster.Logger = lg
			ctx := t.Context()
			c, err := e2e.NewEtcdProcessCluster(ctx, t, e2e.WithConfig(&s.Cluster))
			require.NoError(t, err)
			defer forcestopCluster(c)
			require.NoError(t, failpoint.Validate(c, s.Failpoint, s.Profile))
			testRobustness(ctx, t, lg, s, c)
		})
	}
}

func testRobustness(ctx context.Context, t *testing.T, lg *zap.Logger, s scenarios.TestScenario, c *e2e.EtcdProcessCluster) {
	r, err := report.NewTestReport(lg, testResultsDirectory(t), report.ServerDataPaths(c), &report.TrafficDetail{ExpectUniqueRevision: s.Traffic.ExpectUniqueRevision()})
	require.NoError(t, err)
	panicked := true
	defer func() {
		if err := r.Finalize(t.Failed(), panicked); err != nil {
			t.Error(err)
		}
	}()
	clientReports := runScenario(ctx, t, s, lg, c)
	r.SetClientReports(clientReports)
	if err := r.SaveEtcdData(); err != nil {
		t.Error(err)
	}

	validateConfig := validate.Config{ExpectRevisionUnique: s.Traffic.ExpectUniqueRevision()}
	// The watch and stale-read validations replay the requests found in
	// the members' etcd WAL (member/wal under each data dir), and the
	// linearizability check uses them to bound failed writes. strata has
	// no etcd WAL: its raft log's entries are exported
	// (`strata inspect log --entries`) and written as an etcd WAL in a
	// scratch dir per member, which the suite then reads as it reads
	// etcd's. With -strata-wal=false (or if the export fails) the list
	// stays empty and the suite validates linearizability only.
	var persistedRequests []model.EtcdRequest
	switch {
	case hasWAL(c):
		persistedRequests, err = report.PersistedRequestsCluster(lg, c)
	case *strataWAL:
		var dirs []string
		if dirs, err = exportStrataWALs(t, lg, c); err == nil {
			persistedRequests, err = report.PersistedRequests(lg, dirs)
		}
		if err != nil {
			err = fmt.Errorf("rebuilding history from strata's raft log: %w", err)
		}
	default:
		t.Logf("NOTE: no etcd WAL and -strata-wal=false: watch and serializable-read validation skipped, linearizability only")
	}
	if err != nil {
		t.Error(err)
	}
	t.Logf("persisted requests: %d", len(persistedRequests))
	result := validate.ValidateAndReturnVisualize(lg, validateConfig, clientReports, persistedRequests, 5*time.Minute)
	if err := result.Error(); err != nil {
		t.Error(err)
	} else {
		r.SetVisualizer(result.Linearization.Visualize)
	}
	panicked = false
}

func runScenario(ctx context.Context, t *testing.T, s scenarios.TestScenario, lg *zap.Logger, clus *e2e.EtcdProcessCluster) []report.ClientReport {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g := errgroup.Group{}
	var failpointClientReport []report.ClientReport
	failpointInjected := make(chan report.FailpointInjection, 1)

	baseTime := time.Now()
	ids := identity.NewIDProvider()
	g.Go(func() error {
		defer close(failpointInjected)
		time.Sleep(randomizeTime(waitBeforeFailpoint, waitJitter))
		fr, err := failpoint.Inject(ctx, t, lg, clus, s.Failpoint, baseTime, ids)
		if err != nil {
			t.Error(err)
			cancel()
		}
		time.Sleep(randomizeTime(waitAfterFailpoint, waitJitter))
		if fr != nil {
			failpointInjected <- fr.FailpointInjection
			failpointClientReport = fr.Client
		}
		return nil
	})
	trafficSet := client.NewSet(ids, baseTime)
	defer trafficSet.Close()
	maxRevisionChan := make(chan int64, 1)
	g.Go(func() error {
		defer close(maxRevisionChan)
		operationReport := traffic.SimulateTraffic(ctx, t, lg, clus, s.Profile, s.Traffic, failpointInjected, trafficSet)
		maxRevision := report.OperationsMaxRevision(operationReport)
		maxRevisionChan <- maxRevision
		lg.Info("Finished simulating Traffic", zap.Int64("max-revision", maxRevision))
		return nil
	})
	watchSet := client.NewSet(ids, baseTime)
	defer watchSet.Close()
	g.Go(func() error {
		endpoints := make([]string, 0, len(clus.Procs))
		for _, proc := range clus.Procs {
			endpoints = append(endpoints, proc.EndpointsGRPC()[0])
		}
		return client.CollectClusterWatchEvents(ctx, client.CollectClusterWatchEventsParam{
			Lg:              lg,
			Endpoints:       endpoints,
			MaxRevisionChan: maxRevisionChan,
			ClientSet:       watchSet,
		})
	})
	if err := g.Wait(); err != nil {
		t.Error(err)
	}
	if err := client.CheckEndOfTestHashKV(ctx, clus); err != nil {
		t.Error(err)
	}
	return slices.Concat(trafficSet.Reports(), watchSet.Reports(), failpointClientReport)
}

// hasWAL reports whether any member's data dir holds an etcd WAL.
func hasWAL(c *e2e.EtcdProcessCluster) bool {
	for _, p := range c.Procs {
		if _, err := os.Stat(filepath.Join(p.Config().DataDirPath, "member", "wal")); err == nil {
			return true
		}
	}
	return false
}

// exportStrataWALs runs `<binary> inspect log --data-dir D --entries` for
// each member and writes the entries and HardState it prints as an etcd WAL
// under a scratch data dir, returning those dirs for report.PersistedRequests.
func exportStrataWALs(t *testing.T, lg *zap.Logger, c *e2e.EtcdProcessCluster) ([]string, error) {
	var dirs []string
	for i, p := range c.Procs {
		cfg := p.Config()
		out, err := exec.Command(cfg.ExecPath, "inspect", "log", "--data-dir", cfg.DataDirPath, "--entries").Output()
		if err != nil {
			return nil, fmt.Errorf("%s inspect log --entries (member %s): %w", cfg.ExecPath, cfg.Name, err)
		}
		var exp struct {
			HardState struct{ Term, Vote, Commit uint64 } `json:"hard_state"`
			Entries   []struct {
				Index, Term uint64
				Type        int32
				Data        []byte
			} `json:"entries"`
		}
		if err := json.Unmarshal(out, &exp); err != nil {
			return nil, fmt.Errorf("decoding member %s's entries: %w", cfg.Name, err)
		}
		ents := make([]*raftpb.Entry, 0, len(exp.Entries))
		checkpoints := 0
		for _, e := range exp.Entries {
			data := e.Data
			if raftpb.EntryType(e.Type) == raftpb.EntryNormal && isLeaseCheckpoint(data) {
				// strata checkpoints lease TTLs through raft always; etcd
				// only with its LeaseCheckpoint feature gate, and the
				// suite's WAL reader panics on one ("Unhandled raft
				// request"). A checkpoint changes no key: it stands in the
				// exported history as an empty entry.
				data = nil
				checkpoints++
			}
			ents = append(ents, &raftpb.Entry{Index: proto.Uint64(e.Index), Term: proto.Uint64(e.Term), Type: raftpb.EntryType(e.Type).Enum(), Data: data})
		}
		if checkpoints > 0 {
			t.Logf("member %s: %d lease checkpoint entries exported as empty entries", cfg.Name, checkpoints)
		}
		first := uint64(0)
		if len(ents) > 0 {
			first = ents[0].GetIndex()
		}
		t.Logf("member %s: %d raft entries from index %d exported from strata's log, commit %d", cfg.Name, len(ents), first, exp.HardState.Commit)
		dir := filepath.Join(t.TempDir(), fmt.Sprintf("member-%d", i))
		w, err := wal.Create(lg, datadir.ToWALDir(dir), nil)
		if err != nil {
			return nil, err
		}
		hs := &raftpb.HardState{Term: proto.Uint64(exp.HardState.Term), Vote: proto.Uint64(exp.HardState.Vote), Commit: proto.Uint64(exp.HardState.Commit)}
		if err := w.Save(hs, ents); err != nil {
			w.Close()
			return nil, err
		}
		if err := w.Close(); err != nil {
			return nil, err
		}
		dirs = append(dirs, dir)
	}
	return dirs, nil
}

// isLeaseCheckpoint reports whether a normal entry's data is a lease
// checkpoint request.
func isLeaseCheckpoint(data []byte) bool {
	if len(data) == 0 {
		return false
	}
	var req pb.InternalRaftRequest
	return proto.Unmarshal(data, &req) == nil && req.LeaseCheckpoint != nil
}

func randomizeTime(base, jitter time.Duration) time.Duration {
	return base - jitter + time.Duration(rand.Int63n(int64(jitter)*2))
}

func forcestopCluster(clus *e2e.EtcdProcessCluster) error {
	for _, member := range clus.Procs {
		member.Kill()
	}
	return clus.ConcurrentStop()
}

func testResultsDirectory(t *testing.T) string {
	dir, ok := os.LookupEnv("RESULTS_DIR")
	if !ok {
		dir = os.TempDir()
	}
	dir, err := filepath.Abs(dir)
	require.NoError(t, err)
	path := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_"), fmt.Sprintf("%v", time.Now().UnixNano()))
	require.NoError(t, os.RemoveAll(path))
	require.NoError(t, os.MkdirAll(path, 0o700))
	return path
}
