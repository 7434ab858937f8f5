// The suite's own driver (tests/robustness/main_test.go) is unexported and
// lives in test files, so it cannot be imported; this file drives the
// suite's exported parts (traffic, failpoints, watch collection, report,
// validation) itself, with a fixed, short list of scenarios that any binary
// can run (no gofail, no last-release binary, no LazyFS), each naming its
// failpoint instead of drawing one at random.

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
	"strconv"
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
	trafficpkg "go.etcd.io/etcd/tests/v3/robustness/traffic"
	"go.etcd.io/etcd/tests/v3/robustness/validate"
	"go.etcd.io/raft/v3/raftpb"
)

var assumeVersion = flag.String("assume-version", "3.7.3",
	"the etcd version to assume for a binary whose --version prints no 'etcd Version:' line (strata); "+
		"the suite uses it to choose flag spellings")

var strataWAL = flag.Bool("strata-wal", true,
	"for a member with no etcd WAL (strata), export its raft log with `etcd inspect log --entries` "+
		"into an etcd WAL so that the watch and serializable-read validations run")

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
	etcdHigh := trafficpkg.Profile{KeyValue: &trafficpkg.KeyValueHigh, Watch: &trafficpkg.WatchDefault, Compaction: &trafficpkg.CompactionDefault}
	etcdMedium := trafficpkg.Profile{KeyValue: &trafficpkg.KeyValueMedium, Watch: &trafficpkg.WatchDefault, Compaction: &trafficpkg.CompactionDefault}
	return []scenarios.TestScenario{
		{Name: "EtcdHighTraffic/ClusterOfSize1/Kill", Traffic: trafficpkg.EtcdPut, Profile: etcdHigh, Failpoint: failpoint.KillFailpoint, Cluster: single()},
		{Name: "EtcdTrafficDeleteLeases/ClusterOfSize1/Kill", Traffic: trafficpkg.EtcdPutDeleteLease, Profile: etcdMedium, Failpoint: failpoint.KillFailpoint, Cluster: single()},
		{Name: "KubernetesHighTraffic/ClusterOfSize1/Kill", Traffic: trafficpkg.Kubernetes, Profile: etcdHigh, Failpoint: failpoint.KillFailpoint, Cluster: single()},
		{Name: "EtcdHighTraffic/ClusterOfSize3/Kill", Traffic: trafficpkg.EtcdPut, Profile: etcdHigh, Failpoint: failpoint.KillFailpoint, Cluster: triple()},
		{Name: "KubernetesLowTraffic/ClusterOfSize3/BlackholePeerNetwork", Traffic: trafficpkg.Kubernetes, Profile: etcdMedium, Failpoint: failpoint.BlackholePeerNetwork, Cluster: triple()},
		{Name: "EtcdTrafficDeleteLeases/ClusterOfSize3/DelayPeerNetwork", Traffic: trafficpkg.EtcdPutDeleteLease, Profile: etcdMedium, Failpoint: failpoint.DelayPeerNetwork, Cluster: triple()},
	}
}

// TestRobustness runs each scenario on a fresh cluster of the binary under
// test. A scenario is three concurrent activities over one shared clock and
// request-ID space (trial): clients send the scenario's traffic, a watcher on
// every member follows all keys until the traffic's last revision, and the
// failpoint fires once, a second (with jitter) after the start. Then the
// members must agree on HashKV, and the recorded history must pass the
// suite's checks: linearizable, watch events complete and in order, and
// serializable reads consistent with it.
func TestRobustness(t *testing.T) {
	e2e.BeforeTest(t)
	for _, s := range robustnessScenarios() {
		t.Run(s.Name, func(t *testing.T) {
			lg := zaptest.NewLogger(t)
			s.Cluster.Logger = lg
			c, err := e2e.NewEtcdProcessCluster(t.Context(), t, e2e.WithConfig(&s.Cluster))
			require.NoError(t, err)
			defer killCluster(c)
			require.NoError(t, failpoint.Validate(c, s.Failpoint, s.Profile))
			tr := &trial{t: t, lg: lg, scenario: s, cluster: c, start: time.Now(), ids: identity.NewIDProvider()}
			tr.runAndCheck(t.Context())
		})
	}
}

// trial is one scenario's run on one cluster.
type trial struct {
	t        *testing.T
	lg       *zap.Logger
	scenario scenarios.TestScenario
	cluster  *e2e.EtcdProcessCluster
	// start is the time every client report counts from; ids hands out
	// the request and client IDs of all three activities, so their reports
	// merge into one history.
	start time.Time
	ids   identity.Provider
}

// runAndCheck runs the trial and checks what it recorded. The suite's
// report keeps the members' data and the history when the test fails, or
// when the check panics (deferred Finalize with panicked still true).
func (tr *trial) runAndCheck(ctx context.Context) {
	t := tr.t
	rep, err := report.NewTestReport(tr.lg, resultsDir(t), report.ServerDataPaths(tr.cluster),
		&report.TrafficDetail{ExpectUniqueRevision: tr.scenario.Traffic.ExpectUniqueRevision()})
	require.NoError(t, err)
	panicked := true
	defer func() {
		if err := rep.Finalize(t.Failed(), panicked); err != nil {
			t.Error(err)
		}
	}()
	history := tr.run(ctx)
	rep.SetClientReports(history)
	if err := rep.SaveEtcdData(); err != nil {
		t.Error(err)
	}
	persisted := tr.persistedRequests()
	t.Logf("persisted requests: %d", len(persisted))
	cfg := validate.Config{ExpectRevisionUnique: tr.scenario.Traffic.ExpectUniqueRevision()}
	result := validate.ValidateAndReturnVisualize(tr.lg, cfg, history, persisted, 5*time.Minute)
	if err := result.Error(); err != nil {
		t.Error(err)
	} else {
		rep.SetVisualizer(result.Linearization.Visualize)
	}
	panicked = false
}

// run starts the three activities and returns every client's report once
// all have ended. The traffic stops a second after the failpoint has been
// injected (it is told through injected) and then tells the watchers the
// highest revision it saw (through lastRev), so that they stop once they
// have seen it.
func (tr *trial) run(ctx context.Context) []report.ClientReport {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	injected := make(chan report.FailpointInjection, 1)
	lastRev := make(chan int64, 1)
	traffic := client.NewSet(tr.ids, tr.start)
	defer traffic.Close()
	watchers := client.NewSet(tr.ids, tr.start)
	defer watchers.Close()
	var failpointReports []report.ClientReport
	var g errgroup.Group
	g.Go(func() error {
		defer close(injected)
		fr := tr.injectFailpoint(ctx)
		if fr == nil {
			cancel()
			return nil
		}
		injected <- fr.FailpointInjection
		failpointReports = fr.Client
		return nil
	})
	g.Go(func() error {
		defer close(lastRev)
		ops := trafficpkg.SimulateTraffic(ctx, tr.t, tr.lg, tr.cluster, tr.scenario.Profile, tr.scenario.Traffic, injected, traffic)
		rev := report.OperationsMaxRevision(ops)
		tr.lg.Info("traffic ended", zap.Int64("max-revision", rev))
		lastRev <- rev
		return nil
	})
	g.Go(func() error {
		var endpoints []string
		for _, p := range tr.cluster.Procs {
			endpoints = append(endpoints, p.EndpointsGRPC()[0])
		}
		return client.CollectClusterWatchEvents(ctx, client.CollectClusterWatchEventsParam{
			Lg: tr.lg, Endpoints: endpoints, MaxRevisionChan: lastRev, ClientSet: watchers,
		})
	})
	if err := g.Wait(); err != nil {
		tr.t.Error(err)
	}
	if err := client.CheckEndOfTestHashKV(ctx, tr.cluster); err != nil {
		tr.t.Error(err)
	}
	return slices.Concat(traffic.Reports(), watchers.Reports(), failpointReports)
}

// injectFailpoint waits about a second, fires the scenario's failpoint and
// waits about a second more, so that traffic runs before, during and after
// it. It returns nil (having failed the test) if the failpoint could not be
// injected.
func (tr *trial) injectFailpoint(ctx context.Context) *report.FailpointReport {
	time.Sleep(jittered(time.Second))
	fr, err := failpoint.Inject(ctx, tr.t, tr.lg, tr.cluster, tr.scenario.Failpoint, tr.start, tr.ids)
	if err != nil {
		tr.t.Error(err)
		return nil
	}
	time.Sleep(jittered(time.Second))
	return fr
}

// persistedRequests returns the requests the members' logs hold, which the
// watch and serializable-read checks replay and the linearizability check
// uses to settle writes whose client saw no answer. etcd keeps them in its
// WAL (member/wal). strata has no etcd WAL: its raft log's entries are
// exported (`strata inspect log --entries`) and written as an etcd WAL in a
// scratch dir per member, which the suite reads as it reads etcd's. With
// -strata-wal=false (or if the export fails) the list stays empty and only
// linearizability is checked.
func (tr *trial) persistedRequests() []model.EtcdRequest {
	var (
		requests []model.EtcdRequest
		err      error
	)
	switch {
	case hasWAL(tr.cluster):
		requests, err = report.PersistedRequestsCluster(tr.lg, tr.cluster)
	case *strataWAL:
		var dirs []string
		if dirs, err = exportStrataWALs(tr.t, tr.lg, tr.cluster); err == nil {
			requests, err = report.PersistedRequests(tr.lg, dirs)
		}
		if err != nil {
			err = fmt.Errorf("rebuilding history from strata's raft log: %w", err)
		}
	default:
		tr.t.Logf("NOTE: no etcd WAL and -strata-wal=false: watch and serializable-read validation skipped, linearizability only")
	}
	if err != nil {
		tr.t.Error(err)
	}
	return requests
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

// jittered returns d give or take a fifth of it.
func jittered(d time.Duration) time.Duration {
	return d - d/5 + time.Duration(rand.Int63n(int64(d)*2/5))
}

// killCluster kills every member and waits for the processes to end.
func killCluster(c *e2e.EtcdProcessCluster) error {
	for _, p := range c.Procs {
		p.Kill()
	}
	return c.ConcurrentStop()
}

// resultsDir is a fresh directory for the report of test t, under
// $RESULTS_DIR (default: the system temp dir).
func resultsDir(t *testing.T) string {
	base := os.Getenv("RESULTS_DIR")
	if base == "" {
		base = os.TempDir()
	}
	base, err := filepath.Abs(base)
	require.NoError(t, err)
	dir := filepath.Join(base, strings.ReplaceAll(t.Name(), "/", "_"), strconv.FormatInt(time.Now().UnixNano(), 10))
	require.NoError(t, os.RemoveAll(dir))
	require.NoError(t, os.MkdirAll(dir, 0o700))
	return dir
}
