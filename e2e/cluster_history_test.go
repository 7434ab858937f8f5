package e2e

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/strata-kv/strata/internal/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The cluster robustness suite records every request its clients make and
// checks the history afterwards, the way etcd's robustness tests do:
//
//  1. Writers put unique values to a few keys; linearizable readers get
//     them. Both go to clientv3 clients that know every member and fail
//     over. Successful puts and gets form a porcupine history.
//  2. After the faults, the whole write history is read back: for every
//     revision R since the start, a range at R shows which key has
//     mod_revision R. etcd's tests read this history from a watch stream;
//     ranges read it from the MVCC store itself, apart from the watch path
//     (which watch/watche2e and etcd's own suite, make robustness, check).
//  3. Puts that failed (timeout, leader lost) are resolved with it: a put
//     whose unique value appears at revision R took effect, and enters the
//     history as an operation that returned R at the end of time; a put whose
//     value never appears is dropped. Without this, every failed put would
//     stay concurrent with everything after it and the search would blow up.
//  4. Checks: (a) every acknowledged put is in the write history at the
//     revision it was acknowledged with; (b) porcupine finds the history
//     linearizable under linModel; serializable reads, which need not be
//     linearizable, are checked apart: each must equal the write history's
//     state at its header revision, and one client pinned to one member
//     must never see the revision go backwards; (c) every member converges
//     to the same state and the same HashKV.

// linKeys is the number of keys the workload shares: few, so that reads
// often see the latest write and writes often overwrite each other.
const linKeys = 4

// linPrefix holds every key the workload touches; nothing else writes in a
// cluster test, so every revision belongs to exactly one of these keys.
const linPrefix = "lin/"

func linKey(k int) string { return fmt.Sprintf("%sk%d", linPrefix, k) }

// linInput is one request: a put of value to key, or a get of key.
type linInput struct {
	put   bool
	key   int
	value string
}

// linOutput is one answer. For a put, rev is the revision the put created;
// for a get, rev is the header revision and value, modRev the key's.
type linOutput struct {
	rev    int64
	value  string
	modRev int64
}

// linState is etcd's KV state restricted to the workload's keys: the
// store's revision and each key's value and mod revision. It is an array
// value, so states compare with == and steps copy instead of mutate.
type linState struct {
	rev  int64
	vals [linKeys]string
	mods [linKeys]int64
}

// linModel is etcd's KV semantics with revisions, starting at revision
// initRev with every key absent: a put creates revision rev+1 and answers
// it; a get answers the key's value and mod revision and the store's
// current revision.
func linModel(initRev int64) porcupine.Model {
	return porcupine.Model{
		Init: func() any { return linState{rev: initRev} },
		Step: func(state, input, output any) (bool, any) {
			s, in, out := state.(linState), input.(linInput), output.(linOutput)
			if in.put {
				if out.rev != s.rev+1 {
					return false, s
				}
				s.rev = out.rev
				s.vals[in.key] = in.value
				s.mods[in.key] = out.rev
				return true, s
			}
			ok := out.rev == s.rev && out.value == s.vals[in.key] && out.modRev == s.mods[in.key]
			return ok, s
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(linInput), output.(linOutput)
			if in.put {
				return fmt.Sprintf("put(k%d, %s) -> rev %d", in.key, in.value, out.rev)
			}
			return fmt.Sprintf("get(k%d) -> %q mod %d @%d", in.key, out.value, out.modRev, out.rev)
		},
		DescribeState: func(state any) string {
			s := state.(linState)
			return fmt.Sprintf("rev %d %v %v", s.rev, s.vals, s.mods)
		},
	}
}

// failedPut is a put whose outcome the client does not know.
type failedPut struct {
	client int
	key    int
	value  string
	call   int64
}

// serialRead is one serializable get, by a client pinned to one member.
type serialRead struct {
	client    int
	key       int
	value     string
	modRev    int64
	headerRev int64
	at        time.Duration // when the answer came, since the workload's start
	// incarnation is the pinned member's Starts() around the read, or -1
	// if it restarted during the read.
	incarnation int
}

// recorder collects the history. Timestamps are nanoseconds since start.
//
// Concurrency: record* from any client goroutine; read after the workload
// stopped.
type recorder struct {
	start time.Time

	mu struct {
		sync.Mutex
		ops    []porcupine.Operation // acknowledged puts, successful linearizable gets
		failed []failedPut
		serial []serialRead
		acks   []time.Time // when each put was acknowledged, in order
	}
}

func (r *recorder) now() int64 { return time.Since(r.start).Nanoseconds() }

// workload is the clients running against a cluster.
type workload struct {
	c       *testutil.Cluster
	rec     *recorder
	initRev int64
	// probe is the client of probeWrite, probeID its client number;
	// probeSeq numbers its values (used only by the test goroutine).
	probe    *clientv3.Client
	probeID  int
	probeSeq int
	// pinned names the member each serializable reader is pinned to.
	pinned map[int]string
	stop   chan struct{}
	wg     sync.WaitGroup
}

// startWorkload starts 3 writers and 2 linearizable readers on clients
// that know every member, and one serializable reader pinned to each
// member. Each client paces itself so that a run of a few seconds stays a
// history porcupine checks in well under a second.
func startWorkload(t *testing.T, c *testutil.Cluster) *workload {
	t.Helper()
	w := &workload{c: c, rec: &recorder{start: time.Now()}, stop: make(chan struct{})}
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	resp, err := cli.Get(ctx, linPrefix, clientv3.WithPrefix())
	cancel()
	if err != nil {
		t.Fatalf("workload: initial get: %v", err)
	}
	if resp.Count != 0 {
		t.Fatalf("workload: %d keys under %s before the start", resp.Count, linPrefix)
	}
	w.initRev = resp.Header.Revision
	client := 0
	for range 3 {
		w.run(client, c.Client(t), w.writer)
		client++
	}
	for range 2 {
		w.run(client, c.Client(t), w.linReader)
		client++
	}
	w.probe, w.probeID = c.Client(t), client
	client++
	w.pinned = map[int]string{}
	for _, m := range c.Members {
		w.pinned[client] = m.Name()
		w.run(client, c.Client(t, m.Endpoint()), func(client int, cli *clientv3.Client, rng *rand.Rand, _ int) error {
			return w.serialReader(client, cli, rng, m)
		})
		client++
	}
	t.Cleanup(w.halt)
	return w
}

// run starts one client loop: step is called until stop, paced, and
// throttled harder after a failure (the cluster may be down).
func (w *workload) run(client int, cli *clientv3.Client, step func(client int, cli *clientv3.Client, rng *rand.Rand, seq int) error) {
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		rng := rand.New(rand.NewPCG(uint64(client), 7))
		for seq := 0; ; seq++ {
			pace := 10 * time.Millisecond
			if err := step(client, cli, rng, seq); err != nil {
				pace = 50 * time.Millisecond
			}
			select {
			case <-w.stop:
				return
			case <-time.After(pace):
			}
		}
	}()
}

// halt stops the clients and waits for them; safe to call twice.
func (w *workload) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.wg.Wait()
}

// reqTimeout is short so that a client stuck on a dead or isolated member
// gives up and fails over quickly.
const reqTimeout = time.Second

func (w *workload) writer(client int, cli *clientv3.Client, rng *rand.Rand, seq int) error {
	key, value := rng.IntN(linKeys), fmt.Sprintf("c%d-%d", client, seq)
	ctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
	defer cancel()
	call := w.rec.now()
	resp, err := cli.Put(ctx, linKey(key), value)
	ret := w.rec.now()
	w.rec.mu.Lock()
	defer w.rec.mu.Unlock()
	if err != nil {
		w.rec.mu.failed = append(w.rec.mu.failed, failedPut{client: client, key: key, value: value, call: call})
		return err
	}
	w.rec.mu.ops = append(w.rec.mu.ops, porcupine.Operation{
		ClientId: client, Call: call, Return: ret,
		Input:  linInput{put: true, key: key, value: value},
		Output: linOutput{rev: resp.Header.Revision},
	})
	w.rec.mu.acks = append(w.rec.mu.acks, time.Now())
	return nil
}

func (w *workload) linReader(client int, cli *clientv3.Client, rng *rand.Rand, _ int) error {
	key := rng.IntN(linKeys)
	ctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
	defer cancel()
	call := w.rec.now()
	resp, err := cli.Get(ctx, linKey(key))
	ret := w.rec.now()
	if err != nil {
		// A failed get changed nothing: leave it out of the history.
		return err
	}
	out := linOutput{rev: resp.Header.Revision}
	if len(resp.Kvs) > 0 {
		out.value, out.modRev = string(resp.Kvs[0].Value), resp.Kvs[0].ModRevision
	}
	w.rec.mu.Lock()
	defer w.rec.mu.Unlock()
	w.rec.mu.ops = append(w.rec.mu.ops, porcupine.Operation{
		ClientId: client, Call: call, Return: ret,
		Input: linInput{key: key}, Output: out,
	})
	return nil
}

func (w *workload) serialReader(client int, cli *clientv3.Client, rng *rand.Rand, m *testutil.Member) error {
	key := rng.IntN(linKeys)
	ctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
	defer cancel()
	before := m.Starts()
	resp, err := cli.Get(ctx, linKey(key), clientv3.WithSerializable())
	if err != nil {
		return err
	}
	r := serialRead{client: client, key: key, headerRev: resp.Header.Revision, at: time.Since(w.rec.start), incarnation: before}
	if m.Starts() != before {
		r.incarnation = -1
	}
	if len(resp.Kvs) > 0 {
		r.value, r.modRev = string(resp.Kvs[0].Value), resp.Kvs[0].ModRevision
	}
	w.rec.mu.Lock()
	defer w.rec.mu.Unlock()
	w.rec.mu.serial = append(w.rec.mu.serial, r)
	return nil
}

// acked is the number of acknowledged puts so far.
func (w *workload) acked() int {
	w.rec.mu.Lock()
	defer w.rec.mu.Unlock()
	return len(w.rec.mu.acks)
}

// waitAcks waits (bounded) until n more puts than now are acknowledged and
// returns when the first of them was: the cluster is taking writes.
func (w *workload) waitAcks(t *testing.T, n int, timeout time.Duration) time.Time {
	t.Helper()
	from := w.acked()
	deadline := time.Now().Add(timeout)
	for w.acked() < from+n {
		if time.Now().After(deadline) {
			t.Fatalf("workload: %d of %d more puts acknowledged after %v", w.acked()-from, n, timeout)
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	w.rec.mu.Lock()
	defer w.rec.mu.Unlock()
	return w.rec.mu.acks[from]
}

// probeWrite measures a fault's write outage as a client sees it that
// retries quickly: from t0 it puts with a short timeout (250 ms) on a
// client of its own until one put is acknowledged, and returns how long
// after t0 that was. The probe's puts enter the history like any writer's.
// The workload's own writers are no measure: a put in flight when the
// leader dies waits for its client's full timeout.
func (w *workload) probeWrite(t *testing.T, t0 time.Time, timeout time.Duration) time.Duration {
	t.Helper()
	deadline := t0.Add(timeout)
	for seq := 0; ; seq++ {
		key, value := seq%linKeys, fmt.Sprintf("probe-%d", w.probeSeq)
		w.probeSeq++
		ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
		call := w.rec.now()
		resp, err := w.probe.Put(ctx, linKey(key), value)
		ret := w.rec.now()
		cancel()
		w.rec.mu.Lock()
		if err == nil {
			w.rec.mu.ops = append(w.rec.mu.ops, porcupine.Operation{
				ClientId: w.probeID, Call: call, Return: ret,
				Input:  linInput{put: true, key: key, value: value},
				Output: linOutput{rev: resp.Header.Revision},
			})
			w.rec.mu.acks = append(w.rec.mu.acks, time.Now())
		} else {
			w.rec.mu.failed = append(w.rec.mu.failed, failedPut{client: w.probeID, key: key, value: value, call: call})
		}
		w.rec.mu.Unlock()
		if err == nil {
			return time.Since(t0)
		}
		if time.Now().After(deadline) {
			t.Fatalf("write probe: no put acknowledged within %v of the fault: %v", timeout, err)
		}
		time.Sleep(10 * time.Millisecond) // retry interval
	}
}

// writeEvent is the put that created one revision.
type writeEvent struct {
	key   int
	value string
}

// stopAndCheck stops the clients and runs every check of the package
// comment against the members given (the ones that should hold the data:
// running and not removed).
func (w *workload) stopAndCheck(t *testing.T, members []*testutil.Member) {
	t.Helper()
	w.halt()
	cli := w.c.Client(t, endpointsOf(members)...)
	finalRev := settledRev(t, cli)
	events := readWriteHistory(t, cli, w.initRev, finalRev)

	rec := w.rec
	rec.mu.Lock()
	ops := append([]porcupine.Operation(nil), rec.mu.ops...)
	failed, serial := rec.mu.failed, rec.mu.serial
	rec.mu.Unlock()

	// (a) every acknowledged put is where its answer said.
	puts, gets := 0, 0
	for _, op := range ops {
		in, out := op.Input.(linInput), op.Output.(linOutput)
		if !in.put {
			gets++
			continue
		}
		puts++
		got, ok := events[out.rev]
		if !ok || got.key != in.key || got.value != in.value {
			t.Errorf("acknowledged put(k%d, %s) at revision %d lost: revision %d holds %+v (present %v)",
				in.key, in.value, out.rev, out.rev, got, ok)
		}
	}

	// Resolve failed puts against the write history.
	revOf := map[string]int64{}
	for rev, e := range events {
		revOf[e.value] = rev
	}
	applied := 0
	for _, f := range failed {
		rev, ok := revOf[f.value]
		if !ok {
			continue
		}
		applied++
		ops = append(ops, porcupine.Operation{
			ClientId: f.client, Call: f.call, Return: math.MaxInt64,
			Input:  linInput{put: true, key: f.key, value: f.value},
			Output: linOutput{rev: rev},
		})
	}
	t.Logf("history: revisions %d..%d; %d puts acknowledged, %d failed (%d of them took effect), %d linearizable gets, %d serializable gets",
		w.initRev, finalRev, puts, len(failed), applied, gets, len(serial))
	if puts+applied != int(finalRev-w.initRev) {
		t.Errorf("write history has %d revisions but the clients account for %d puts", finalRev-w.initRev, puts+applied)
	}

	// (b) linearizability of puts and linearizable gets.
	model := linModel(w.initRev)
	res, info := porcupine.CheckOperationsVerbose(model, ops, 60*time.Second)
	switch res {
	case porcupine.Ok:
	case porcupine.Illegal:
		path := filepath.Join(os.TempDir(), fmt.Sprintf("strata-%s-%d.html", sanitize(t.Name()), time.Now().UnixNano()))
		if err := porcupine.VisualizePath(model, info, path); err != nil {
			t.Errorf("history is not linearizable (visualization failed: %v)", err)
		} else {
			t.Errorf("history is not linearizable; visualization in %s", path)
		}
	default:
		t.Errorf("porcupine could not decide linearizability within 60 s (%d operations)", len(ops))
	}

	// (b') serializable reads: a consistent snapshot, monotonic per member.
	checkSerializable(t, serial, w.pinned, events, w.initRev, finalRev)

	// (c) every member converges on the same data and hash.
	checkConverged(t, members, events, w.initRev, finalRev)
}

// settledRev returns the cluster's revision once two linearizable reads
// a moment apart agree: a proposal a timed-out client left inside the
// cluster may still commit just after the clients stop.
func settledRev(t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	last := int64(-1)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := cli.Get(ctx, linPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
		if err == nil {
			if resp.Header.Revision == last {
				return last
			}
			last = resp.Header.Revision
		}
		time.Sleep(200 * time.Millisecond) // the settling interval itself
	}
	t.Fatalf("cluster revision did not settle within 15 s (last %d)", last)
	return 0
}

// readWriteHistory reconstructs which put created each revision in
// (from, to] from ranges at each revision, four revisions at a time.
func readWriteHistory(t *testing.T, cli *clientv3.Client, from, to int64) map[int64]writeEvent {
	t.Helper()
	var (
		mu     sync.Mutex
		events = map[int64]writeEvent{}
		errs   []error
		wg     sync.WaitGroup
		next   = make(chan int64)
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rev := range next {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := cli.Get(ctx, linPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev))
				cancel()
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Errorf("range at revision %d: %w", rev, err))
				}
				if resp != nil {
					for _, kv := range resp.Kvs {
						if kv.ModRevision == rev {
							var k int
							fmt.Sscanf(string(kv.Key), linPrefix+"k%d", &k)
							events[rev] = writeEvent{key: k, value: string(kv.Value)}
						}
					}
				}
				mu.Unlock()
			}
		}()
	}
	for rev := from + 1; rev <= to; rev++ {
		next <- rev
	}
	close(next)
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	for rev := from + 1; rev <= to; rev++ {
		if _, ok := events[rev]; !ok && len(errs) == 0 {
			t.Errorf("revision %d changed no key under %s: something else wrote, or a revision was skipped", rev, linPrefix)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return events
}

// stateAt replays the write history up to rev.
func stateAt(events map[int64]writeEvent, initRev, rev int64) linState {
	s := linState{rev: rev}
	for r := initRev + 1; r <= rev; r++ {
		e := events[r]
		s.vals[e.key], s.mods[e.key] = e.value, r
	}
	return s
}

// checkSerializable checks every serializable read against the write
// history at its header revision, and that each pinned client's header
// revisions never decrease while the member runs. Across a restart of the
// member they may today (a restarted member serves what it recovered before
// it hears the commit index; see TestClusterRestartedMemberKeepsRevision):
// such a step back is logged, not failed, so that this suite checks the
// rest.
func checkSerializable(t *testing.T, reads []serialRead, pinned map[int]string, events map[int64]writeEvent, initRev, finalRev int64) {
	t.Helper()
	states := make([]linState, finalRev-initRev+1)
	for r := initRev; r <= finalRev; r++ {
		states[r-initRev] = stateAt(events, initRev, r)
	}
	last := map[int]serialRead{}
	bad := 0
	for _, r := range reads {
		if prev, ok := last[r.client]; ok && r.headerRev < prev.headerRev {
			report := t.Errorf
			if prev.incarnation != r.incarnation || r.incarnation < 0 {
				report = t.Logf
			}
			report("serializable reads from member %s went back from revision %d (at %v, incarnation %d) to %d (at %v, incarnation %d)",
				pinned[r.client], prev.headerRev, prev.at.Round(time.Millisecond), prev.incarnation,
				r.headerRev, r.at.Round(time.Millisecond), r.incarnation)
		}
		last[r.client] = r
		if r.headerRev < initRev || r.headerRev > finalRev {
			t.Errorf("serializable read of k%d at header revision %d, outside the history %d..%d", r.key, r.headerRev, initRev, finalRev)
			continue
		}
		s := states[r.headerRev-initRev]
		if s.vals[r.key] != r.value || s.mods[r.key] != r.modRev {
			bad++
			if bad <= 5 {
				t.Errorf("serializable read of k%d at revision %d = %q mod %d; the history says %q mod %d",
					r.key, r.headerRev, r.value, r.modRev, s.vals[r.key], s.mods[r.key])
			}
		}
	}
}

// checkConverged waits (bounded) until every member has applied finalRev,
// then checks that each holds the final state and that all HashKVs at
// finalRev are equal.
func checkConverged(t *testing.T, members []*testutil.Member, events map[int64]writeEvent, initRev, finalRev int64) {
	t.Helper()
	want := stateAt(events, initRev, finalRev)
	hashes := map[string]uint32{}
	for _, m := range members {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.Endpoint()}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatalf("client for %s: %v", m.Name(), err)
		}
		defer cli.Close()
		deadline := time.Now().Add(15 * time.Second)
		var resp *clientv3.GetResponse
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			resp, err = cli.Get(ctx, linPrefix, clientv3.WithPrefix(), clientv3.WithSerializable())
			cancel()
			if err == nil && resp.Header.Revision >= finalRev {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("member %s did not apply revision %d within 15 s (last answer %v, error %v)", m.Name(), finalRev, resp, err)
			}
			time.Sleep(20 * time.Millisecond) // poll interval
		}
		if resp.Header.Revision != finalRev {
			t.Errorf("member %s is at revision %d after the history settled at %d", m.Name(), resp.Header.Revision, finalRev)
		}
		var got linState
		got.rev = resp.Header.Revision
		for _, kv := range resp.Kvs {
			var k int
			fmt.Sscanf(string(kv.Key), linPrefix+"k%d", &k)
			got.vals[k], got.mods[k] = string(kv.Value), kv.ModRevision
		}
		if got != want {
			t.Errorf("member %s holds %+v; the history ends in %+v", m.Name(), got, want)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		h, err := cli.HashKV(ctx, m.Endpoint(), finalRev)
		cancel()
		if err != nil {
			t.Errorf("hashkv of %s at %d: %v", m.Name(), finalRev, err)
			continue
		}
		hashes[m.Name()] = h.Hash
	}
	distinct := map[uint32]bool{}
	for _, h := range hashes {
		distinct[h] = true
	}
	if len(distinct) > 1 {
		t.Errorf("members' HashKV at revision %d differ: %v", finalRev, hashes)
	}
}

func endpointsOf(members []*testutil.Member) []string {
	var eps []string
	for _, m := range members {
		eps = append(eps, m.Endpoint())
	}
	return eps
}

// sanitize makes a test name usable in a file name.
func sanitize(name string) string {
	b := []byte(name)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '_'
		}
	}
	return string(b)
}
