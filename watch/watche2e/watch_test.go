package watche2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"

	"github.com/strata-kv/strata/internal/testutil"
)

// bins are built once by TestMain: strata, and real etcd from tools/ to
// check that the tests' expectations are etcd's.
var bins testutil.Binaries

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithBinaries(m, &bins))
}

// flavors are the servers the semantic tests run against: strata, and
// etcd itself as the reference.
var flavors = []string{"strata", "etcd"}

func startFlavor(t *testing.T, flavor string) (*testutil.Process, *clientv3.Client) {
	t.Helper()
	bin := bins.Strata
	if flavor == "etcd" {
		bin = bins.Etcd
	}
	p := testutil.StartProcess(t, testutil.Options{Binary: bin})
	return p, p.Client(t)
}

func start(t *testing.T) (*testutil.Process, *clientv3.Client) {
	t.Helper()
	p := testutil.StartProcess(t, testutil.Options{Binary: bins.Strata})
	return p, p.Client(t)
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustPut(t *testing.T, cli *clientv3.Client, k, v string) int64 {
	t.Helper()
	resp, err := cli.Put(ctxT(t, 10*time.Second), k, v)
	if err != nil {
		t.Fatalf("put %s: %v", k, err)
	}
	return resp.Header.Revision
}

// recv reads n events from wch, failing after a bounded wait.
func recv(t *testing.T, wch clientv3.WatchChan, n int) []*clientv3.Event {
	t.Helper()
	var evs []*clientv3.Event
	timeout := time.After(20 * time.Second)
	for len(evs) < n {
		select {
		case wr, ok := <-wch:
			if !ok {
				t.Fatalf("watch channel closed after %d of %d events", len(evs), n)
			}
			if err := wr.Err(); err != nil {
				t.Fatalf("watch error after %d events: %v", len(evs), err)
			}
			evs = append(evs, wr.Events...)
		case <-timeout:
			t.Fatalf("got %d of %d events in 20 s", len(evs), n)
		}
	}
	return evs
}

func describe(evs []*clientv3.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		fmt.Fprintf(&b, "%s %s@%d", ev.Type, ev.Kv.Key, ev.Kv.ModRevision)
		if ev.Type == mvccpb.PUT {
			fmt.Fprintf(&b, "=%s", ev.Kv.Value)
		}
		if ev.PrevKv != nil {
			fmt.Fprintf(&b, " prev=%s", ev.PrevKv.Value)
		}
		b.WriteString("; ")
	}
	return b.String()
}

func TestWatchOptions(t *testing.T) {
	for _, flavor := range flavors {
		t.Run(flavor, func(t *testing.T) {
			_, cli := startFlavor(t, flavor)
			r1 := mustPut(t, cli, "p/a", "1")
			mustPut(t, cli, "q", "x")
			mustPut(t, cli, "p/b", "1")
			mustPut(t, cli, "p/a", "2")
			if _, err := cli.Delete(ctxT(t, 10*time.Second), "p/a"); err != nil {
				t.Fatal(err)
			}
			r := r1
			tests := []struct {
				name string
				key  string
				opts []clientv3.OpOption
				want string
			}{
				{"prefix from the past", "p/", []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithRev(r)},
					fmt.Sprintf("PUT p/a@%d=1; PUT p/b@%d=1; PUT p/a@%d=2; DELETE p/a@%d; ", r, r+2, r+3, r+4)},
				{"one key with prev_kv", "p/a", []clientv3.OpOption{clientv3.WithRev(r), clientv3.WithPrevKV()},
					fmt.Sprintf("PUT p/a@%d=1; PUT p/a@%d=2 prev=1; DELETE p/a@%d prev=2; ", r, r+3, r+4)},
				{"no put", "p/", []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithRev(r), clientv3.WithFilterPut()},
					fmt.Sprintf("DELETE p/a@%d; ", r+4)},
				{"no delete", "p/a", []clientv3.OpOption{clientv3.WithRev(r + 1), clientv3.WithFilterDelete()},
					fmt.Sprintf("PUT p/a@%d=2; ", r+3)},
				{"range", "p/b", []clientv3.OpOption{clientv3.WithRange("r"), clientv3.WithRev(r)},
					fmt.Sprintf("PUT q@%d=x; PUT p/b@%d=1; ", r+1, r+2)},
				{"from key", "q", []clientv3.OpOption{clientv3.WithFromKey(), clientv3.WithRev(r)},
					fmt.Sprintf("PUT q@%d=x; ", r+1)},
			}
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					wch := cli.Watch(ctx, tc.key, tc.opts...)
					n := strings.Count(tc.want, ";")
					got := recv(t, wch, n)
					if describe(got) != tc.want {
						t.Fatalf("events\n got %s\nwant %s", describe(got), tc.want)
					}
				})
			}
			// Live events after the watch is created.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			wch := cli.Watch(ctx, "live", clientv3.WithCreatedNotify())
			if wr := <-wch; !wr.Created {
				t.Fatalf("want created notification, got %+v", wr)
			}
			rev := mustPut(t, cli, "live", "v")
			if got := describe(recv(t, wch, 1)); got != fmt.Sprintf("PUT live@%d=v; ", rev) {
				t.Fatalf("live event %s", got)
			}
		})
	}
}

func TestWatchCompacted(t *testing.T) {
	for _, flavor := range flavors {
		t.Run(flavor, func(t *testing.T) {
			_, cli := startFlavor(t, flavor)
			first := mustPut(t, cli, "c", "0")
			for i := 1; i < 10; i++ {
				mustPut(t, cli, "c", strconv.Itoa(i))
			}
			if _, err := cli.Compact(ctxT(t, 10*time.Second), first+5); err != nil {
				t.Fatal(err)
			}
			wch := cli.Watch(ctxT(t, 20*time.Second), "c", clientv3.WithRev(first))
			wr := <-wch
			if wr.CompactRevision != first+5 || !wr.Canceled || wr.Err() != rpctypes.ErrCompacted {
				t.Fatalf("want canceled with compact revision %d, got %+v (err %v)", first+5, wr, wr.Err())
			}
			if _, ok := <-wch; ok {
				t.Fatal("watch channel not closed after compaction")
			}
			// From the compact revision on, history is there.
			got := recv(t, cli.Watch(ctxT(t, 20*time.Second), "c", clientv3.WithRev(first+5)), 5)
			if got[0].Kv.ModRevision != first+5 || got[4].Kv.ModRevision != first+9 {
				t.Fatalf("events from the compact revision: %s", describe(got))
			}
		})
	}
}

func TestWatchProgress(t *testing.T) {
	for _, flavor := range flavors {
		t.Run(flavor, func(t *testing.T) {
			_, cli := startFlavor(t, flavor)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			wch := cli.Watch(ctx, "nothing-here", clientv3.WithCreatedNotify())
			<-wch
			rev := mustPut(t, cli, "elsewhere", "v")
			if err := cli.RequestProgress(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case wr := <-wch:
				if !wr.IsProgressNotify() || wr.Header.Revision < rev {
					t.Fatalf("want a progress notification at >= %d, got %+v", rev, wr)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no progress notification")
			}
		})
	}
}

func TestWatchFragment(t *testing.T) {
	for _, flavor := range flavors {
		t.Run(flavor, func(t *testing.T) {
			// 3 MiB in one transaction, over the 1.5 MiB request limit: with
			// fragment the response arrives in pieces and clientv3 joins them.
			p, cli := startFlavor(t, flavor)
			_ = p
			val := strings.Repeat("x", 500*1024)
			var ops []clientv3.Op
			for i := range 6 {
				ops = append(ops, clientv3.OpPut(fmt.Sprintf("f/%d", i), val))
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			wch := cli.Watch(ctx, "f/", clientv3.WithPrefix(), clientv3.WithFragment(), clientv3.WithCreatedNotify())
			<-wch
			if _, err := cli.Txn(ctxT(t, 20*time.Second)).Then(ops[:2]...).Commit(); err != nil {
				t.Fatal(err)
			}
			for i := 2; i < 6; i += 2 {
				if _, err := cli.Txn(ctxT(t, 20*time.Second)).Then(ops[i : i+2]...).Commit(); err != nil {
					t.Fatal(err)
				}
			}
			if got := recv(t, wch, 6); len(got) != 6 {
				t.Fatalf("want 6 events, got %d", len(got))
			}
		})
	}
}

// pidOf finds the server's PID by its unique data directory (read-only
// use of /proc; the harness keeps the PID private).
func pidOf(t *testing.T, p *testutil.Process) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	want := []byte("--data-dir=" + p.DataDir() + "\x00")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, want) && bytes.HasPrefix(b, []byte(bins.Strata)) {
			return pid
		}
	}
	t.Fatalf("no process with data dir %s", p.DataDir())
	return 0
}

// rssMiB reads VmRSS from /proc/<pid>/status.
func rssMiB(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

func TestTenThousandWatchers(t *testing.T) {
	if testing.Short() {
		t.Skip("creates 10,000 watchers")
	}
	p, cli := start(t)
	pid := pidOf(t, p)
	before := rssMiB(t, pid)
	const n = 10000
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Ten streams (one per context) of 1,000 watchers each, half on one
	// key, half on prefixes.
	var chans []clientv3.WatchChan
	for i := range n {
		// clientv3 opens one gRPC stream per distinct outgoing metadata.
		sctx := metadata.AppendToOutgoingContext(ctx, "stream", strconv.Itoa(i%10))
		key := fmt.Sprintf("w/%04d", i)
		opts := []clientv3.OpOption{}
		if i%2 == 1 {
			key = fmt.Sprintf("w/%03d", i/10)
			opts = append(opts, clientv3.WithPrefix())
		}
		chans = append(chans, cli.Watch(sctx, key, opts...))
	}
	// Every watcher sees its event: one put per single-key watcher.
	start := time.Now()
	for i := 0; i < n; i += 2 {
		if _, err := cli.Put(ctxT(t, 10*time.Second), fmt.Sprintf("w/%04d", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	for i, ch := range chans {
		want := 1
		if i%2 == 1 {
			want = 5 // w/NNN prefix covers w/NNN0..w/NNN9, five of them even
		}
		evs := recv(t, ch, want)
		if len(evs) != want {
			t.Fatalf("watcher %d: %d events", i, len(evs))
		}
	}
	after := rssMiB(t, pid)
	t.Logf("RSS before %.1f MiB, with %d watchers after %d puts %.1f MiB (%.1f KiB per watcher); puts and delivery took %v",
		before, n, n/2, after, (after-before)*1024/n, time.Since(start))
	// Generous: etcd needs a few KiB per watcher; 200 MiB over the idle
	// member would mean something per watcher grows with traffic.
	if after-before > 200 {
		t.Fatalf("RSS grew by %.1f MiB with %d watchers", after-before, n)
	}
}

// TestStalledWatcher: a raw gRPC client creates a watch on a busy prefix
// and never reads. Writes go on with their latency and the member's memory
// stays bounded: the hub drops the stalled watcher back to catch-up mode
// instead of queuing its events.
func TestStalledWatcher(t *testing.T) {
	p, cli := start(t)
	pid := pidOf(t, p)
	val := strings.Repeat("v", 8*1024)
	lat := func(n int) time.Duration {
		var ds []time.Duration
		for i := range n {
			t0 := time.Now()
			mustPut(t, cli, fmt.Sprintf("s/%d", i%100), val)
			ds = append(ds, time.Since(t0))
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[len(ds)*99/100]
	}
	base := lat(300)
	rssBase := rssMiB(t, pid)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := pb.NewWatchClient(cli.ActiveConnection()).Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := stream.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
			Key: []byte("s/"), RangeEnd: []byte("s0"), PrevKv: i%2 == 0, StartRevision: 1,
		}}}); err != nil {
			t.Fatal(err)
		}
	}
	// A healthy watcher beside it on another stream keeps up.
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	healthy := cli.Watch(clientv3.WithRequireLeader(wctx), "s/", clientv3.WithPrefix())
	got := make(chan int, 1)
	go func() {
		n := 0
		for wr := range healthy {
			n += len(wr.Events)
			if n >= 3000 {
				break
			}
		}
		got <- n
	}()
	stalled := lat(3000) // 24 MiB of values, 20 stalled watchers with prev_kv on half
	rssStalled := rssMiB(t, pid)
	t.Logf("put p99: %v without a stalled watcher, %v with 20; RSS %.1f MiB -> %.1f MiB", base, stalled, rssBase, rssStalled)
	select {
	case n := <-got:
		if n < 3000 {
			t.Fatalf("healthy watcher got %d of 3000 events", n)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("healthy watcher did not get its events beside a stalled one")
	}
	// Unbounded queuing would hold 20 x 3000 x 8 KiB (x2 with prev_kv) =
	// 700+ MiB; the per-stream queue bounds it to a few tens of MiB.
	if rssStalled-rssBase > 250 {
		t.Fatalf("RSS grew by %.1f MiB with a stalled watcher", rssStalled-rssBase)
	}
	if stalled > 10*base+200*time.Millisecond {
		t.Fatalf("put p99 %v with a stalled watcher, %v without", stalled, base)
	}
}

// TestWatchAcrossRestart: a watcher that sees the member killed (-9) and
// restarted resumes where it was: every revision once, in order.
func TestWatchAcrossRestart(t *testing.T) {
	p, cli := start(t)
	first := mustPut(t, cli, "r/0", "0")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wch := cli.Watch(ctx, "r/", clientv3.WithPrefix(), clientv3.WithRev(first))
	for i := 1; i < 50; i++ {
		mustPut(t, cli, fmt.Sprintf("r/%d", i%7), strconv.Itoa(i))
	}
	evs := recv(t, wch, 20)
	p.Kill()
	p.Restart()
	var last int64
	for i := 50; i < 100; i++ {
		// Retry: the client reconnects on its own.
		var err error
		for range 50 {
			var resp *clientv3.PutResponse
			resp, err = cli.Put(ctxT(t, 5*time.Second), fmt.Sprintf("r/%d", i%7), strconv.Itoa(i))
			if err == nil {
				last = resp.Header.Revision
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	evs = append(evs, recv(t, wch, int(last-first+1)-len(evs))...)
	for i, ev := range evs {
		if ev.Kv.ModRevision != first+int64(i) {
			t.Fatalf("event %d has revision %d, want %d (gap or repeat): %s", i, ev.Kv.ModRevision, first+int64(i), describe(evs))
		}
	}
	select {
	case wr := <-wch:
		if len(wr.Events) > 0 {
			t.Fatalf("extra events after the last write: %s", describe(wr.Events))
		}
	case <-time.After(200 * time.Millisecond):
	}
}

// TestWatchAcrossLeaderChange: on a three-member cluster, the leader is
// killed and later restarted while writes go on. A watcher on a follower
// and a watcher whose client fails over between members each see every
// revision once, in order.
func TestWatchAcrossLeaderChange(t *testing.T) {
	if testing.Short() {
		t.Skip("three members")
	}
	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: bins.Strata, Size: 3})
	leader, err := c.WaitLeader(20 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	follower := (leader + 1) % 3
	writer := c.Client(t)
	onFollower := c.Client(t, c.Members[follower].Endpoint())
	failingOver := c.Client(t)
	first := mustPut(t, writer, "l/0", "0")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w1 := onFollower.Watch(ctx, "l/", clientv3.WithPrefix(), clientv3.WithRev(first))
	w2 := failingOver.Watch(ctx, "l/", clientv3.WithPrefix(), clientv3.WithRev(first))
	put := func(i int) int64 {
		t.Helper()
		for range 100 {
			resp, err := writer.Put(ctxT(t, 5*time.Second), fmt.Sprintf("l/%d", i%5), strconv.Itoa(i))
			if err == nil {
				return resp.Header.Revision
			}
			time.Sleep(100 * time.Millisecond) // retry while a leader is elected
		}
		t.Fatalf("put %d failed for 10 s", i)
		return 0
	}
	for i := 1; i < 30; i++ {
		put(i)
	}
	c.Members[leader].Kill()
	var last int64
	for i := 30; i < 60; i++ {
		last = put(i)
	}
	c.Members[leader].Restart()
	for i := 60; i < 90; i++ {
		last = put(i)
	}
	for name, wch := range map[string]clientv3.WatchChan{"on a follower": w1, "failing over": w2} {
		evs := recv(t, wch, int(last-first+1))
		for i, ev := range evs {
			if ev.Kv.ModRevision != first+int64(i) {
				t.Fatalf("watcher %s: event %d has revision %d, want %d", name, i, ev.Kv.ModRevision, first+int64(i))
			}
		}
	}
}

// TestWatchRequireLeader: a watcher created with WithRequireLeader on a
// member that loses its quorum ends with etcd's "no leader" error, and a
// new one is refused at once.
func TestWatchRequireLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("three members")
	}
	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: bins.Strata, Size: 3})
	leader, err := c.WaitLeader(20 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	keep := (leader + 1) % 3
	cli := c.Client(t, c.Members[keep].Endpoint())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wch := cli.Watch(clientv3.WithRequireLeader(ctx), "k", clientv3.WithCreatedNotify())
	if wr := <-wch; !wr.Created {
		t.Fatalf("want created, got %+v", wr)
	}
	for i := range c.Members {
		if i != keep {
			c.Members[i].Kill()
		}
	}
	select {
	case wr := <-wch:
		if wr.Err() != rpctypes.ErrNoLeader {
			t.Fatalf("want no leader, got %+v (err %v)", wr, wr.Err())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("watch still open 20 s after the quorum was lost")
	}
	wr := <-cli.Watch(clientv3.WithRequireLeader(ctx), "k")
	if wr.Err() != rpctypes.ErrNoLeader {
		t.Fatalf("new watch without a leader: %+v (err %v)", wr, wr.Err())
	}
}

// TestWatchProtocolMatchesEtcd runs one script of raw watch requests
// against strata and against etcd and compares every response, field by
// field (headers reduced to the revision): automatic and chosen watch IDs,
// duplicate IDs, an empty range, cancel of a known and an unknown ID,
// RequestProgress, a compacted start revision, prev_kv and filters.
func TestWatchProtocolMatchesEtcd(t *testing.T) {
	create := func(c *pb.WatchCreateRequest) *pb.WatchRequest {
		return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: c}}
	}
	cancelReq := func(id int64) *pb.WatchRequest {
		return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: id}}}
	}
	progress := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}}
	type step struct {
		name string
		req  *pb.WatchRequest
		do   func(t *testing.T, cli *clientv3.Client)
		n    int // responses the step causes on etcd
	}
	steps := []step{
		{name: "history", do: func(t *testing.T, cli *clientv3.Client) {
			mustPut(t, cli, "a", "1")                                          // 2
			mustPut(t, cli, "b", "1")                                          // 3
			mustPut(t, cli, "a", "2")                                          // 4
			if _, err := cli.Delete(ctxT(t, 5*time.Second), "a"); err != nil { // 5
				t.Fatal(err)
			}
		}},
		{name: "auto id, past, prev_kv", req: create(&pb.WatchCreateRequest{Key: []byte("a"), StartRevision: 2, PrevKv: true}), n: 2},
		{name: "auto id, prefix, no put", req: create(&pb.WatchCreateRequest{Key: []byte("a"), RangeEnd: []byte("b"), StartRevision: 1, Filters: []pb.WatchCreateRequest_FilterType{pb.WatchCreateRequest_NOPUT}}), n: 2},
		{name: "chosen id", req: create(&pb.WatchCreateRequest{Key: []byte("b"), WatchId: 5}), n: 1},
		{name: "duplicate id", req: create(&pb.WatchCreateRequest{Key: []byte("c"), WatchId: 5}), n: 1},
		{name: "empty range", req: create(&pb.WatchCreateRequest{Key: []byte("b"), RangeEnd: []byte("a")}), n: 1},
		{name: "empty key, from key", req: create(&pb.WatchCreateRequest{RangeEnd: []byte{0}, StartRevision: 3}), n: 2},
		{name: "live", do: func(t *testing.T, cli *clientv3.Client) { mustPut(t, cli, "b", "2") }, n: 2},
		{name: "cancel", req: cancelReq(5), n: 1},
		{name: "cancel unknown", req: cancelReq(99)},
		{name: "progress", req: progress, n: 1},
		{name: "compact", do: func(t *testing.T, cli *clientv3.Client) {
			if _, err := cli.Compact(ctxT(t, 5*time.Second), 4); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "compacted start", req: create(&pb.WatchCreateRequest{Key: []byte("a"), StartRevision: 3}), n: 2},
		{name: "at compact revision", req: create(&pb.WatchCreateRequest{Key: []byte("a"), StartRevision: 4}), n: 2},
	}
	got := map[string][]string{}
	for _, flavor := range flavors {
		_, cli := startFlavor(t, flavor)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		stream, err := pb.NewWatchClient(cli.ActiveConnection()).Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		resps := make(chan *pb.WatchResponse, 100)
		go func() {
			for {
				r, err := stream.Recv()
				if err != nil {
					close(resps)
					return
				}
				resps <- r
			}
		}()
		for _, st := range steps {
			if st.do != nil {
				st.do(t, cli)
			} else if err := stream.Send(st.req); err != nil {
				t.Fatal(err)
			}
			// Wait (bounded) for the responses etcd gives, then a short
			// quiet period to catch any extra one.
			var out []string
			for done := false; !done; {
				wait := 200 * time.Millisecond
				if len(out) < st.n {
					wait = 10 * time.Second
				}
				select {
				case r, ok := <-resps:
					if !ok {
						t.Fatalf("%s: stream ended", flavor)
					}
					r.Header = &pb.ResponseHeader{Revision: r.Header.GetRevision()}
					out = append(out, prototextOf(r))
				case <-time.After(wait):
					done = true
				}
			}
			// etcd notifies the watchers of one key in map order.
			if st.name == "live" {
				sort.Strings(out)
			}
			got[flavor] = append(got[flavor], st.name+": "+strings.Join(out, " | "))
		}
	}
	for i := range steps {
		if got["strata"][i] != got["etcd"][i] {
			t.Errorf("step %d differs:\nstrata %s\netcd   %s", i, got["strata"][i], got["etcd"][i])
		}
	}
}

func prototextOf(r *pb.WatchResponse) string {
	var b strings.Builder
	fmt.Fprintf(&b, "{rev %d id %d", r.Header.GetRevision(), r.WatchId)
	if r.Created {
		b.WriteString(" created")
	}
	if r.Canceled {
		fmt.Fprintf(&b, " canceled %q", r.CancelReason)
	}
	if r.CompactRevision != 0 {
		fmt.Fprintf(&b, " compact %d", r.CompactRevision)
	}
	if r.Fragment {
		b.WriteString(" fragment")
	}
	for _, ev := range r.Events {
		fmt.Fprintf(&b, " [%s %v", ev.Type, ev.Kv)
		if ev.PrevKv != nil {
			fmt.Fprintf(&b, " prev %v", ev.PrevKv)
		}
		b.WriteString("]")
	}
	b.WriteString("}")
	return b.String()
}

// TestWatchAcrossSnapshotInstall: a follower cut off from its peers falls
// so far behind that it can only catch up from a raft snapshot; its
// watcher, connected all along, sees every revision once, in order, the
// jump included (the hub reads them from the installed engine's index).
func TestWatchAcrossSnapshotInstall(t *testing.T) {
	if testing.Short() {
		t.Skip("three members")
	}
	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: bins.Strata, Size: 3,
		Flags: []string{"--snapshot-count=20", "--snapshot-catchup-entries=5"}})
	leader, err := c.WaitLeader(20 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	f := (leader + 1) % 3
	writer := c.Client(t, c.Members[leader].Endpoint(), c.Members[(leader+2)%3].Endpoint())
	first := mustPut(t, writer, "s/0", "0")
	watcher := c.Client(t, c.Members[f].Endpoint())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wch := watcher.Watch(ctx, "s/", clientv3.WithPrefix(), clientv3.WithRev(first))
	recv(t, wch, 1)
	c.Members[f].Proxy.Blackhole()
	var last int64
	for i := 1; i < 300; i++ {
		last = mustPut(t, writer, fmt.Sprintf("s/%d", i%13), strconv.Itoa(i))
	}
	c.Members[f].Proxy.Heal()
	evs := recv(t, wch, int(last-first))
	for i, ev := range evs {
		if ev.Kv.ModRevision != first+1+int64(i) {
			t.Fatalf("event %d has revision %d, want %d", i, ev.Kv.ModRevision, first+1+int64(i))
		}
	}
	// The test is about the snapshot path: make sure it was taken.
	if !strings.Contains(c.Members[f].Output(), "received snapshot") {
		t.Errorf("the follower caught up without a raft snapshot; raise the writes")
	}
}

// TestWatchNegativeStartRevision: etcd refuses a watch whose start revision
// is negative as compacted (created and canceled at once), whether or not
// anything was compacted; only 0 means "from the next revision". strata
// once started such a watch from the next revision.
func TestWatchNegativeStartRevision(t *testing.T) {
	for _, flavor := range flavors {
		t.Run(flavor, func(t *testing.T) {
			_, cli := startFlavor(t, flavor)
			mustPut(t, cli, "n", "0")
			wch := cli.Watch(ctxT(t, 20*time.Second), "n", clientv3.WithRev(-1))
			select {
			case wr, ok := <-wch:
				if !ok || !wr.Canceled || wr.Err() != rpctypes.ErrCompacted {
					t.Fatalf("watch from revision -1: got %+v (err %v), want canceled as compacted", wr, wr.Err())
				}
			case <-time.After(10 * time.Second):
				t.Fatal("watch from revision -1: no answer")
			}
		})
	}
}
