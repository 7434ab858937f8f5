package member

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/strata-kv/strata/apply"
	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/node"
	"github.com/strata-kv/strata/raftlog"
	"github.com/strata-kv/strata/server"
)

var mixedClusterRounds = flag.Int("mixed-cluster-rounds", 5,
	"rounds of TestPowerCutMixedCluster (a soak run uses 60 or more; from 20 on, an incremental snapshot must have been installed)")

// mixedClusterVerbose writes the members' logs to stderr as they log: a
// failure that panics in raft leaves no test output.
var mixedClusterVerbose = flag.Bool("mixed-cluster-verbose", false, "TestPowerCutMixedCluster: the members' logs on stderr")

// incrementalRequiredRounds is the run length from which the test fails if
// no incremental snapshot was installed: it then stopped a follower behind
// the leader's log a dozen times, and the configuration makes most of
// those catch up from the leader's batch files. A shorter run only logs
// the counts.
const incrementalRequiredRounds = 20

// What a round of TestPowerCutMixedCluster does to the cluster.
const (
	roundStopFollower  = iota // (a) a follower stopped until the leader's log has moved past it, restarted
	roundCutLeader            // (b) power cut of the leader
	roundCutFollower          // (b) power cut of a follower
	roundCutCatchingUp        // (b) power cut of a follower catching up after (a)'s stop
	roundCutAll               // (c) power cut of the three members at once
	roundKinds
)

var roundNames = [roundKinds]string{"stop follower", "cut leader", "cut follower", "cut catching-up follower", "cut all"}

// clusterOpTimeout bounds one operation: a proposal to a leader that
// steps down is never answered. Its outcome is then unknown to the model.
const clusterOpTimeout = 5 * time.Second

// TestPowerCutMixedCluster is TestPowerCutMixed on three members, each on
// its own file system that can lose power (cutFS over a CrashableMem),
// talking over loopback TCP. The same load (puts, deletes, txns, leases,
// compactions, through whichever member leads) runs in rounds, and each
// round does one of:
//
//   - (a) stops a follower (its files kept) while the others write on
//     until their logs start past its own, for a random while longer, and
//     restarts it: it must install a snapshot, incremental (the leader's
//     batch files cover its gap) or full (they no longer do);
//   - (b) cuts the power of one member -- the leader, a follower, or a
//     follower restarted after (a)'s stop while it catches up, around its
//     snapshot's transfer and install -- and restarts it on what survived;
//   - (c) cuts the power of all three at the same instant and restarts
//     them on what survived.
//
// After each round, once the three have applied the same index, every
// member's store is checked against the model (mixedModel.check): after
// (a) and (b) everything acknowledged, which a majority kept; after (c)
// what was acknowledged before the cut. Their revisions, every key read at
// the common revision and HashKV there must agree. (With --history latest
// a member that replayed batches has a higher compact revision, which
// HashKV depends on: the others are first compacted to it.)
//
// A run's history is full, latest or mixed; the rest of the durability
// configuration (randomDurabilityConfig, with batches and catch-up
// entries small against the engine flush interval, so that a stopped
// follower's gap is often still covered by batch files) is drawn per
// round for the members started in it. The snapshots received and
// installed of each kind are counted from the members' logs; a run of
// incrementalRequiredRounds or more fails if none was incremental.
//
// The test found a member that could not start after a power cut just after
// a snapshot install, its engine past its log's end (fixed: the install's
// record stands until the log reaches the engine; node.reconcileSnapshot);
// cuts land at any instant.
//
// Reproduce a failure with -mixed-seed (the choices are seeded, their
// timing is not); a soak run:
// go test -run TestPowerCutMixedCluster ./member/ -mixed-cluster-rounds 60
func TestPowerCutMixedCluster(t *testing.T) {
	seed := *mixedSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (-mixed-seed %d reproduces it)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	c := newTestCluster(t, seed)
	defer c.stopAll()
	model := newMixedModel()
	history := rng.IntN(len(historyNames))
	t.Logf("history: %s", historyNames[history])
	c.startAll(clusterDurabilityConfig(rng, history))

	var lastRev int64
	var kinds [roundKinds]int
	equalizedRounds := 0
	var schedule []int
	for round := 0; round < *mixedClusterRounds; round++ {
		// Every kind once in each run of five rounds, in a seeded order,
		// so that the short default run does each.
		if len(schedule) == 0 {
			schedule = rng.Perm(roundKinds)
		}
		kind := schedule[0]
		schedule = schedule[1:]
		kinds[kind]++
		c.round.Store(int64(round))
		adjust := clusterDurabilityConfig(rng, history)
		before := c.installs()
		t.Logf("round %d: %s", round, roundNames[kind])

		model.thaw()
		load := c.startLoad(model, seed, round)
		time.Sleep(time.Duration(200+rng.IntN(600)) * time.Millisecond)
		model.waitAcks(20 * time.Second)
		note := ""
		switch kind {
		case roundStopFollower:
			note = c.stopBehind(c.follower(), rng, adjust, false)
		case roundCutCatchingUp:
			note = c.stopBehind(c.follower(), rng, adjust, true)
		case roundCutLeader, roundCutFollower:
			cm := c.follower()
			if kind == roundCutLeader {
				cm = c.leader()
			}
			clone := c.cut(rng, cm)[0]
			c.stop(cm)
			// The others go on without it for a while (after a
			// leader's cut: an election).
			time.Sleep(time.Duration(rng.IntN(500)) * time.Millisecond)
			c.restart(cm, clone, adjust, true)
			note = cm.name
		case roundCutAll:
			// The model is frozen at the cut, as TestPowerCutMixed's:
			// answers after it change nothing. (cutFS makes them
			// answers about writes done before the cut, so this only
			// forgoes some checks.)
			model.mu.Lock()
			clones := c.cut(rng, c.members...)
			model.cut()
			model.mu.Unlock()
			load.stop()
			for _, cm := range c.members {
				c.stop(cm)
			}
			for i, cm := range c.members {
				c.restart(cm, clones[i], adjust, false)
			}
			for _, cm := range c.members {
				c.waitReady(cm)
			}
		}
		load.stop()
		if kind != roundCutAll {
			// The load has stopped: every answer is in. Keys with an
			// outcome unknown, or on a lease that may expire, become
			// unknown; the rest must all be on every member.
			model.mu.Lock()
			model.cut()
			model.mu.Unlock()
		}
		var equalized bool
		lastRev, equalized = c.checkRound(model, lastRev)
		if equalized {
			equalizedRounds++
		}
		t.Logf("round %d: %s %s; snapshots: %s; revision %d, %d acknowledged operations; compact revisions brought together: %v",
			round, roundNames[kind], note, c.installs().minus(before), lastRev, model.ackCount(), equalized)
	}
	total := c.installs()
	t.Logf("%d rounds (%d stop follower, %d cut leader, %d cut follower, %d cut catching-up follower, %d cut all); "+
		"snapshots: %s; %d acknowledged operations, %d keys known at the end; history %s, compact revisions brought together in %d rounds",
		*mixedClusterRounds, kinds[roundStopFollower], kinds[roundCutLeader], kinds[roundCutFollower],
		kinds[roundCutCatchingUp], kinds[roundCutAll], total, model.ackCount(), model.known(), historyNames[history], equalizedRounds)
	if *mixedClusterRounds >= incrementalRequiredRounds && total.incremental == 0 {
		t.Fatalf("seed %d: %d rounds and no incremental snapshot installed (%s)", seed, *mixedClusterRounds, total)
	}
}

// A run's history mode: with full history the members' compact revisions
// and HashKV must agree as they are; --history latest raises a member's
// compact revision over the versions its replays dropped.
const (
	historyFull   = iota // every member, every round
	historyLatest        // every member, every round
	historyMixed         // drawn per round for the members started in it
)

var historyNames = []string{"full", "latest", "mixed"}

// clusterDurabilityConfig is randomDurabilityConfig with the engine flushed
// far less often than a batch is written: batch files cover a stopped
// follower's gap until a flush of the leader's engine passes it, so that
// a short absence ends in an incremental snapshot and a longer one in a
// full snapshot. Segments are small (16 to 256 KiB): a CrashableMem sync
// copies the whole file, and with the default 64 MiB segments the copies
// held the cluster to a hundred operations a second.
func clusterDurabilityConfig(rng *rand.Rand, history int) func(*Config) {
	base := randomDurabilityConfig(rng)
	latest := history == historyLatest || (history == historyMixed && rng.IntN(2) == 0)
	snapshotCount := uint64(300 + rng.IntN(700))
	batch := uint64(5 + rng.IntN(30))
	catchUp := uint64(10 + rng.IntN(30))
	segment := int64(16<<10) << rng.IntN(5)
	return func(cfg *Config) {
		base(cfg)
		cfg.SnapshotCount = snapshotCount
		cfg.CatchUpEntries = catchUp
		cfg.LogCompaction.BatchEntries = batch
		cfg.LogCompaction.SegmentSize = segment
		cfg.LogCompaction.HistoryLatest = latest
	}
}

// crashCfg keeps only what was synced, or in half the cases some of what
// was not too. The clone draws from a generator of its own: how many
// draws it makes depends on the files, which timing decides, and the
// test's later choices must depend on the seed alone.
func crashCfg(rng *rand.Rand) vfs.CrashCloneCfg {
	if rng.IntN(2) == 1 {
		return vfs.CrashCloneCfg{UnsyncedDataPercent: rng.IntN(100), RNG: rand.New(rand.NewPCG(rng.Uint64(), 0))}
	}
	return vfs.CrashCloneCfg{}
}

// testCluster is three members on loopback TCP, each on its own
// CrashableMem file system.
type testCluster struct {
	t     *testing.T
	seed  uint64
	round atomic.Int64
	// latest is set once a member ran with --history latest: a member
	// that replayed its batches (a restart, an incremental install) has
	// its compact revision raised over the versions they dropped, so the
	// members' compact revisions, and HashKV with them, may differ.
	latest bool

	members []*clusterMember
	load    *clusterLoad // the round's, stopped at the end of the test

	// mu guards every clusterMember's m, ctx and cancel, and store: the
	// load picks the leader under it while the test goroutine stops and
	// starts members.
	mu    sync.Mutex
	store *mvcc.Store // the store of the member started last, for Store
}

// clusterMember is one member's slot: its configuration, its file system
// and log, and the running member if any.
type clusterMember struct {
	name string
	cfg  Config
	fs   *cutFS // wraps the file system it runs on, or ran on last
	log  *memberLog
	desc string // the configuration it runs with, for the round's log

	m      *Member // nil while stopped
	ctx    context.Context
	cancel context.CancelFunc // ends the operations in flight on m, before it stops
	users  sync.WaitGroup     // operations using m
}

func newTestCluster(t *testing.T, seed uint64) *testCluster {
	c := &testCluster{t: t, seed: seed}
	// Free ports, taken all at once so that they differ, and then
	// released for the members: their peer URLs are their identity (the
	// member IDs derive from them) and must be real, since the others
	// dial them.
	var ls []net.Listener
	for range 6 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	urls := make([]string, len(ls))
	for i, l := range ls {
		urls[i] = "http://" + l.Addr().String()
		_ = l.Close()
	}
	initial := map[string][]string{}
	for i := range 3 {
		initial[fmt.Sprintf("m%d", i)] = []string{urls[2*i]}
	}
	for i := range 3 {
		name := fmt.Sprintf("m%d", i)
		ml := newMemberLog(name)
		ml.onPanic = c.panicked
		c.members = append(c.members, &clusterMember{
			name: name,
			fs:   newCutFS(vfs.NewCrashableMem(), "/data"),
			log:  ml,
			cfg: Config{
				Name:                    name,
				DataDir:                 "/data",
				ListenClientURLs:        []string{urls[2*i+1]},
				AdvertiseClientURLs:     []string{urls[2*i+1]},
				ListenPeerURLs:          []string{urls[2*i]},
				AdvertisePeerURLs:       []string{urls[2*i]},
				InitialCluster:          initial,
				InitialClusterState:     "new",
				InitialClusterToken:     "mixed-cluster-test",
				AutoCompactionMode:      "periodic",
				AutoCompactionRetention: "0",
				Client:                  server.ClientOptions{Limits: server.Limits{MaxRequestBytes: 1 << 20, MaxTxnOps: 128}},
				HeartbeatInterval:       10 * time.Millisecond,
				ElectionTimeout:         100 * time.Millisecond,
				Logger:                  ml.logger(),
			},
		})
	}
	return c
}

// fatalf fails the test with the seed and round, after the members'
// recent log lines.
func (c *testCluster) fatalf(format string, args ...any) {
	c.t.Helper()
	for _, cm := range c.members {
		c.t.Logf("%s (%s), recent log lines:\n%s", cm.name, cm.desc, cm.log.recent())
	}
	c.t.Fatalf("seed %d, round %d: %s", c.seed, c.round.Load(), fmt.Sprintf(format, args...))
}

// panicked runs when a member's logger writes at DPanic level or above:
// raft is about to panic on one of the member's goroutines, which ends
// the test binary before the test can report anything, its t.Logf lines
// included. So the seed, the round and every member's recent lines go to
// stderr first.
func (c *testCluster) panicked(name, msg string) {
	var b strings.Builder
	fmt.Fprintf(&b, "TestPowerCutMixedCluster: seed %d, round %d: %s panics: %s\n", c.seed, c.round.Load(), name, msg)
	for _, cm := range c.members {
		fmt.Fprintf(&b, "%s, recent log lines:\n%s\n", cm.name, cm.log.recent())
	}
	_, _ = os.Stderr.WriteString(b.String())
}

// restart starts cm on mem with adjust's configuration, and waits until it
// serves if wait is set.
func (c *testCluster) restart(cm *clusterMember, mem *vfs.MemFS, adjust func(*Config), wait bool) {
	c.t.Helper()
	cfg := cm.cfg
	adjust(&cfg)
	fs := newCutFS(mem, cfg.DataDir)
	cfg.FS = fs
	cm.log.restarted()
	m, err := Start(cfg)
	if err != nil {
		c.fatalf("start %s: %v", cm.name, err)
	}
	c.latest = c.latest || cfg.LogCompaction.HistoryLatest
	cm.desc = fmt.Sprintf("snapshot count %d, catch-up %d, segment %d KiB, log compaction batch %d, history latest %v, %s recovery, auto-compaction %q",
		cfg.SnapshotCount, cfg.CatchUpEntries, cfg.LogCompaction.SegmentSize>>10, cfg.LogCompaction.BatchEntries, cfg.LogCompaction.HistoryLatest,
		cfg.LogCompaction.RecoveryStrategy, cfg.AutoCompactionRetention)
	c.mu.Lock()
	cm.fs, cm.m, c.store = fs, m, m.Store()
	cm.ctx, cm.cancel = context.WithCancel(context.Background())
	c.mu.Unlock()
	if wait {
		c.waitReady(cm)
	}
}

// startAll starts the three members of a new cluster.
func (c *testCluster) startAll(adjust func(*Config)) {
	c.t.Helper()
	for _, cm := range c.members {
		c.restart(cm, cm.fs.mem, adjust, false)
	}
	for _, cm := range c.members {
		c.waitReady(cm)
	}
}

// cut cuts the power of members at one instant and returns what survives
// on each.
func (c *testCluster) cut(rng *rand.Rand, members ...*clusterMember) []*vfs.MemFS {
	for _, cm := range members {
		cm.fs.lock()
	}
	clones := make([]*vfs.MemFS, len(members))
	for i, cm := range members {
		clones[i] = cm.fs.mem.CrashClone(crashCfg(rng))
	}
	for _, cm := range members {
		cm.fs.unlock()
	}
	return clones
}

// waitReady waits until cm has a leader and has applied what the cluster
// had committed (for a member behind the leader's log: until it has
// installed a snapshot).
func (c *testCluster) waitReady(cm *clusterMember) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cm.m.WaitReady(ctx); err != nil {
		c.fatalf("%s not ready: %v (fatal error: %v)", cm.name, err, cm.m.Err())
	}
}

// stop ends the operations in flight on cm and stops it, its files kept,
// and returns the index it had applied.
func (c *testCluster) stop(cm *clusterMember) uint64 {
	c.t.Helper()
	c.mu.Lock()
	m := cm.m
	cm.m = nil
	if m != nil {
		cm.cancel()
	}
	c.mu.Unlock()
	if m == nil {
		return 0
	}
	cm.users.Wait()
	if err := m.Stop(); err != nil {
		if !cm.fs.isCut() {
			c.fatalf("stop %s: %v", cm.name, err)
		}
		// After a cut, closing the log may fail, as a write may have
		// failed the member already.
		c.t.Logf("stop %s after its power cut: %v", cm.name, err)
	}
	// The applier has stopped.
	return m.applier.AppliedIndex()
}

// stopAll stops the load and every running member (at the end, or after
// a failure).
func (c *testCluster) stopAll() {
	if c.load != nil {
		c.load.stop()
	}
	for _, cm := range c.members {
		c.mu.Lock()
		m := cm.m
		cm.m = nil
		if m != nil {
			cm.cancel()
		}
		c.mu.Unlock()
		if m != nil {
			cm.users.Wait()
			_ = m.Stop()
		}
	}
}

// acquire returns the running member of cm, if any, and the context of
// its run; release must be called once it is no longer used, since stop
// waits for that before stopping it.
// REQUIRES: c.mu held.
func (cm *clusterMember) acquire() (m *Member, ctx context.Context, release func()) {
	if cm.m == nil {
		return nil, nil, nil
	}
	cm.users.Add(1)
	return cm.m, cm.ctx, cm.users.Done
}

// leaderMember returns the member that takes itself for the leader, if
// one runs, acquired.
func (c *testCluster) leaderMember() (*Member, context.Context, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cm := range c.members {
		if cm.m != nil && cm.m.Leader() == cm.m.MemberID() {
			return cm.acquire()
		}
	}
	return nil, nil, nil
}

// Propose hands req to the leader, waiting for one while there is none.
// A proposal raft refused (no leader, or a leader stepping down) never
// entered a log and is made again; any other failure is the answer: the
// proposal may still be applied, so the model holds its outcome unknown.
//
// Only a member that takes itself for the leader is asked, so that raft
// does not forward the proposal: a forwarded proposal still queued when
// its client has given up could be applied after the client's next
// operation on the same key, out of the order the model assumes.
// (A proposal made just as its member steps down is forwarded; it is
// delivered or dropped within milliseconds on loopback, far less than
// clusterOpTimeout.)
func (c *testCluster) Propose(ctx context.Context, req *pb.InternalRaftRequest) (apply.Result, error) {
	for {
		if m, mctx, release := c.leaderMember(); m != nil {
			opCtx, cancel := context.WithTimeout(mctx, clusterOpTimeout)
			stop := context.AfterFunc(ctx, cancel)
			res, err := m.Propose(opCtx, req)
			stop()
			cancel()
			release()
			if !errors.Is(err, node.ErrNoLeader) && !errors.Is(err, raft.ErrProposalDropped) {
				if err != nil && ctx.Err() != nil {
					err = ctx.Err()
				}
				return res, err
			}
		}
		select {
		case <-ctx.Done():
			return apply.Result{}, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Store is a running member's store, for the compactor's aim (its
// revision and compact revision, atomics that stay readable after a stop).
func (c *testCluster) Store() *mvcc.Store {
	c.mu.Lock()
	defer c.mu.Unlock()
	var s *mvcc.Store
	for _, cm := range c.members {
		if cm.m != nil {
			s = cm.m.Store()
			if cm.m.Leader() == cm.m.MemberID() {
				break
			}
		}
	}
	if s == nil {
		// Every member stopped (a cut of all): any store will do, the
		// compactor's proposal will wait.
		s = c.store
	}
	return s
}

// leader waits for a leader among the running members and returns it.
func (c *testCluster) leader() *clusterMember {
	c.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		c.mu.Lock()
		for _, cm := range c.members {
			if cm.m != nil && cm.m.Leader() == cm.m.MemberID() {
				c.mu.Unlock()
				return cm
			}
		}
		c.mu.Unlock()
	}
	c.fatalf("no leader after 30 s")
	return nil
}

// follower returns a running member that is not the leader.
func (c *testCluster) follower() *clusterMember {
	c.t.Helper()
	l := c.leader()
	for _, cm := range c.members {
		if cm != l && cm.m != nil {
			return cm
		}
	}
	c.fatalf("no follower running")
	return nil
}

// clusterLoad is the workers and the compactor of a round.
type clusterLoad struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startLoad starts TestPowerCutMixed's load, through the leader.
func (c *testCluster) startLoad(model *mixedModel, seed uint64, round int) *clusterLoad {
	ctx, cancel := context.WithCancel(context.Background())
	l := &clusterLoad{cancel: cancel}
	c.load = l
	for w := range 4 {
		wrng := rand.New(rand.NewPCG(seed, uint64(round*16+w)))
		l.wg.Go(func() { model.work(ctx, c, wrng, w) })
	}
	crng := rand.New(rand.NewPCG(seed, uint64(round*16+15)))
	l.wg.Go(func() { model.compact(ctx, c, crng) })
	return l
}

// stop ends the load and waits until every answer is in (it may be called
// again).
func (l *clusterLoad) stop() {
	l.cancel()
	l.wg.Wait()
}

// appliedIndex is cm's applied index, 0 if it is not running.
func (c *testCluster) appliedIndex(cm *clusterMember) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cm.m == nil {
		return 0
	}
	return cm.m.applier.AppliedIndex()
}

// logsPast says whether every running member's raft log starts after
// index+1, so that a member whose log ends at index needs a snapshot from
// any of them; and, if gone is set, whether their batch files no longer
// cover index+1 either, so that it needs a full one.
func (c *testCluster) logsPast(index uint64, gone bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cm := range c.members {
		if cm.m == nil {
			continue
		}
		first, err := cm.m.log.FirstIndex()
		if err != nil || first <= index+1 {
			return false
		}
		if !gone {
			continue
		}
		_, files, err := cm.m.log.OpenCompactedBatches(index)
		if err != nil {
			return false
		}
		covered := len(files) > 0 && files[0].First <= index+1
		raftlog.CloseBatchFiles(files)
		if covered {
			return false
		}
	}
	return true
}

// stopBehind is (a): it stops the follower cm, lets the load run until
// the others' logs start past its own (and, at random, for a while more,
// or until their batch files no longer cover its gap), and restarts it,
// which must then install a snapshot. With cut set it is the (b) case of
// a member catching up: the follower's power is cut at a random instant
// after the restart (within 20 ms of its receiving a snapshot, or in the
// first 300 ms), and it is restarted on what survived. It returns what
// happened, for the round's log.
func (c *testCluster) stopBehind(cm *clusterMember, rng *rand.Rand, adjust func(*Config), cut bool) string {
	c.t.Helper()
	stoppedAt := c.stop(cm)
	last := c.lastLogIndex(cm)
	hold, extra := rng.IntN(3), time.Duration(rng.IntN(1000))*time.Millisecond
	start := time.Now()
	passed := waitUntil(30*time.Second, func() bool { return c.logsPast(last, false) })
	switch {
	case !passed:
	case hold == 1:
		time.Sleep(extra)
	case hold == 2:
		waitUntil(10*time.Second, func() bool { return c.logsPast(last, true) })
	}
	note := fmt.Sprintf("%s stopped at applied index %d, log %d, for %v (logs past it: %v, hold %d)",
		cm.name, stoppedAt, last, time.Since(start).Round(time.Millisecond), passed, hold)
	before := cm.log.counts()
	if !cut {
		c.restart(cm, cm.fs.mem, adjust, true)
		// Every member's log starts after its last entry: whichever
		// leads had to send it a snapshot. (The node logs the install
		// once the log has restarted after it, which may be just after
		// the member is ready.)
		installed := func() bool {
			n := cm.log.counts().minus(before)
			return n.incremental+n.full+n.finished > 0
		}
		if passed && !waitUntil(10*time.Second, installed) {
			c.fatalf("%s, restarted behind the others' logs, is ready without installing a snapshot (%s)", cm.name, note)
		}
		return note
	}
	c.restart(cm, cm.fs.mem, adjust, false)
	if rng.IntN(4) == 0 {
		// Early: during its log replay, its election or the transfer.
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
	} else {
		// Around the install: a snapshot is staged once received and
		// installed within milliseconds.
		waitUntil(20*time.Second, func() bool { return cm.log.counts().received > before.received })
		time.Sleep(time.Duration(rng.IntN(20000)) * time.Microsecond)
	}
	atCut := cm.log.counts().minus(before)
	clone := c.cut(rng, cm)[0]
	c.stop(cm)
	c.restart(cm, clone, adjust, true)
	return note + fmt.Sprintf("; cut after %s", atCut)
}

// lastLogIndex is the highest entry index in the raft log of cm, stopped.
// (An entry a conflict superseded may count: it is an upper bound.)
func (c *testCluster) lastLogIndex(cm *clusterMember) uint64 {
	c.t.Helper()
	_, last := c.logBounds(cm, cm.fs.mem)
	return last
}

// logBounds is the snapshot point and the highest entry index of cm's raft
// log on mem, cm not running there.
func (c *testCluster) logBounds(cm *clusterMember, mem *vfs.MemFS) (snap, last uint64) {
	c.t.Helper()
	infos, err := raftlog.Inspect(mem, []string{cm.cfg.DataDir + "/log"})
	if err != nil {
		c.fatalf("inspect the log of %s: %v", cm.name, err)
	}
	for _, in := range infos {
		snap = max(snap, in.SnapshotIndex)
		last = max(last, in.LastIndex)
	}
	return snap, last
}

// waitUntil polls cond until it holds or timeout passes, and says which.
func waitUntil(timeout time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(timeout); ; time.Sleep(5 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// installs sums the members' snapshot counts.
func (c *testCluster) installs() snapCounts {
	var sum snapCounts
	for _, cm := range c.members {
		n := cm.log.counts()
		sum.received += n.received
		sum.incremental += n.incremental
		sum.full += n.full
		sum.finished += n.finished
		sum.ahead += n.ahead
	}
	return sum
}

// snapCounts counts snapshots a member received and installed.
type snapCounts struct {
	received    int // staged: "received snapshot", "received incremental snapshot"
	incremental int // installed: "installed incremental snapshot" and the node's "installed snapshot"
	full        int // installed: the node's "installed snapshot" alone
	finished    int // interrupted between the engine and the log by a cut, finished at start-up
	// ahead counts restarts whose engine an install had left past the
	// log's end: raft started from the log's snapshot point.
	ahead int
}

func (n snapCounts) minus(o snapCounts) snapCounts {
	return snapCounts{n.received - o.received, n.incremental - o.incremental, n.full - o.full, n.finished - o.finished, n.ahead - o.ahead}
}

func (n snapCounts) String() string {
	return fmt.Sprintf("%d received, %d incremental and %d full installed, %d finished at a restart, %d restarts with the engine past the log's end",
		n.received, n.incremental, n.full, n.finished, n.ahead)
}

// memberState is what one member holds at the common revision.
type memberState struct {
	hash       uint32
	compactRev int64
	kvs        string
}

// checkRound waits until the three members have applied the same index,
// checks each against the model and against each other, and returns their
// revision and whether it had to compact them to one compact revision
// first.
func (c *testCluster) checkRound(model *mixedModel, lastRev int64) (rev int64, equalized bool) {
	c.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if time.Now().After(deadline) {
			var idx []uint64
			for _, cm := range c.members {
				idx = append(idx, c.appliedIndex(cm))
			}
			c.fatalf("the members' applied indexes are still %v after 60 s", idx)
		}
		for _, cm := range c.members {
			if err := cm.m.Err(); err != nil {
				c.fatalf("%s stopped on a fatal error: %v", cm.name, err)
			}
		}
		index, ok := c.sameApplied()
		if !ok {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		var revs []int64
		for _, cm := range c.members {
			revs = append(revs, cm.m.Store().Rev())
		}
		rev := slices.Min(revs)
		states := make([]memberState, len(c.members))
		for i, cm := range c.members {
			if err := model.check(cm.m.Store(), lastRev); err != nil {
				c.fatalf("%s: %v", cm.name, err)
			}
			states[i] = c.stateAt(cm, rev)
		}
		// A lease expiring (its revocation) or a late compaction moved a
		// member during the reads: read again.
		if again, ok := c.sameApplied(); !ok || again != index {
			continue
		}
		if slices.Max(revs) != rev {
			c.fatalf("at applied index %d the members' revisions are %v", index, revs)
		}
		var compactRevs []int64
		for i, st := range states {
			compactRevs = append(compactRevs, st.compactRev)
			if st.kvs != states[0].kvs {
				a, b := c.members[0], c.members[i]
				c.fatalf("at revision %d (applied index %d) %s and %s hold different keys:\n%s: %s\n%s: %s",
					rev, index, a.name, b.name, a.name, states[0].kvs, b.name, st.kvs)
			}
		}
		if top := slices.Max(compactRevs); slices.Min(compactRevs) != top {
			// HashKV hashes every version above the compact revision
			// and each key's newest one at or below it: members at
			// different compact revisions hash differently. Only
			// --history latest makes them differ: a member that
			// replayed batches has its compact revision raised over the
			// versions they dropped, and reads at or above it answer as
			// after etcd's compaction there. So the others are
			// compacted there too, and then they must hash the same.
			if !c.latest {
				c.fatalf("at revision %d (applied index %d), without --history latest, the compact revisions are %v",
					rev, index, compactRevs)
			}
			if equalized {
				c.fatalf("at revision %d (applied index %d), after a compaction at %d, the compact revisions are %v",
					rev, index, top, compactRevs)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			res, err := c.Propose(ctx, &pb.InternalRaftRequest{Compaction: &pb.CompactionRequest{Revision: top}})
			cancel()
			if err != nil || (res.Err != nil && !errors.Is(res.Err, mvcc.ErrCompacted)) {
				c.fatalf("compaction at %d, to bring the compact revisions %v together: %v %v", top, compactRevs, err, res.Err)
			}
			equalized = true
			continue
		}
		for i, st := range states[1:] {
			if st.hash != states[0].hash {
				c.fatalf("HashKV at revision %d (applied index %d, compact revision %d): %s %08x, %s %08x",
					rev, index, st.compactRev, c.members[0].name, states[0].hash, c.members[i+1].name, st.hash)
			}
		}
		return rev, equalized
	}
}

// sameApplied returns the members' applied index if they all have the
// same one.
func (c *testCluster) sameApplied() (uint64, bool) {
	first := c.appliedIndex(c.members[0])
	for _, cm := range c.members[1:] {
		if c.appliedIndex(cm) != first {
			return 0, false
		}
	}
	return first, true
}

// stateAt reads cm's HashKV and every key at rev.
func (c *testCluster) stateAt(cm *clusterMember, rev int64) memberState {
	c.t.Helper()
	s := cm.m.Store()
	hash, _, compactRev, err := s.HashKV(rev)
	if err != nil {
		c.fatalf("%s: HashKV at %d: %v", cm.name, rev, err)
	}
	resp, err := s.Range(&pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: rev})
	if err != nil {
		c.fatalf("%s: read every key at %d: %v", cm.name, rev, err)
	}
	var b strings.Builder
	for _, kv := range resp.Kvs {
		fmt.Fprintf(&b, "%s=%s c%d m%d v%d l%d ", kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease)
	}
	return memberState{hash: hash, compactRev: compactRev, kvs: b.String()}
}

// memberLog is a member's logger, across its restarts: it keeps the
// recent lines, for a failure's report, and counts the snapshots
// received and installed.
type memberLog struct {
	name    string // the member's logger's name
	onPanic func(name, msg string)
	mu      sync.Mutex
	lines   []string // the newest last
	n       snapCounts
	// pendingInc: the applier logged an incremental install whose
	// node-side "installed snapshot" line has not come yet.
	pendingInc bool
}

const memberLogLines = 60

func newMemberLog(name string) *memberLog { return &memberLog{name: name} }

// logger returns a zap logger writing to ml.
func (ml *memberLog) logger() *zap.Logger {
	enc := zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	core := zapcore.NewCore(enc, zapcore.AddSync(ml), zapcore.InfoLevel)
	if *mixedClusterVerbose {
		core = zapcore.NewTee(core, zapcore.NewCore(enc, zapcore.Lock(os.Stderr), zapcore.InfoLevel))
	}
	return zap.New(zapcore.RegisterHooks(core, ml.hook)).Named(ml.name)
}

// Write keeps one encoded line.
func (ml *memberLog) Write(p []byte) (int, error) {
	ml.mu.Lock()
	defer ml.mu.Unlock()
	ml.lines = append(ml.lines, strings.TrimRight(string(p), "\n"))
	if len(ml.lines) > 2*memberLogLines {
		ml.lines = slices.Clone(ml.lines[len(ml.lines)-memberLogLines:])
	}
	return len(p), nil
}

// hook counts the installs: the applier logs "installed incremental
// snapshot" just before the node logs "installed snapshot" for it; a node
// line without one is a full install.
func (ml *memberLog) hook(e zapcore.Entry) error {
	if e.Level >= zapcore.DPanicLevel && ml.onPanic != nil {
		ml.onPanic(ml.name, e.Message)
	}
	ml.mu.Lock()
	defer ml.mu.Unlock()
	switch e.Message {
	case "received snapshot", "received incremental snapshot":
		// The member's lines, not the transport's "received snapshot"
		// for the same stream.
		if e.LoggerName == ml.name {
			ml.n.received++
		}
	case "installed incremental snapshot":
		ml.n.incremental++
		ml.pendingInc = true
	case "installed snapshot":
		if !ml.pendingInc {
			ml.n.full++
		}
		ml.pendingInc = false
	case "restarting the raft log after a snapshot the state machine installed before a crash or stop":
		// An install the cut interrupted between the engine and the
		// log, finished at start-up.
		ml.n.finished++
	case "the state machine is past the raft log's end after a snapshot install; raft restarts from the log's snapshot point":
		ml.n.ahead++
	}
	return nil
}

// restarted forgets an install cut short by a stop.
func (ml *memberLog) restarted() {
	ml.mu.Lock()
	ml.pendingInc = false
	ml.mu.Unlock()
}

func (ml *memberLog) counts() snapCounts {
	ml.mu.Lock()
	defer ml.mu.Unlock()
	return ml.n
}

func (ml *memberLog) recent() string {
	ml.mu.Lock()
	defer ml.mu.Unlock()
	return strings.Join(ml.lines[max(0, len(ml.lines)-memberLogLines):], "\n")
}

// errPowerCut is what a member's writes get once its power is cut.
var errPowerCut = errors.New("power cut")

// cutFS is a member's file system in TestPowerCutMixedCluster: a
// CrashableMem whose power can be cut while the member still runs. The
// test clones the file system at the cut (what survives) and stops the
// member afterwards; meanwhile the member must not make a promise that
// depends on a write the clone lacks. A follower acknowledging entries it
// synced after the clone, or a leader counting them, made the cluster
// believe in copies that the restart lost (raft then panics: "tocommit(26)
// is out of range [lastIndex(25)]", or commits on one real copy). So from
// the cut on every write outside the engine fails -- the raft log, whose
// fsyncs are what raft's messages and the client's answers wait for, the
// staged snapshots -- and a write runs whole before the cut or not at all.
// The engine's writes go on: its files after the cut are not in the clone,
// and the engine makes no promise by itself (the log's truncation after
// its flush is a log write); failing them would stop Pebble on a failed
// MANIFEST write, which exits the process.
type cutFS struct {
	vfs.FS
	mem       *vfs.MemFS
	engineDir string
	// mu is held for reading by each write while it runs, and for
	// writing by the cut.
	mu  sync.RWMutex
	cut bool
}

func newCutFS(mem *vfs.MemFS, dataDir string) *cutFS {
	return &cutFS{FS: mem, mem: mem, engineDir: dataDir + "/engine"}
}

// lock cuts the power: no write runs from now on, until the member is
// restarted on another file system. The cut is held until unlock, during
// which the caller clones mem (for all three members, at one instant).
func (fs *cutFS) lock() {
	fs.mu.Lock()
	fs.cut = true
}

func (fs *cutFS) unlock() { fs.mu.Unlock() }

func (fs *cutFS) isCut() bool {
	fs.mu.RLock()
	defer fs.mu.RUnlock()
	return fs.cut
}

// write runs op, a write to path, unless the power is cut.
func (fs *cutFS) write(path string, op func() error) error {
	if path == fs.engineDir || strings.HasPrefix(path, fs.engineDir+"/") {
		return op()
	}
	fs.mu.RLock()
	defer fs.mu.RUnlock()
	if fs.cut {
		return errPowerCut
	}
	return op()
}

func (fs *cutFS) wrap(path string, f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	return &cutFile{File: f, fs: fs, path: path}, nil
}

func (fs *cutFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	var f vfs.File
	err := fs.write(name, func() (err error) {
		f, err = fs.FS.Create(name, category)
		return err
	})
	return fs.wrap(name, f, err)
}

func (fs *cutFS) Link(oldname, newname string) error {
	return fs.write(newname, func() error { return fs.FS.Link(oldname, newname) })
}

func (fs *cutFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.Open(name, opts...)
	return fs.wrap(name, f, err)
}

func (fs *cutFS) OpenReadWrite(name string, category vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	var f vfs.File
	err := fs.write(name, func() (err error) {
		f, err = fs.FS.OpenReadWrite(name, category, opts...)
		return err
	})
	return fs.wrap(name, f, err)
}

func (fs *cutFS) OpenDir(name string) (vfs.File, error) {
	f, err := fs.FS.OpenDir(name)
	return fs.wrap(name, f, err)
}

func (fs *cutFS) Remove(name string) error {
	return fs.write(name, func() error { return fs.FS.Remove(name) })
}

func (fs *cutFS) RemoveAll(name string) error {
	return fs.write(name, func() error { return fs.FS.RemoveAll(name) })
}

func (fs *cutFS) Rename(oldname, newname string) error {
	return fs.write(newname, func() error { return fs.FS.Rename(oldname, newname) })
}

func (fs *cutFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	var f vfs.File
	err := fs.write(newname, func() (err error) {
		f, err = fs.FS.ReuseForWrite(oldname, newname, category)
		return err
	})
	return fs.wrap(newname, f, err)
}

func (fs *cutFS) MkdirAll(dir string, perm os.FileMode) error {
	return fs.write(dir, func() error { return fs.FS.MkdirAll(dir, perm) })
}

func (fs *cutFS) Unwrap() vfs.FS { return fs.mem }

// cutFile is a file of a cutFS: its writes and syncs stop at the cut.
type cutFile struct {
	vfs.File
	fs   *cutFS
	path string
}

func (f *cutFile) Write(p []byte) (n int, err error) {
	err = f.fs.write(f.path, func() (err error) {
		n, err = f.File.Write(p)
		return err
	})
	return n, err
}

func (f *cutFile) WriteAt(p []byte, off int64) (n int, err error) {
	err = f.fs.write(f.path, func() (err error) {
		n, err = f.File.WriteAt(p, off)
		return err
	})
	return n, err
}

func (f *cutFile) Preallocate(offset, length int64) error {
	return f.fs.write(f.path, func() error { return f.File.Preallocate(offset, length) })
}

func (f *cutFile) Sync() error {
	return f.fs.write(f.path, f.File.Sync)
}

func (f *cutFile) SyncData() error {
	return f.fs.write(f.path, f.File.SyncData)
}

func (f *cutFile) SyncTo(length int64) (fullSync bool, err error) {
	err = f.fs.write(f.path, func() (err error) {
		fullSync, err = f.File.SyncTo(length)
		return err
	})
	return fullSync, err
}
