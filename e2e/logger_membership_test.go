package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-kv/strata/internal/testutil"
	"github.com/strata-kv/strata/logger"
)

// TestLoggerMembership: a logger joined to a cluster of three publishes its
// name and marked client URL through raft, so that `etcdctl member list`
// shows it as a learner with its name, and `etcdctl member promote` of it
// is refused (FailedPrecondition) on the leader and on a follower alike;
// it leaves with `etcdctl member remove` and `strata logger leave`.
func TestLoggerMembership(t *testing.T) {
	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, strata), Size: 3})
	lp := startLogger(t)
	addLoggerTo(t, c, lp)
	lp.Launch()
	st := lp.waitCommit(t, memberCommit(t, c), 30*time.Second)
	id := fmt.Sprintf("%x", st.MemberID)

	ctl := func(endpoint string, args ...string) testutil.Result {
		t.Helper()
		full := append([]string{"--endpoints=" + endpoint, "--command-timeout=5s"}, args...)
		return testutil.RunToExit(t, 20*time.Second, "", nil, bins.Etcdctl, full...)
	}
	// The attributes arrive through raft: wait for them, bounded.
	marked := lp.clientURL + "/strata-logger"
	deadline := time.Now().Add(20 * time.Second)
	var line string
	for {
		res := ctl(c.Endpoints()[0], "member", "list")
		if res.Code != 0 {
			t.Fatalf("etcdctl member list: %d %s", res.Code, res.Stderr)
		}
		line = ""
		for _, l := range strings.Split(res.Stdout, "\n") {
			if strings.HasPrefix(l, id+",") {
				line = l
			}
		}
		if strings.Contains(line, "L1") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("member list never showed the logger %s with its name: %q\n%s", id, line, res.Stdout)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// etcdctl's simple format: ID, status, name, peer URLs, client URLs, is learner.
	if want := id + ", started, L1, " + lp.peerURL + ", " + marked + ", true"; line != want {
		t.Fatalf("member list line %q, want %q", line, want)
	}
	// The marked client URL still reaches the logger API.
	if out, err := runStrata(t, "logger", "status", "--endpoint="+marked); err != nil || !strings.Contains(out, fmt.Sprintf("%x", st.ClusterID)) {
		t.Fatalf("strata logger status --endpoint %s: %v\n%s", marked, err, out)
	}
	for _, ep := range c.Endpoints() {
		res := ctl(ep, "member", "promote", id)
		if res.Code == 0 || !strings.Contains(res.Stderr, "FailedPrecondition") ||
			!strings.Contains(res.Stderr, "can not promote a strata logger member") {
			t.Fatalf("member promote of the logger at %s: exit %d, %q; want FailedPrecondition naming the logger", ep, res.Code, res.Stderr)
		}
	}
	res := ctl(c.Endpoints()[0], "member", "list")
	if !strings.Contains(res.Stdout, id+", started, L1, "+lp.peerURL+", "+marked+", true") {
		t.Fatalf("after the refused promotions the logger is no longer a learner:\n%s", res.Stdout)
	}

	// Leaving: member remove, then strata logger leave with the logger
	// stopped (refused while it runs).
	if res := ctl(c.Endpoints()[0], "member", "remove", id); res.Code != 0 {
		t.Fatalf("etcdctl member remove of the logger: %d %s", res.Code, res.Stderr)
	}
	if res := ctl(c.Endpoints()[0], "member", "list"); strings.Contains(res.Stdout, id+",") {
		t.Fatalf("the logger is still listed after member remove:\n%s", res.Stdout)
	}
	cid := fmt.Sprintf("%x", st.ClusterID)
	if out, err := runStrata(t, "logger", "leave", "--data-dir="+lp.dir, "--cluster-id="+cid); err == nil || !strings.Contains(out, "stop the logger first") {
		t.Fatalf("strata logger leave with the logger running: %v, %q; want a refusal", err, out)
	}
	lp.Stop()
	if out, err := runStrata(t, "logger", "leave", "--data-dir="+lp.dir, "--cluster-id="+cid); err != nil {
		t.Fatalf("strata logger leave: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(lp.dir, "clusters", cid)); !os.IsNotExist(err) {
		t.Fatalf("the cluster's directory after leave: %v", err)
	}
}

// waitLoggerPublished waits (bounded) until the cluster's member list shows
// the logger lp with its marked client URL: from then on the members know
// it for a logger.
func waitLoggerPublished(t *testing.T, c *testutil.Cluster, lp *loggerProc) {
	t.Helper()
	cli := c.Client(t)
	defer cli.Close()
	marked := lp.clientURL + "/strata-logger"
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := cli.MemberList(ctx)
		cancel()
		if err == nil {
			for _, m := range resp.Members {
				if len(m.ClientURLs) == 1 && m.ClientURLs[0] == marked {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the logger's attributes never reached the member list: %v %v", resp, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestLoggerRetention: with --logger-retention the leader keeps its log
// until the logger acknowledged it, so a logger SIGSTOPped while the
// members write 1000 entries with --snapshot-count=200 catches up from the
// log when resumed: no gap, the whole log from index 1, Recover of all of
// it. The same run without the option records a gap.
func TestLoggerRetention(t *testing.T) {
	whole := func(t *testing.T, st *logger.ClusterStatus, lp *loggerProc, commit uint64) {
		t.Helper()
		if len(st.Gaps) != 0 || st.FirstIndex != 1 {
			t.Fatalf("with --logger-retention the logger has gaps %v and holds from %d; want none and the whole log", st.Gaps, st.FirstIndex)
		}
		ents, err := lp.recover(t, st.ClusterID, 1, commit)
		if err != nil || uint64(len(ents)) != commit {
			t.Fatalf("recover [1, %d]: %d entries, %v", commit, len(ents), err)
		}
		for i, e := range ents {
			if e.GetIndex() != uint64(i+1) {
				t.Fatalf("entry %d has index %d", i, e.GetIndex())
			}
		}
	}
	t.Run("on", func(t *testing.T) {
		st, lp, commit := pauseLoggerUnderWrites(t, "--logger-retention")
		whole(t, st, lp, commit)
	})
	// Log compaction rewrites applied entries into batch files every 50
	// entries: the same bound holds it (logcompact invariant 6).
	t.Run("on, log compaction", func(t *testing.T) {
		st, lp, commit := pauseLoggerUnderWrites(t, "--logger-retention", "--log-compaction", "--log-compaction-batch=50")
		whole(t, st, lp, commit)
	})
	t.Run("off", func(t *testing.T) {
		st, _, _ := pauseLoggerUnderWrites(t)
		if len(st.Gaps) == 0 || st.FirstIndex == 1 {
			t.Fatalf("without --logger-retention the logger caught up without a gap (%+v): the test shows nothing", st)
		}
	})
}

// pauseLoggerUnderWrites runs a cluster of three (--snapshot-count=200,
// --snapshot-catchup-entries=10, and the extra flags) with a logger,
// SIGSTOPs the logger for 1000 puts, resumes it, and returns its status
// once it caught up with the cluster's commit index.
func pauseLoggerUnderWrites(t *testing.T, extra ...string) (*logger.ClusterStatus, *loggerProc, uint64) {
	t.Helper()
	flags := append([]string{"--snapshot-count=200", "--snapshot-catchup-entries=10"}, extra...)
	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, strata), Size: 3, Flags: flags})
	cli := c.Client(t)
	defer cli.Close()
	lp := startLogger(t)
	addLoggerTo(t, c, lp)
	lp.Launch()
	st := lp.waitCommit(t, memberCommit(t, c), 30*time.Second)
	waitLoggerPublished(t, c, lp)
	heldBefore := st.LastIndex

	lp.Pause()
	for i := 0; i < 1000; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := cli.Put(ctx, fmt.Sprintf("k/%d", i), "v")
		cancel()
		if err != nil {
			lp.Resume()
			t.Fatalf("put %d with the logger SIGSTOPped: %v", i, err)
		}
	}
	lp.Resume()
	commit := memberCommit(t, c)
	st = lp.waitCommit(t, commit, 60*time.Second)
	t.Logf("held %d before the pause; after it: %+v", heldBefore, st)
	return st, lp, commit
}

// TestLoggerMetricsHealth: the logger's client URL serves /metrics (its
// per-cluster metrics, read from the running logger) and /health (etcd's
// JSON, 200 while the cluster's leader is heard, 503 once the cluster is
// gone) beside its gRPC API.
func TestLoggerMetricsHealth(t *testing.T) {
	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, strata), Size: 3})
	cli := c.Client(t)
	defer cli.Close()
	lp := startLogger(t)
	addLoggerTo(t, c, lp)
	lp.Launch()
	// The logger publishes its attributes through the cluster's log once it
	// runs; wait for that entry, or it may land between the Status read
	// below and the /metrics scrape and move last_index past st.LastIndex.
	waitLoggerPublished(t, c, lp)
	for i := 0; i < 20; i++ {
		if _, err := cli.Put(context.Background(), fmt.Sprintf("k/%d", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	st := lp.waitCommit(t, memberCommit(t, c), 30*time.Second)
	httpGet := func(path string) (int, string) {
		t.Helper()
		hc := &http.Client{Timeout: 5 * time.Second}
		resp, err := hc.Get(lp.clientURL + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	code, body := httpGet("/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	label := fmt.Sprintf(`{cluster_id="%x"}`, st.ClusterID)
	after, err := lp.status()
	if err != nil {
		t.Fatalf("Status after /metrics: %v", err)
	}
	// The last index the metric reports lies between the logger's Status
	// before and after the scrape: equal to both unless an entry arrived.
	lastIndex, ok := metricValue(body, "strata_logger_last_index"+label)
	if !ok || lastIndex < st.LastIndex || lastIndex > after.LastIndex {
		t.Errorf("/metrics: strata_logger_last_index%s = %d (found %v), want within [%d, %d]", label, lastIndex, ok, st.LastIndex, after.LastIndex)
	}
	for _, want := range []string{
		"strata_logger_first_index" + label + " 1",
		"strata_logger_gaps_total" + label + " 0",
		"strata_logger_has_leader" + label + " 1",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "strata_logger_entries_logged_total"+label) || strings.HasPrefix(line, "strata_logger_logged_bytes_total"+label) ||
			strings.HasPrefix(line, "strata_logger_fsyncs_total"+label) {
			if strings.HasSuffix(line, " 0") {
				t.Errorf("/metrics: %q after 20 puts", line)
			}
		}
	}
	if code, body := httpGet("/health"); code != 200 || strings.TrimSpace(body) != `{"health":"true","reason":""}` {
		t.Fatalf("/health with the cluster up: %d %s", code, body)
	}
	// The API still answers on the same port.
	if _, err := lp.status(); err != nil {
		t.Fatalf("Status beside /metrics: %v", err)
	}
	for _, m := range c.Members {
		m.Kill()
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, body := httpGet("/health")
		if code == 503 && strings.Contains(body, `"health":"false"`) && strings.Contains(body, fmt.Sprintf("%x (no leader heard for", st.ClusterID)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/health with every member killed: %d %s; want 503 naming the cluster", code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// metricValue returns the value of the sample named name (with its labels)
// in a Prometheus text exposition, if it is there. The exposition writes
// large values in exponent form (1e+06), so it is parsed as a float.
func metricValue(body, name string) (uint64, bool) {
	for _, line := range strings.Split(body, "\n") {
		if v, found := strings.CutPrefix(line, name+" "); found {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return uint64(f), err == nil && f >= 0
		}
	}
	return 0, false
}

// TestLoggerTwoLoggers: a cluster of three with two loggers (seed 003's
// k+1 = 2): the second is added as a learner beside the first (a logger
// does not take etcd's one learner place), both are listed with their
// names, both hold the whole log, and their logs are equal entry for entry.
func TestLoggerTwoLoggers(t *testing.T) {
	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, strata), Size: 3})
	cli := c.Client(t)
	defer cli.Close()
	l1, l2 := startLogger(t), startLogger(t)
	addNamedLoggerTo(t, c, l1, "L1")
	l1.Launch()
	waitLoggerPublished(t, c, l1)
	addNamedLoggerTo(t, c, l2, "L2")
	l2.Launch()
	waitLoggerPublished(t, c, l2)
	for i := 0; i < 100; i++ {
		if _, err := cli.Put(context.Background(), fmt.Sprintf("k/%d", i), fmt.Sprintf("v%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	commit := memberCommit(t, c)
	var logs [2][]*raftpb.Entry
	for i, lp := range []*loggerProc{l1, l2} {
		st := lp.waitCommit(t, commit, 30*time.Second)
		if st.FirstIndex != 1 || len(st.Gaps) != 0 {
			t.Fatalf("logger %d holds from %d with gaps %v", i+1, st.FirstIndex, st.Gaps)
		}
		ents, err := lp.recover(t, st.ClusterID, 1, commit)
		if err != nil || uint64(len(ents)) != commit {
			t.Fatalf("logger %d: recover [1, %d]: %d entries, %v", i+1, commit, len(ents), err)
		}
		logs[i] = ents
	}
	for i := range logs[0] {
		a, b := logs[0][i], logs[1][i]
		if a.GetIndex() != b.GetIndex() || a.GetTerm() != b.GetTerm() || !bytes.Equal(a.GetData(), b.GetData()) {
			t.Fatalf("entry %d differs: %v / %v", i+1, a, b)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, m := range resp.Members {
		if m.IsLearner {
			names[m.Name] = true
		}
	}
	if len(names) != 2 || !names["L1"] || !names["L2"] {
		t.Fatalf("learners listed: %v, want L1 and L2", names)
	}
}

// TestLoggerRetentionLeaderChange: with --logger-retention, a logger
// SIGSTOPped for 1000 puts while the leadership moves to another member
// still catches up with no gap: the followers too kept their log for it
// (they learn how far it holds from its Status), so the new leader's log
// reaches back to where the logger stopped. Once it caught up, every
// member truncates its log again.
func TestLoggerRetentionLeaderChange(t *testing.T) {
	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, strata), Size: 3,
		Flags: []string{"--snapshot-count=200", "--snapshot-catchup-entries=10", "--logger-retention"}})
	cli := c.Client(t)
	defer cli.Close()
	lp := startLogger(t)
	addLoggerTo(t, c, lp)
	lp.Launch()
	lp.waitCommit(t, memberCommit(t, c), 30*time.Second)
	waitLoggerPublished(t, c, lp)
	// The followers ask the logger how far it holds every second: let
	// them hear it once before it stops.
	time.Sleep(2 * time.Second)

	lp.Pause()
	put := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := cli.Put(ctx, fmt.Sprintf("k/%d", i), "v")
			cancel()
			if err != nil {
				lp.Resume()
				t.Fatalf("put %d with the logger SIGSTOPped: %v", i, err)
			}
		}
	}
	put(0, 1000)
	leader, err := c.WaitLeader(10 * time.Second)
	if err != nil {
		lp.Resume()
		t.Fatal(err)
	}
	target := c.Members[(leader+1)%3]
	lcli := c.Client(t, c.Members[leader].Endpoint())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	st, err := lcli.Status(ctx, target.Endpoint())
	if err == nil {
		_, err = lcli.MoveLeader(ctx, st.Header.MemberId)
	}
	cancel()
	lcli.Close()
	if err != nil {
		lp.Resume()
		t.Fatalf("move the leadership to %s: %v", target.Name(), err)
	}
	put(1000, 1300)
	lp.Resume()
	commit := memberCommit(t, c)
	ls := lp.waitCommit(t, commit, 60*time.Second)
	t.Logf("after the pause and the leader change: %+v", ls)
	if len(ls.Gaps) != 0 || ls.FirstIndex != 1 {
		t.Fatalf("the logger has gaps %v and holds from %d; want none and the whole log", ls.Gaps, ls.FirstIndex)
	}
	// Once the logger holds the log, every member truncates again: the
	// followers too, so they heard from the logger how far it holds (a
	// follower that never heard would keep its whole log).
	for n := 1300; ; n += 100 {
		put(n, n+100)
		lowest := uint64(1 << 62)
		for _, m := range c.Members {
			first, err := scrapeMetric(m.Endpoint()+"/metrics", "strata_raftlog_first_index")
			if err != nil {
				t.Fatal(err)
			}
			lowest = min(lowest, uint64(first))
		}
		if lowest > commit {
			t.Logf("every member's log starts past %d after %d more puts", commit, n+100-1300)
			break
		}
		if n >= 4000 {
			t.Fatalf("after %d more puts a member's log still starts at %d (the logger held up to %d)", n+100-1300, lowest, commit)
		}
	}
}

// scrapeMetric reads one unlabelled sample from a /metrics URL.
func scrapeMetric(url, name string) (float64, error) {
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("no %s in %s", name, url)
}

// TestLoggerTruncateFromMembers: members started with --logger-truncate
// send the logger their Truncate requests themselves, at their engines'
// durable index, so the logger trims its log without an operator: every
// voter's request is recorded, the log starts after the truncation point,
// Recover below it is refused and above it served.
func TestLoggerTruncateFromMembers(t *testing.T) {
	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, strata), Size: 3,
		Flags: []string{"--snapshot-count=100", "--snapshot-catchup-entries=10", "--logger-truncate"}})
	cli := c.Client(t)
	defer cli.Close()
	lp := startLogger(t)
	addLoggerTo(t, c, lp)
	lp.Launch()
	waitLoggerPublished(t, c, lp)
	for i := 0; i < 500; i++ {
		if _, err := cli.Put(context.Background(), fmt.Sprintf("k/%d", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	commit := memberCommit(t, c)
	deadline := time.Now().Add(30 * time.Second)
	var st *logger.ClusterStatus
	for {
		var err error
		st, err = lp.status()
		if err == nil && len(st.Truncations) == 3 && st.TruncationPoint > 0 && st.FirstIndex == st.TruncationPoint+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the members' truncation requests never trimmed the logger's log: %+v, %v", st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("truncated by the members' requests: %+v", st)
	if _, err := lp.recover(t, st.ClusterID, 1, commit); status.Code(err) != codes.OutOfRange {
		t.Fatalf("recover [1, %d] after the truncation: %v, want OutOfRange", commit, err)
	}
	lp.waitCommit(t, commit, 30*time.Second)
	if ents, err := lp.recover(t, st.ClusterID, st.FirstIndex, commit); err != nil || uint64(len(ents)) != commit-st.FirstIndex+1 {
		t.Fatalf("recover [%d, %d]: %d entries, %v", st.FirstIndex, commit, len(ents), err)
	}
}

// TestLoggerJoinChecksToken: `strata logger join --initial-cluster
// --initial-cluster-token` names the cluster to join by what its members
// bootstrapped with: a wrong token is refused naming it, with nothing
// recorded in the data directory; a --cluster-id that disagrees is refused
// before any endpoint is asked; the right pair joins.
func TestLoggerJoinChecksToken(t *testing.T) {
	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, strata), Size: 3})
	lp := startLogger(t)
	cli := c.Client(t)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		_, err := cli.MemberAddAsLearner(ctx, []string{lp.peerURL})
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "unhealthy cluster") || ctx.Err() != nil {
			t.Fatalf("member add --learner: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	join := func(extra ...string) (string, error) {
		return runStrata(t, append([]string{"logger", "join", "--data-dir=" + lp.dir, "--name=L1",
			"--advertise-peer-urls=" + lp.peerURL, "--endpoints=" + c.Endpoints()[0]}, extra...)...)
	}
	out, err := join("--initial-cluster="+c.InitialCluster(), "--initial-cluster-token=not-"+c.Token())
	if err == nil || !strings.Contains(out, "the endpoints answer for cluster") || !strings.Contains(out, `--initial-cluster-token "not-`+c.Token()+`"`) {
		t.Fatalf("join with a wrong token: %v\n%s", err, out)
	}
	if entries, _ := os.ReadDir(filepath.Join(lp.dir, "clusters")); len(entries) != 0 {
		t.Errorf("a refused join recorded %d clusters", len(entries))
	}
	out, err = join("--initial-cluster="+c.InitialCluster(), "--initial-cluster-token="+c.Token(), "--cluster-id=1234")
	if err == nil || !strings.Contains(out, "--cluster-id 1234 is not cluster") {
		t.Fatalf("join with a --cluster-id the token disagrees with: %v\n%s", err, out)
	}
	if out, err = join("--initial-cluster-token=" + c.Token()); err == nil || !strings.Contains(out, "go together") {
		t.Fatalf("join with a token alone: %v\n%s", err, out)
	}
	out, err = join("--initial-cluster="+c.InitialCluster(), "--initial-cluster-token="+c.Token())
	if err != nil || !strings.Contains(out, "joined cluster") {
		t.Fatalf("join with the right token: %v\n%s", err, out)
	}
}
