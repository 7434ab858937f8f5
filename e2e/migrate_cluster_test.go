package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/strata-kv/strata/internal/testutil"
)

// The migration of a running three-member etcd cluster to strata that
// docs/operations.md ("Migrating a running etcd cluster") describes, done
// under concurrent writers that reach the cluster through one client-facing
// address, as they reach a production cluster through a load balancer.
// What the writers rely on: every write they saw acknowledged, by etcd
// before the cut-over or by strata after it, is in strata at the revision it
// was acknowledged with; revisions never go backwards across the switch;
// their lease and credentials keep working.

// Credentials of the migrated cluster. The writers authenticate as an
// application user, as clients of a cluster with auth enabled do; the
// checks read as root.
const (
	migrateRootPassword = "root-secret"
	migrateAppUser      = "app"
	migrateAppPassword  = "app-secret"
)

// The prefixes the writers write under; the application role may write
// these and nothing else.
var migratePrefixes = []string{"kv/", "txn/", "lease/"}

// Phases of the cut-over, as the writers see them. A request answered while
// the phase was still migrateOnEtcd was answered by etcd; a request sent
// once it was migrateFenced can only have been answered by strata (the
// front door cut every connection to etcd before the phase moved on, and
// dials nothing but strata afterwards). A request sent before the fence and
// answered after it may be either, and takes no part in the ordering check.
const (
	migrateOnEtcd  int32 = iota // the front door forwards to etcd
	migrateFencing              // Fence is cutting the connections to etcd
	migrateFenced               // Fence has returned: no request sent from now on reaches etcd
)

// migrateAck is one write a writer saw acknowledged.
type migrateAck struct {
	writer     string
	req        int // the writer's attempt that was acknowledged
	key, value string
	del        bool  // a delete: the key is absent at rev
	rev        int64 // the response header's revision
	// sent and answered are the cut-over phase when the request was sent
	// and when its answer arrived.
	sent, answered int32
}

// migrateLog is what the writers saw acknowledged.
//
// Concurrency: phase is set by the test goroutine and read by the writers;
// record from any writer; acks are read once every writer has returned.
type migrateLog struct {
	phase atomic.Int32
	// keepAlivesOnStrata counts lease keep-alives answered that were sent
	// after the fence.
	keepAlivesOnStrata atomic.Int64

	mu   sync.Mutex
	acks []migrateAck // guarded by mu
}

func (l *migrateLog) record(acks ...migrateAck) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.acks = append(l.acks, acks...)
}

// migrateWrite is one attempt of a writer: it returns the writes that were
// acknowledged (none for a transaction whose comparison failed) or the
// request's error.
type migrateWrite func(ctx context.Context, seq int) ([]migrateAck, error)

// write runs one writer until stop is closed: it retries failed requests
// (while the front door is fenced every request fails) and records what is
// acknowledged, with the phases around it.
func (l *migrateLog) write(name string, stop <-chan struct{}, do migrateWrite) {
	for seq := 0; ; seq++ {
		select {
		case <-stop:
			return
		default:
		}
		sent := l.phase.Load()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		acks, err := do(ctx, seq)
		cancel()
		answered := l.phase.Load()
		if err != nil {
			// Throttles the retries while the front door is fenced.
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		for i := range acks {
			acks[i].writer, acks[i].req, acks[i].sent, acks[i].answered = name, seq, sent, answered
		}
		l.record(acks...)
	}
}

func TestMigrateRunningEtcdCluster(t *testing.T) {
	for _, tc := range []struct {
		name      string
		etcdFlags []string
		// takeState takes the cut-over state from the fenced cluster's
		// leader and returns what strata restore is given.
		takeState func(t *testing.T, c *testutil.Cluster, leader int) string
		// replaysWAL: strata restore must report entries of etcd's WAL
		// replayed.
		replaysWAL bool
	}{
		{
			name: "etcdctl snapshot save",
			takeState: func(t *testing.T, c *testutil.Cluster, leader int) string {
				file := filepath.Join(t.TempDir(), "etcd.db")
				mustCtlOn(t, []string{c.Members[leader].Endpoint()}, "--user=root:"+migrateRootPassword, "snapshot", "save", file)
				return file
			},
		},
		{
			// etcd commits its database every 100 ms by default, so how
			// much of the write load only the leader's WAL holds would be
			// left to timing; with batches this large none of it is in the
			// database (bar what auth changes force), and the restore must
			// replay it all from the WAL. The members are killed, not
			// stopped: a clean stop commits the database and leaves no WAL
			// tail to replay.
			name:       "killed leader's data dir",
			etcdFlags:  []string{"--backend-batch-interval=1h", "--backend-batch-limit=1000000"},
			replaysWAL: true,
			takeState: func(t *testing.T, c *testutil.Cluster, leader int) string {
				// Followers first, so that no other member takes over and
				// the leader's log stays the last word.
				for i, m := range c.Members {
					if i != leader {
						m.Kill()
					}
				}
				c.Members[leader].Kill()
				return c.Members[leader].DataDir()
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testMigrateRunningEtcdCluster(t, tc.etcdFlags, tc.takeState, tc.replaysWAL)
		})
	}
}

func testMigrateRunningEtcdCluster(t *testing.T, etcdFlags []string, takeState func(*testing.T, *testutil.Cluster, int) string, replaysWAL bool) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	old := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, etcd), Size: 3, Flags: etcdFlags})
	setUpMigrateAuth(t, ctx, old.Client(t))
	// Read before the writers start, not at the cut-over: etcd reads users
	// and roles through raft and commits its database to answer, which
	// would leave the data-dir case no WAL tail to replay.
	etcdAuth := observeMigrateAuth(t, ctx, migrateClient(t, old.Endpoints(), "root", migrateRootPassword))

	door := newFrontDoor(t, endpointHosts(old.Endpoints()))
	log := &migrateLog{}
	app := func() *clientv3.Client {
		return migrateClient(t, []string{door.URL()}, migrateAppUser, migrateAppPassword)
	}
	lease, err := app().Grant(ctx, 60)
	if err != nil {
		t.Fatalf("lease grant through the front door: %v", err)
	}
	// A token etcd issued, to show strata refuses it in the words that make
	// clients authenticate again.
	etcdToken, err := app().Authenticate(ctx, migrateAppUser, migrateAppPassword)
	if err != nil {
		t.Fatalf("authenticate on etcd: %v", err)
	}
	// A watcher of the plain puts' prefix through the front door, as a
	// Kubernetes informer watches: its stream breaks at the fence and
	// resumes on strata from the revision after the last event it had.
	watched := watchMigrate(t, app(), "kv/", lease.Revision+1)

	// Several clients, each its own connection through the front door, so
	// that writes reach every etcd member (followers forward to the
	// leader): plain puts over a key space small enough that keys are
	// overwritten, compare-and-swap transactions as Kubernetes makes them
	// (some deleting), and puts attached to a lease kept alive.
	stop := make(chan struct{})
	var writers sync.WaitGroup
	var names []string
	spawn := func(name string, do migrateWrite) {
		names = append(names, name)
		writers.Add(1)
		go func() {
			defer writers.Done()
			log.write(name, stop, do)
		}()
	}
	for w := range 3 {
		cli, name := app(), fmt.Sprintf("put%d", w)
		rng := rand.New(rand.NewPCG(uint64(w), 1))
		spawn(name, func(ctx context.Context, seq int) ([]migrateAck, error) {
			key, value := fmt.Sprintf("kv/%03d", rng.IntN(100)), fmt.Sprintf("%s-%d", name, seq)
			resp, err := cli.Put(ctx, key, value)
			if err != nil {
				return nil, err
			}
			return []migrateAck{{key: key, value: value, rev: resp.Header.Revision}}, nil
		})
	}
	for w := range 2 {
		cli, name := app(), fmt.Sprintf("txn%d", w)
		rng := rand.New(rand.NewPCG(uint64(w), 2))
		spawn(name, func(ctx context.Context, seq int) ([]migrateAck, error) {
			key, value := fmt.Sprintf("txn/%02d", rng.IntN(10)), fmt.Sprintf("%s-%d", name, seq)
			cur, err := cli.Get(ctx, key)
			if err != nil {
				return nil, err
			}
			var mod int64
			if len(cur.Kvs) == 1 {
				mod = cur.Kvs[0].ModRevision
			}
			ops := []clientv3.Op{clientv3.OpPut(key, value), clientv3.OpPut("txn/last", value)}
			acks := []migrateAck{{key: key, value: value}, {key: "txn/last", value: value}}
			// A delete of an existing key only: deleting nothing is no
			// write, and its answer carries the revision of the last write.
			del := seq%5 == 4 && mod != 0
			if del {
				ops, acks = []clientv3.Op{clientv3.OpDelete(key)}, []migrateAck{{key: key, del: true}}
			}
			resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", mod)).Then(ops...).Commit()
			if err != nil || !resp.Succeeded {
				return nil, err // a lost race writes nothing
			}
			if n := resp.Responses[0].GetResponseDeleteRange().GetDeleted(); del && n != 1 {
				return nil, fmt.Errorf("txn deleting %q (mod revision %d, compared equal) deleted %d keys", key, mod, n)
			}
			for i := range acks {
				acks[i].rev = resp.Header.Revision
			}
			return acks, nil
		})
	}
	leaseCli := app()
	spawn("lease", func(ctx context.Context, seq int) ([]migrateAck, error) {
		key, value := fmt.Sprintf("lease/%02d", seq%20), fmt.Sprintf("lease-%d", seq)
		resp, err := leaseCli.Put(ctx, key, value, clientv3.WithLease(lease.ID))
		if err != nil {
			return nil, err
		}
		if seq%20 == 0 {
			sent := log.phase.Load()
			if _, err := leaseCli.KeepAliveOnce(ctx, lease.ID); err == nil && sent == migrateFenced {
				log.keepAlivesOnStrata.Add(1)
			}
		}
		return []migrateAck{{key: key, value: value, rev: resp.Header.Revision}}, nil
	})
	defer func() {
		// On a failure before the writers are told to stop.
		select {
		case <-stop:
		default:
			close(stop)
		}
		writers.Wait()
	}()
	writing := time.Now()
	waitMigrateWrites(t, log, names, "etcd", func(a migrateAck) bool { return a.answered == migrateOnEtcd }, nil)

	// The cut-over (docs/operations.md, "Migrating a running etcd cluster").
	// 1. Fence the writers at the front door.
	pauseStart := time.Now()
	log.phase.Store(migrateFencing)
	door.Fence()
	log.phase.Store(migrateFenced)
	// A linearizable read on the leader waits until it has applied every
	// write committed so far, acknowledged ones included, whichever member
	// answered them; its answer is the key space the cut-over carries. It
	// also makes the leader's WAL say those writes are committed: etcd
	// acknowledges a write before the HardState that commits it is synced,
	// and restore from a data directory replays only up to that HardState,
	// so a leader killed the moment after an acknowledgement would lose it.
	// The read's answer comes from a later turn of etcd's raft loop than
	// the one that synced that HardState.
	leader := migrateLeader(t, ctx, old)
	root := migrateClient(t, []string{old.Members[leader].Endpoint()}, "root", migrateRootPassword)
	atCutOver, err := root.Get(ctx, "\x00", clientv3.WithFromKey())
	if err != nil {
		t.Fatalf("read etcd's key space at the cut-over: %v", err)
	}
	etcdRev := atCutOver.Header.Revision
	// 2. Take the state from the leader; the old cluster is retired (its
	// data directories stay, as the way back).
	state := takeState(t, old, leader)
	for _, m := range old.Members {
		m.Kill()
	}
	// 3. strata restore once per member, then start the three.
	members, peerURLs := restoreMigrateCluster(t, state, replaysWAL)
	var strataEndpoints []string
	for _, m := range members {
		strataEndpoints = append(strataEndpoints, m.Endpoint())
	}
	// 4. Point the front door at strata and let the writers through.
	door.Open(endpointHosts(strataEndpoints))
	pause := time.Since(pauseStart)
	resumed := time.Now()
	waitMigrateWrites(t, log, names, "strata", func(a migrateAck) bool { return a.sent == migrateFenced },
		func() bool { return log.keepAlivesOnStrata.Load() > 0 })
	close(stop)
	writers.Wait()
	checking := time.Now()

	log.mu.Lock()
	acks := slices.Clone(log.acks)
	log.mu.Unlock()
	var onEtcd, onStrata, either int
	for _, a := range acks {
		switch {
		case a.answered == migrateOnEtcd:
			onEtcd++
		case a.sent == migrateFenced:
			onStrata++
		default:
			either++
		}
	}
	t.Logf("%d writes acknowledged: %d by etcd up to revision %d, %d by strata, %d around the fence; writes paused for %v",
		len(acks), onEtcd, etcdRev, onStrata, either, pause.Round(time.Millisecond))

	scli := migrateClient(t, strataEndpoints, "root", migrateRootPassword)
	checkMigrateRevisions(t, acks, names, etcdRev)
	checkMigrateWatch(t, watched, acks)
	checkMigrateEtcdToken(t, ctx, strataEndpoints[0], etcdToken.Token)
	checkMigrateKeySpace(t, ctx, scli, atCutOver.Kvs, etcdRev)
	checkMigrateAcks(t, ctx, members, acks)
	checkMigrateLease(t, ctx, scli, lease.ID, acks)
	if got := observeMigrateAuth(t, ctx, scli); got != etcdAuth {
		t.Errorf("auth on strata:\n%s\nwant what etcd had:\n%s", got, etcdAuth)
	}
	checkMigrateMembers(t, ctx, scli, members, peerURLs)
	checkMigrateHashKV(t, ctx, scli, members)
	t.Logf("took %v to start etcd and set up auth, %v of writes on etcd, %v of paused writes, %v of writes on strata, %v of checks",
		writing.Sub(began).Round(time.Millisecond), pauseStart.Sub(writing).Round(time.Millisecond), pause.Round(time.Millisecond),
		checking.Sub(resumed).Round(time.Millisecond), time.Since(checking).Round(time.Millisecond))
}

// migrateWatch is what one watcher received.
//
// Concurrency: the watcher goroutine appends; read under mu.
type migrateWatch struct {
	mu     sync.Mutex
	events []*clientv3.Event // guarded by mu
	errs   []string          // guarded by mu: errors the watch reported
}

// watchMigrate watches prefix from revision rev on cli until the test
// ends.
func watchMigrate(t *testing.T, cli *clientv3.Client, prefix string, rev int64) *migrateWatch {
	t.Helper()
	w := &migrateWatch{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	wch := cli.Watch(clientv3.WithRequireLeader(ctx), prefix, clientv3.WithPrefix(), clientv3.WithRev(rev))
	go func() {
		defer close(done)
		for resp := range wch {
			w.mu.Lock()
			if err := resp.Err(); err != nil && ctx.Err() == nil {
				w.errs = append(w.errs, err.Error())
			}
			w.events = append(w.events, resp.Events...)
			w.mu.Unlock()
		}
	}()
	return w
}

// checkMigrateWatch checks that the watcher, across the cut-over, received
// every acknowledged put under its prefix as an event at its revision with
// its value, and never an event twice or out of order (bounded wait for it
// to catch up).
func checkMigrateWatch(t *testing.T, w *migrateWatch, acks []migrateAck) {
	t.Helper()
	var want []migrateAck
	var last int64
	for _, a := range acks {
		if strings.HasPrefix(a.key, "kv/") {
			want = append(want, a)
			last = max(last, a.rev)
		}
	}
	var events []*clientv3.Event
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		w.mu.Lock()
		events = slices.Clone(w.events)
		w.mu.Unlock()
		if n := len(events); (n > 0 && events[n-1].Kv.ModRevision >= last) || time.Now().After(deadline) {
			break
		}
	}
	w.mu.Lock()
	if len(w.errs) > 0 {
		t.Errorf("the watch reported errors: %v", w.errs)
	}
	w.mu.Unlock()
	got := map[int64]*clientv3.Event{}
	var prev int64
	for _, ev := range events {
		// Only plain puts write under the prefix: one event a revision.
		if rev := ev.Kv.ModRevision; rev <= prev {
			t.Errorf("watch event %s %q at revision %d after one at %d: repeated or out of order", ev.Type, ev.Kv.Key, rev, prev)
		} else {
			prev = rev
		}
		got[ev.Kv.ModRevision] = ev
	}
	missing := 0
	for _, a := range want {
		ev := got[a.rev]
		if ev == nil || ev.Type != clientv3.EventTypePut || string(ev.Kv.Key) != a.key || string(ev.Kv.Value) != a.value {
			if missing++; missing <= 10 {
				t.Errorf("%s: put %q=%q acknowledged at revision %d; the watch had %v at it", a.writer, a.key, a.value, a.rev, ev)
			}
		}
	}
	if missing > 10 {
		t.Errorf("... %d acknowledged puts in all were not watched as acknowledged", missing)
	}
}

// checkMigrateEtcdToken checks that strata refuses a token etcd issued
// with etcd's "invalid auth token", the error on which clients (clientv3
// among them) authenticate again; any other answer would leave them
// failing after the cut-over.
func checkMigrateEtcdToken(t *testing.T, ctx context.Context, endpoint, token string) {
	t.Helper()
	// A bare gRPC connection: clientv3's interceptors would retry the
	// refusal for seconds and hide which error the server gave.
	conn, err := grpc.NewClient(strings.TrimPrefix(endpoint, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("gRPC client for %s: %v", endpoint, err)
	}
	defer conn.Close()
	_, err = pb.NewKVClient(conn).Put(metadata.AppendToOutgoingContext(ctx, rpctypes.TokenFieldNameGRPC, token),
		&pb.PutRequest{Key: []byte("kv/with-etcds-token"), Value: []byte("x")})
	if err = rpctypes.Error(err); !errors.Is(err, rpctypes.ErrInvalidAuthToken) {
		t.Errorf("put on strata with the token etcd issued: %v; want %v", err, rpctypes.ErrInvalidAuthToken)
	}
}

// migrateWritesEach is how many writes each writer must see acknowledged
// by etcd, then by strata: about 3,000 writes in all over both subtests.
const migrateWritesEach = 75

// waitMigrateWrites waits until every writer has seen migrateWritesEach of
// its writes that match acknowledged, and more if also is not yet true;
// it fails the test after 30 s. Counts rather than a fixed time keep the
// test short on an idle machine and its checks meaningful on a loaded one.
func waitMigrateWrites(t *testing.T, log *migrateLog, names []string, by string, match func(migrateAck) bool, also func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := map[string]int{}
		log.mu.Lock()
		for _, a := range log.acks {
			if match(a) {
				n[a.writer]++
			}
		}
		log.mu.Unlock()
		done := also == nil || also()
		for _, name := range names {
			done = done && n[name] >= migrateWritesEach
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s the writes acknowledged by %s are %v, want %d each (and a lease keep-alive on strata: %v)",
				by, n, migrateWritesEach, also == nil || also())
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
}

// migrateLeader returns the index of the member of c that leads (bounded
// wait), asked as root: with auth enabled etcd answers Status to an
// administrator only, so testutil's Cluster.WaitLeader cannot ask.
func migrateLeader(t *testing.T, ctx context.Context, c *testutil.Cluster) int {
	t.Helper()
	cli := migrateClient(t, c.Endpoints(), "root", migrateRootPassword)
	var lastErr error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for i, m := range c.Members {
			st, err := cli.Status(ctx, m.Endpoint())
			if err != nil {
				lastErr = fmt.Errorf("status of %s: %w", m.Name(), err)
				continue
			}
			if st.Leader != 0 && st.Leader == st.Header.MemberId {
				return i
			}
		}
	}
	t.Fatalf("no etcd leader at the cut-over after 10 s: %v", lastErr)
	return -1
}

// setUpMigrateAuth gives the cluster a root user, an application user whose
// role may read and write the writers' prefixes, and enables auth.
func setUpMigrateAuth(t *testing.T, ctx context.Context, cli *clientv3.Client) {
	t.Helper()
	steps := []func() error{
		func() error { _, err := cli.UserAdd(ctx, "root", migrateRootPassword); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.RoleAdd(ctx, "app-rw"); return err },
		func() error { _, err := cli.UserAdd(ctx, migrateAppUser, migrateAppPassword); return err },
		func() error { _, err := cli.UserGrantRole(ctx, migrateAppUser, "app-rw"); return err },
	}
	for _, p := range migratePrefixes {
		steps = append(steps, func() error {
			_, err := cli.RoleGrantPermission(ctx, "app-rw", p, clientv3.GetPrefixRangeEnd(p), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		})
	}
	steps = append(steps, func() error { _, err := cli.AuthEnable(ctx); return err })
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("auth set-up step %d on etcd: %v", i, err)
		}
	}
}

// observeMigrateAuth describes the users, roles and permissions, and
// whether auth is enabled.
func observeMigrateAuth(t *testing.T, ctx context.Context, cli *clientv3.Client) string {
	t.Helper()
	st, err := cli.AuthStatus(ctx)
	if err != nil {
		t.Fatalf("auth status: %v", err)
	}
	users, err := cli.UserList(ctx)
	if err != nil {
		t.Fatalf("user list: %v", err)
	}
	roles, err := cli.RoleList(ctx)
	if err != nil {
		t.Fatalf("role list: %v", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "auth enabled %v; users %v; roles %v", st.Enabled, users.Users, roles.Roles)
	for _, u := range users.Users {
		got, err := cli.UserGet(ctx, u)
		if err != nil {
			t.Fatalf("user get %s: %v", u, err)
		}
		fmt.Fprintf(&b, "; user %s roles %v", u, got.Roles)
	}
	for _, r := range roles.Roles {
		got, err := cli.RoleGet(ctx, r)
		if err != nil {
			t.Fatalf("role get %s: %v", r, err)
		}
		fmt.Fprintf(&b, "; role %s", r)
		for _, p := range got.Perm {
			fmt.Fprintf(&b, " %v[%q,%q)", p.PermType, p.Key, p.RangeEnd)
		}
	}
	return b.String()
}

// restoreMigrateCluster runs strata restore on state once per member of a
// new three-member cluster, as operations.md says (each its own name, data
// directory and peer URL; one initial cluster and token), starts the three
// and waits until each serves a read.
//
// It returns the members and each one's peer URL by name.
func restoreMigrateCluster(t *testing.T, state string, replaysWAL bool) ([]*testutil.Process, map[string]string) {
	t.Helper()
	const token = "migrated"
	var initial []string
	peerURLs := map[string]string{}
	for i, port := range testutil.FreePorts(t, 3) {
		name, u := fmt.Sprintf("s%d", i+1), fmt.Sprintf("http://127.0.0.1:%d", port)
		initial = append(initial, name+"="+u)
		peerURLs[name] = u
	}
	initialCluster := strings.Join(initial, ",")
	var members []*testutil.Process
	for i := range 3 {
		name := fmt.Sprintf("s%d", i+1)
		p := testutil.NewProcess(t, testutil.Options{
			Binary: binary(t, strata), Name: name,
			Flags: []string{"--listen-peer-urls=" + peerURLs[name], "--initial-advertise-peer-urls=" + peerURLs[name],
				"--initial-cluster=" + initialCluster, "--initial-cluster-token=" + token},
		})
		res := testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "restore",
			"--data-dir="+p.DataDir(), "--name="+name, "--initial-cluster="+initialCluster,
			"--initial-advertise-peer-urls="+peerURLs[name], "--initial-cluster-token="+token, state)
		if res.Code != 0 {
			t.Fatalf("strata restore %s for %s: exit %d\n%s%s", state, name, res.Code, res.Stdout, res.Stderr)
		}
		if i == 0 {
			t.Logf("strata restore: %s", strings.TrimSpace(res.Stdout))
		}
		if replaysWAL {
			m := regexp.MustCompile(`replayed (\d+) entries of etcd's WAL`).FindStringSubmatch(res.Stdout)
			if m == nil || m[1] == "0" {
				t.Errorf("strata restore for %s replayed no entry of etcd's WAL, whose tail holds the writes:\n%s", name, res.Stdout)
			}
		}
		members = append(members, p)
	}
	// A member cannot answer before a quorum has started: launch all, then
	// wait for each. Auth came along, so the readiness read (testutil's
	// WaitReady reads without credentials) is made as root.
	for _, m := range members {
		m.Launch()
	}
	for _, m := range members {
		cli := migrateClient(t, []string{m.Endpoint()}, "root", migrateRootPassword)
		var err error
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if _, exited := m.WaitExit(0); exited {
				t.Fatalf("restored member %s exited: %v", m.Name(), m.ExitErr())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			_, err = cli.Get(ctx, "ready-probe")
			cancel()
			if err == nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("restored member %s not ready after 30 s: %v", m.Name(), err)
		}
	}
	return members, peerURLs
}

// checkMigrateRevisions checks the revisions the writers saw: no two
// requests' writes share one, each writer's go up from one request to the
// next, across the cut-over too, and every revision strata
// acknowledged is above every one etcd acknowledged and above etcd's
// revision at the cut-over. Each writer must have been acknowledged by
// both.
func checkMigrateRevisions(t *testing.T, acks []migrateAck, names []string, etcdRev int64) {
	t.Helper()
	byRev := map[int64]migrateAck{}
	last := map[string]migrateAck{}
	seenEtcd, seenStrata := map[string]bool{}, map[string]bool{}
	var maxEtcd int64
	minStrata := int64(-1)
	for _, a := range acks {
		// A transaction's writes share its revision (and its request).
		if other, dup := byRev[a.rev]; dup && (other.writer != a.writer || other.req != a.req) {
			t.Errorf("revision %d acknowledged twice: to %s for %q and to %s for %q", a.rev, other.writer, other.key, a.writer, a.key)
		}
		byRev[a.rev] = a
		// A writer's requests are sequential, each acknowledged after the
		// one before, so their revisions rise.
		if prev, ok := last[a.writer]; ok && prev.req != a.req && a.rev <= prev.rev {
			t.Errorf("%s: revision went backwards: %q acknowledged at %d after %q at %d", a.writer, a.key, a.rev, prev.key, prev.rev)
		}
		last[a.writer] = a
		switch {
		case a.answered == migrateOnEtcd:
			seenEtcd[a.writer] = true
			maxEtcd = max(maxEtcd, a.rev)
			if a.rev > etcdRev {
				t.Errorf("%s: etcd acknowledged %q at revision %d, past its revision %d at the cut-over", a.writer, a.key, a.rev, etcdRev)
			}
		case a.sent == migrateFenced:
			seenStrata[a.writer] = true
			if minStrata < 0 || a.rev < minStrata {
				minStrata = a.rev
			}
		}
	}
	if minStrata >= 0 && (minStrata <= maxEtcd || minStrata <= etcdRev) {
		t.Errorf("strata acknowledged revision %d; etcd had acknowledged up to %d and was at %d at the cut-over", minStrata, maxEtcd, etcdRev)
	}
	for _, n := range names {
		if !seenEtcd[n] || !seenStrata[n] {
			t.Errorf("writer %s: acknowledged by etcd %v, by strata %v; want both", n, seenEtcd[n], seenStrata[n])
		}
	}
}

// checkMigrateKeySpace checks that strata's key space at etcd's revision
// at the cut-over is etcd's: every key, value, create and mod revision,
// version and lease.
func checkMigrateKeySpace(t *testing.T, ctx context.Context, cli *clientv3.Client, want []*mvccpb.KeyValue, rev int64) {
	t.Helper()
	got, err := cli.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(rev))
	if err != nil {
		t.Fatalf("strata's key space at etcd's revision %d: %v", rev, err)
	}
	describe := func(kvs []*mvccpb.KeyValue) []string {
		var out []string
		for _, kv := range kvs {
			out = append(out, fmt.Sprintf("%q=%q create %d mod %d version %d lease %x", kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease))
		}
		return out
	}
	g, w := describe(got.Kvs), describe(want)
	if len(g) != len(w) {
		t.Errorf("strata has %d keys at etcd's revision %d, etcd had %d", len(g), rev, len(w))
	}
	n := 0
	for i := range min(len(g), len(w)) {
		if g[i] != w[i] && n < 10 {
			t.Errorf("key %d at revision %d: strata %s, etcd %s", i, rev, g[i], w[i])
			n++
		}
	}
}

// checkMigrateAcks reads every acknowledged write back at its revision,
// spread over the strata members: a put holds its value with that mod
// revision, a deleted key is absent.
func checkMigrateAcks(t *testing.T, ctx context.Context, members []*testutil.Process, acks []migrateAck) {
	t.Helper()
	var clients []*clientv3.Client
	for _, m := range members {
		clients = append(clients, migrateClient(t, []string{m.Endpoint()}, "root", migrateRootPassword))
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		errs  []string
		queue = make(chan migrateAck)
	)
	for w := range 6 {
		cli := clients[w%len(clients)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for a := range queue {
				resp, err := cli.Get(ctx, a.key, clientv3.WithRev(a.rev))
				var msg string
				switch {
				case err != nil:
					msg = fmt.Sprintf("get %q at revision %d: %v", a.key, a.rev, err)
				case a.del && len(resp.Kvs) != 0:
					msg = fmt.Sprintf("%s: %q deleted at revision %d is there at it: %q", a.writer, a.key, a.rev, resp.Kvs[0].Value)
				case a.del:
				case len(resp.Kvs) != 1:
					msg = fmt.Sprintf("%s: %q=%q acknowledged at revision %d is missing at it", a.writer, a.key, a.value, a.rev)
				case string(resp.Kvs[0].Value) != a.value || resp.Kvs[0].ModRevision != a.rev:
					msg = fmt.Sprintf("%s: %q at revision %d is %q with mod revision %d; acknowledged %q at %d",
						a.writer, a.key, a.rev, resp.Kvs[0].Value, resp.Kvs[0].ModRevision, a.value, a.rev)
				}
				if msg != "" {
					mu.Lock()
					errs = append(errs, msg)
					mu.Unlock()
				}
			}
		}()
	}
	for _, a := range acks {
		queue <- a
	}
	close(queue)
	wg.Wait()
	sort.Strings(errs)
	for i, e := range errs {
		if i == 20 {
			t.Errorf("... and %d more acknowledged writes lost or wrong", len(errs)-20)
			break
		}
		t.Error(e)
	}
}

// checkMigrateLease checks that the writers' lease lives on in strata with
// time left and every key the writers attached to it.
func checkMigrateLease(t *testing.T, ctx context.Context, cli *clientv3.Client, id clientv3.LeaseID, acks []migrateAck) {
	t.Helper()
	ttl, err := cli.TimeToLive(ctx, id, clientv3.WithAttachedKeys())
	if err != nil {
		t.Fatalf("lease %x on strata: %v", id, err)
	}
	if ttl.TTL <= 0 || ttl.TTL > ttl.GrantedTTL {
		t.Errorf("lease %x on strata: remaining TTL %d of %d", id, ttl.TTL, ttl.GrantedTTL)
	}
	attached := map[string]bool{}
	for _, k := range ttl.Keys {
		attached[string(k)] = true
	}
	for _, a := range acks {
		if a.writer == "lease" && !attached[a.key] {
			t.Errorf("lease %x on strata: %q, put with it at revision %d, is not attached (attached: %d keys)", id, a.key, a.rev, len(attached))
			attached[a.key] = true // once per key
		}
	}
}

// checkMigrateMembers checks that the member list is the three strata
// members and nothing of etcd's.
func checkMigrateMembers(t *testing.T, ctx context.Context, cli *clientv3.Client, members []*testutil.Process, peerURLs map[string]string) {
	t.Helper()
	list, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatalf("member list on strata: %v", err)
	}
	var got, want []string
	for _, m := range list.Members {
		got = append(got, fmt.Sprintf("%s peers %v clients %v", m.Name, m.PeerURLs, m.ClientURLs))
	}
	for _, m := range members {
		want = append(want, fmt.Sprintf("%s peers [%s] clients [%s]", m.Name(), peerURLs[m.Name()], m.Endpoint()))
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("member list on strata: %v; want %v", got, want)
	}
}

// checkMigrateHashKV checks that the strata members agree on HashKV at the
// latest revision, once each has applied it (bounded wait).
func checkMigrateHashKV(t *testing.T, ctx context.Context, cli *clientv3.Client, members []*testutil.Process) {
	t.Helper()
	cur, err := cli.Get(ctx, "kv/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("revision on strata: %v", err)
	}
	rev := cur.Header.Revision
	hashes := map[string]string{}
	for _, m := range members {
		var lastErr error
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			h, err := cli.HashKV(ctx, m.Endpoint(), rev)
			if lastErr = err; err == nil {
				hashes[m.Name()] = fmt.Sprintf("hash %d compact revision %d", h.Hash, h.CompactRevision)
				break
			}
		}
		if lastErr != nil {
			t.Errorf("HashKV of %s at revision %d: %v", m.Name(), rev, lastErr)
		}
	}
	for _, m := range members[1:] {
		if hashes[m.Name()] != hashes[members[0].Name()] {
			t.Errorf("HashKV at revision %d differs: %v", rev, hashes)
			break
		}
	}
}

// migrateClient is a client of endpoints authenticating as user. It
// redials every 50-200 ms: with gRPC's default backoff (1 s, growing to
// 2 min) a writer kept out by the fence would come back long after the
// front door opens, which a production client keeps no tighter either,
// but the test would then wait for it.
func migrateClient(t *testing.T, endpoints []string, user, password string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		Username:    user,
		Password:    password,
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 200 * time.Millisecond},
			MinConnectTimeout: time.Second,
		})},
	})
	if err != nil {
		t.Fatalf("client for %v as %s: %v", endpoints, user, err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// endpointHosts strips the scheme from client URLs: "127.0.0.1:port".
func endpointHosts(urls []string) []string {
	var hosts []string
	for _, u := range urls {
		hosts = append(hosts, strings.TrimPrefix(u, "http://"))
	}
	return hosts
}

// frontDoor is the one client-facing address the writers dial, as a load
// balancer in front of a production cluster: each connection it accepts
// goes to the next of its targets in turn (the one after, if that one
// refuses). Fence cuts every open connection and refuses new ones, as the
// operator fences the writers for the cut-over; Open points it at new
// targets and lets connections through again.
//
// Invariant: once Fence has returned, no byte passes to or from a target
// dialed before it: Fence closes both sides of every forwarded connection,
// and a connection whose target was chosen before a Fence or Open is
// refused however late its dial completes.
//
// Concurrency: every method is safe from any goroutine. The accept loop
// and, per connection, a forwarding goroutine and two copy goroutines run
// until Close, which the test's cleanup calls.
type frontDoor struct {
	ln net.Listener
	wg sync.WaitGroup // accept loop and forwarding goroutines, for Close

	mu struct {
		sync.Mutex
		targets []string
		next    int // index in targets of the next connection's target
		// gen counts Fence and Open calls: a connection is forwarded only
		// if no call came between choosing its target and tracking it.
		gen    int
		fenced bool
		closed bool
		conns  map[net.Conn]bool // both sides of every forwarded connection
	}
}

// newFrontDoor listens on a free loopback port and forwards to targets
// ("127.0.0.1:port"); t's cleanup closes it.
func newFrontDoor(t *testing.T, targets []string) *frontDoor {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("front door: listen: %v", err)
	}
	d := &frontDoor{ln: ln}
	d.mu.targets = targets
	d.mu.conns = map[net.Conn]bool{}
	d.wg.Add(1)
	go d.acceptLoop()
	t.Cleanup(d.Close)
	return d
}

// URL is the client URL of the front door.
func (d *frontDoor) URL() string { return "http://" + d.ln.Addr().String() }

// Fence closes every forwarded connection and refuses new ones until Open.
func (d *frontDoor) Fence() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mu.fenced = true
	d.mu.gen++
	for c := range d.mu.conns {
		c.Close()
	}
}

// Open forwards new connections to targets from now on.
func (d *frontDoor) Open(targets []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mu.targets = targets
	d.mu.next = 0
	d.mu.fenced = false
	d.mu.gen++
}

// Close stops accepting, closes every connection and waits for the
// goroutines to end.
func (d *frontDoor) Close() {
	d.mu.Lock()
	d.mu.closed = true
	for c := range d.mu.conns {
		c.Close()
	}
	d.mu.Unlock()
	d.ln.Close()
	d.wg.Wait()
}

func (d *frontDoor) acceptLoop() {
	defer d.wg.Done()
	for {
		in, err := d.ln.Accept()
		if err != nil {
			return // closed by Close
		}
		d.wg.Add(1)
		go d.forward(in)
	}
}

// forward dials a target for one accepted connection and copies both ways
// until either side ends or Fence or Close cuts them.
func (d *frontDoor) forward(in net.Conn) {
	defer d.wg.Done()
	d.mu.Lock()
	if d.mu.fenced || d.mu.closed || len(d.mu.targets) == 0 {
		d.mu.Unlock()
		in.Close()
		return
	}
	gen := d.mu.gen
	var order []string
	for i := range d.mu.targets {
		order = append(order, d.mu.targets[(d.mu.next+i)%len(d.mu.targets)])
	}
	d.mu.next = (d.mu.next + 1) % len(d.mu.targets)
	d.mu.Unlock()
	var out net.Conn
	for _, target := range order {
		c, err := net.DialTimeout("tcp", target, time.Second)
		if err == nil {
			out = c
			break
		}
	}
	if out == nil {
		in.Close() // every target is down: the client sees the connection close
		return
	}
	d.mu.Lock()
	if d.mu.gen != gen || d.mu.fenced || d.mu.closed {
		d.mu.Unlock()
		in.Close()
		out.Close()
		return
	}
	d.mu.conns[in], d.mu.conns[out] = true, true
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		delete(d.mu.conns, in)
		delete(d.mu.conns, out)
		d.mu.Unlock()
	}()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		// However the copy ends, end both sides, as a load balancer that
		// loses one side of a connection does.
		_, _ = io.Copy(dst, src)
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	<-done
}
