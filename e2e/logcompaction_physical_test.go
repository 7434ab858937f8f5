package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/strata-kv/strata/internal/testutil"
)

// The operator scenario of issue 10, finding 1: log compaction in batches
// of 200 entries while a client compacts revisions physically every 300 ms,
// and kill -9. Before 41f6007 a batch built after physical compaction had
// removed a deletion or an overwritten version lacked it, so a member that
// replayed it at start-up brought deleted keys back and left keys at
// another mod_revision (the raft entries after the batch then applied to a
// different state and wrote different revisions); the review also saw the
// revision go backwards, and with three members the restarted one
// disagreed with the others. This test fails on cc01ea6 in all three cases.
//
// Since the fix a run of entries that revision compaction has reached is
// not compacted: it stays in the raft log (and blocks the runs after it)
// until the node's log truncation passes it. A compactor at the newest
// revision therefore refuses nearly every batch, and a test that only did
// that would never replay a batch. So each round has two phases: first the
// compactor stays behind the head (or skips a tick) until the member has
// built batches above its engine's durable index, which a kill makes it
// replay; then it compacts at the head until the member is seen refusing
// runs; then the member is killed.

const (
	// pcKeyCount keys are shared by pcWorkers clients, each owning every
	// pcWorkers-th key: a key's requests then come one after the other from
	// one client, so what it must hold after a restart follows from that
	// client's answers alone, without guessing how concurrent requests
	// were ordered.
	pcKeyCount = 2000
	pcWorkers  = 16
	pcPrefix   = "pck/"
	pcRounds   = 3
	// pcMaxRounds bounds the rounds a case runs on while a path is still
	// unexercised (pcCoverage): whether a kill lands with batches above the
	// engine's durable index depends on when its flushes complete, which
	// the load of the machine moves.
	pcMaxRounds = 8

	pcCompactEvery = 300 * time.Millisecond
	// pcBehind is how far below the newest revision the compactor compacts
	// in the build phase: a little more than the entries a member keeps
	// uncompacted (--log-compaction-batch plus --snapshot-catchup-entries),
	// so that it is close to the runs being built but usually below them.
	pcBehind = 500
	// pcStallEntries is how far the applied index must run ahead of the
	// log's snapshot point, the snapshot point standing still, before the
	// member is taken to refuse runs: three times the 400 entries a member
	// that compacts keeps.
	pcStallEntries = 1200
	// pcPhaseTimeout bounds each phase; a phase that times out is logged,
	// and the case fails at the end only if no round reached it. (Before
	// the fix no run was refused, so every head phase timed out.)
	pcPhaseTimeout = 30 * time.Second
	// pcBootstrapEntries: a run holding a configuration change is never
	// compacted, so until the log's first index is past the bootstrap
	// entries a stall says nothing about physical compaction.
	pcBootstrapEntries = 10
)

// pcFlags are the reviewed operator's flags (with --history latest or not).
var pcFlags = []string{"--log-compaction", "--log-compaction-batch=200", "--snapshot-catchup-entries=200"}

// pcPad makes values about 100 bytes, so that 2,000 keys are read back in
// one range and the load stays write-bound.
var pcPad = strings.Repeat("x", 80)

// pcKey is what the clients know about one key: the state the last
// acknowledged request on it left (or a read showed), at revision at, and
// the requests sent since whose answer was lost: the member was killed
// under them, so they may or may not have taken effect.
type pcKey struct {
	name    string
	present bool
	value   string
	mod     int64 // mod_revision, if present
	at      int64 // header revision of the answer the state comes from

	lostPuts   []string // values of puts (plain or in a txn) with lost answers
	lostDelete bool     // a delete (plain or in a txn) with a lost answer
}

// set records an acknowledged state; it supersedes every lost request
// before it, since the client sent it after their answers were lost.
func (k *pcKey) set(present bool, value string, mod, at int64) {
	k.present, k.value, k.mod, k.at = present, value, mod, at
	k.lostPuts, k.lostDelete = nil, false
}

// describe is what the clients know, for a failure message.
func (k *pcKey) describe() string {
	var s string
	if k.present {
		s = fmt.Sprintf("acknowledged %s at mod_revision %d (answer at revision %d)", short(k.value), k.mod, k.at)
	} else {
		s = fmt.Sprintf("acknowledged absent at revision %d", k.at)
	}
	if len(k.lostPuts) > 0 || k.lostDelete {
		var puts []string
		for _, v := range k.lostPuts {
			puts = append(puts, short(v))
		}
		s += fmt.Sprintf("; then requests with lost answers: puts %v, delete %v", puts, k.lostDelete)
	}
	return s
}

// check compares the key with what a member holds (kv nil: absent) and
// returns "" if the member may hold that, else the discrepancy.
func (k *pcKey) check(kv *mvccpb.KeyValue) string {
	switch {
	case kv == nil && (!k.present || k.lostDelete):
		return ""
	case kv == nil:
		return fmt.Sprintf("key %q is missing; %s", k.name, k.describe())
	case k.present && string(kv.Value) == k.value && kv.ModRevision == k.mod:
		return ""
	case slices.Contains(k.lostPuts, string(kv.Value)) && kv.ModRevision > k.at:
		return ""
	case !k.present:
		return fmt.Sprintf("deleted key %q came back: holds %s at mod_revision %d; %s", k.name, short(string(kv.Value)), kv.ModRevision, k.describe())
	}
	return fmt.Sprintf("key %q holds %s at mod_revision %d; %s", k.name, short(string(kv.Value)), kv.ModRevision, k.describe())
}

// short is a value without its padding, for messages: "w03-0000042-...".
func short(v string) string {
	if s, ok := strings.CutSuffix(v, pcPad); ok {
		return strconv.Quote(s + "...")
	}
	return strconv.Quote(v)
}

// pcWorker is one client and the keys it owns.
type pcWorker struct {
	id   int
	keys []*pcKey
	rng  *rand.Rand
	seq  int
	// Counts of acknowledged requests and of lost answers, since the last
	// round's report.
	puts, deletes, txnsThen, txnsElse, lost int
}

// step sends one random request on the worker's keys: a put, a delete, or
// a txn that compares a key's mod_revision with the one the worker knows,
// then puts it and deletes another key, or else reads it back.
func (w *pcWorker) step(ctx context.Context, cli *clientv3.Client, l *pcLoad) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	k := w.keys[w.rng.IntN(len(w.keys))]
	w.seq++
	value := fmt.Sprintf("w%02d-%07d-%s", w.id, w.seq, pcPad)
	switch r := w.rng.IntN(100); {
	case r < 50:
		resp, err := cli.Put(ctx, k.name, value)
		if err != nil {
			k.lostPuts = append(k.lostPuts, value)
			return err
		}
		l.see(resp.Header.Revision)
		k.set(true, value, resp.Header.Revision, resp.Header.Revision)
		w.puts++
	case r < 80:
		resp, err := cli.Delete(ctx, k.name)
		if err != nil {
			k.lostDelete = true
			return err
		}
		l.see(resp.Header.Revision)
		k.set(false, "", 0, resp.Header.Revision)
		w.deletes++
	default:
		k2 := w.keys[w.rng.IntN(len(w.keys))]
		for k2 == k {
			k2 = w.keys[w.rng.IntN(len(w.keys))]
		}
		// After a lost answer the worker's mod_revision is stale and the
		// compare fails; the else branch then tells it the key's state.
		// One txn in four compares with a wrong mod_revision on purpose,
		// so that the else branch is taken without a kill too.
		mod := k.mod
		if w.rng.IntN(4) == 0 {
			mod++
		}
		resp, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(k.name), "=", mod)).
			Then(clientv3.OpPut(k.name, value), clientv3.OpDelete(k2.name)).
			Else(clientv3.OpGet(k.name)).
			Commit()
		if err != nil {
			k.lostPuts = append(k.lostPuts, value)
			k2.lostDelete = true
			return err
		}
		rev := resp.Header.Revision
		l.see(rev)
		if resp.Succeeded {
			k.set(true, value, rev, rev)
			k2.set(false, "", 0, rev)
			w.txnsThen++
			break
		}
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 1 {
			k.set(true, string(kvs[0].Value), kvs[0].ModRevision, rev)
		} else {
			k.set(false, "", 0, rev)
		}
		w.txnsElse++
	}
	return nil
}

// Compactor modes.
const (
	pcModeBuild int32 = iota // behind the head, or skip: batches get built
	pcModeHead               // at the head: runs are refused
)

// pcLoad is the workers, the compacting client, and the highest revision
// any answer carried, across every incarnation of the members.
//
// Concurrency: workers touch only their own keys; the test goroutine reads
// the keys between halt and the next start. rev and mode are atomic.
type pcLoad struct {
	seed    uint64
	workers []*pcWorker
	rev     atomic.Int64
	mode    atomic.Int32
	crng    *rand.Rand // the compactor's

	cancel context.CancelFunc
	wg     sync.WaitGroup
	// Compactor counts since the last report: compactions done at the head
	// or behind it, refused as already compacted, failed otherwise, and
	// ticks skipped. Written by the compactor, read after halt.
	atHead, behind, already, failed, skipped int
}

func newPCLoad(seed uint64) *pcLoad {
	l := &pcLoad{seed: seed, crng: rand.New(rand.NewPCG(seed, 1<<32))}
	for i := range pcWorkers {
		l.workers = append(l.workers, &pcWorker{id: i, rng: rand.New(rand.NewPCG(seed, uint64(i)))})
	}
	for i := range pcKeyCount {
		w := l.workers[i%pcWorkers]
		w.keys = append(w.keys, &pcKey{name: fmt.Sprintf("%s%04d", pcPrefix, i)})
	}
	return l
}

// see records a revision an answer carried.
func (l *pcLoad) see(rev int64) {
	for {
		cur := l.rev.Load()
		if rev <= cur || l.rev.CompareAndSwap(cur, rev) {
			return
		}
	}
}

// start runs the workers on cli and the compactor on ccli until halt.
func (l *pcLoad) start(cli, ccli *clientv3.Client) {
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	l.mode.Store(pcModeBuild)
	for _, w := range l.workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for ctx.Err() == nil {
				if err := w.step(ctx, cli, l); err != nil {
					w.lost++
					// The member is down: do not spin.
					select {
					case <-ctx.Done():
					case <-time.After(20 * time.Millisecond):
					}
				}
			}
		}()
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		tick := time.NewTicker(pcCompactEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			l.compact(ctx, ccli)
		}
	}()
}

// compact is one tick of the compacting client: a physical compaction at
// the newest revision any answer carried (the current revision, to within
// the requests in flight), or (build phase) pcBehind below it, or none.
func (l *pcLoad) compact(ctx context.Context, cli *clientv3.Client) {
	head := l.rev.Load()
	target := head
	if l.mode.Load() == pcModeBuild {
		if l.crng.IntN(3) == 0 {
			l.skipped++
			return
		}
		target = head - pcBehind
	} else if l.crng.IntN(5) == 0 {
		l.skipped++
		return
	}
	if target <= 1 {
		l.skipped++
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := cli.Compact(ctx, target, clientv3.WithCompactPhysical())
	switch {
	case err == nil:
		l.see(resp.Header.Revision)
		if target == head {
			l.atHead++
		} else {
			l.behind++
		}
	case errors.Is(rpctypes.Error(err), rpctypes.ErrCompacted):
		// An earlier compaction went further: nothing to do.
		l.already++
	default:
		l.failed++ // the member was killed under it
	}
}

// halt stops the workers and the compactor and waits for them. Requests in
// flight are cancelled: their answers are lost (pcKey.lostPuts).
func (l *pcLoad) halt() {
	l.cancel()
	l.wg.Wait()
}

// report sums the counts since the last report and resets them.
func (l *pcLoad) report() string {
	var puts, dels, then, els, lost int
	for _, w := range l.workers {
		puts, dels, then, els, lost = puts+w.puts, dels+w.deletes, then+w.txnsThen, els+w.txnsElse, lost+w.lost
		w.puts, w.deletes, w.txnsThen, w.txnsElse, w.lost = 0, 0, 0, 0, 0
	}
	s := fmt.Sprintf("acknowledged %d puts, %d deletes, %d txns (%d took the else branch), %d lost answers; "+
		"compactions: %d at the head, %d behind, %d already compacted, %d failed, %d ticks skipped",
		puts, dels, then+els, els, lost, l.atHead, l.behind, l.already, l.failed, l.skipped)
	l.atHead, l.behind, l.already, l.failed, l.skipped = 0, 0, 0, 0, 0
	return s
}

// checkMember reads the whole key space from endpoint (serializable, so
// that the answer is that member's own state) and compares it with what
// the clients know. It returns the member's keys and the header revision,
// and reports every discrepancy as a test error. The load must be halted.
func (l *pcLoad) checkMember(t *testing.T, name, endpoint string) (map[string]*mvccpb.KeyValue, int64) {
	t.Helper()
	cli := pcClient(t, endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := cli.Status(ctx, endpoint)
	if err != nil {
		t.Fatalf("%s: status: %v", name, err)
	}
	if st.Header.Revision < l.rev.Load() {
		t.Errorf("%s: revision went backwards: Status says %d, an earlier answer said %d", name, st.Header.Revision, l.rev.Load())
	}
	resp, err := cli.Get(ctx, pcPrefix, clientv3.WithPrefix(), clientv3.WithSerializable())
	if err != nil {
		t.Fatalf("%s: range over %s: %v", name, pcPrefix, err)
	}
	if resp.Header.Revision < l.rev.Load() {
		t.Errorf("%s: revision went backwards: range answered at %d, an earlier answer said %d", name, resp.Header.Revision, l.rev.Load())
	}
	got := map[string]*mvccpb.KeyValue{}
	for _, kv := range resp.Kvs {
		got[string(kv.Key)] = kv
		if kv.ModRevision > resp.Header.Revision {
			t.Errorf("%s: key %q at mod_revision %d, above the revision %d", name, kv.Key, kv.ModRevision, resp.Header.Revision)
		}
	}
	// By kind, so that a few of each are shown.
	var resurrected, wrong, missing, unexpected []string
	for _, w := range l.workers {
		for _, k := range w.keys {
			kv := got[k.name]
			msg := k.check(kv)
			switch {
			case msg == "":
			case kv == nil:
				missing = append(missing, msg)
			case !k.present:
				resurrected = append(resurrected, msg)
			default:
				wrong = append(wrong, msg)
			}
		}
	}
	for key := range got {
		if n, err := strconv.Atoi(strings.TrimPrefix(key, pcPrefix)); err != nil || n < 0 || n >= pcKeyCount {
			unexpected = append(unexpected, fmt.Sprintf("unexpected key %q", key))
		}
	}
	if len(resurrected)+len(wrong)+len(missing)+len(unexpected) > 0 {
		t.Errorf("%s at revision %d: %d acknowledged deletes came back, %d keys hold another value or mod_revision, %d acknowledged keys missing, %d unexpected keys (seed %d)",
			name, resp.Header.Revision, len(resurrected), len(wrong), len(missing), len(unexpected), l.seed)
		for _, errs := range [][]string{resurrected, wrong, missing, unexpected} {
			sort.Strings(errs)
			for i, e := range errs {
				if i == 8 {
					t.Errorf("%s: ... and %d more of this kind", name, len(errs)-8)
					break
				}
				t.Errorf("%s: %s", name, e)
			}
		}
	}
	return got, resp.Header.Revision
}

// resolve makes a member's checked state what the clients know: the read
// answered after every request with a lost answer had either taken effect
// or been lost for good, so from now on the member must keep that state.
func (l *pcLoad) resolve(got map[string]*mvccpb.KeyValue, rev int64) {
	for _, w := range l.workers {
		for _, k := range w.keys {
			if kv := got[k.name]; kv != nil {
				k.set(true, string(kv.Value), kv.ModRevision, rev)
			} else {
				k.set(false, "", 0, rev)
			}
		}
	}
	l.see(rev)
}

// pcClient is a client on endpoints, closed at cleanup, that redials a
// restarted member within 200 ms (gRPC's default backoff grows to minutes).
func pcClient(t *testing.T, endpoints ...string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 200 * time.Millisecond},
			MinConnectTimeout: time.Second,
		})},
	})
	if err != nil {
		t.Fatalf("client for %v: %v", endpoints, err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// pcLogState is what a member's /metrics say about its raft log and
// engine.
type pcLogState struct {
	first       int64 // the log's first index: its snapshot point is first-1
	applied     int64 // the engine's applied index
	durable     int64 // the engine's durable index (its last flush)
	compactions int64 // batch files written by this incarnation
}

// snapPoint is the log's snapshot point: batch files end there.
func (s pcLogState) snapPoint() int64 { return s.first - 1 }

// scrapeLogState reads a member's log state. The member may be killed
// under it, so an error is returned, not fatal.
func scrapeLogState(endpoint string) (pcLogState, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+"/metrics", nil)
	if err != nil {
		return pcLogState{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return pcLogState{}, err
	}
	defer resp.Body.Close()
	want := map[string]*int64{}
	var s pcLogState
	want["strata_raftlog_first_index"] = &s.first
	want["strata_engine_applied_index"] = &s.applied
	want["strata_engine_durable_index"] = &s.durable
	want["strata_raftlog_compactions_total"] = &s.compactions
	found := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if p := want[k]; ok && p != nil {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return pcLogState{}, fmt.Errorf("metric %s = %q: %v", k, v, err)
			}
			*p = int64(f)
			found++
		}
	}
	if err := sc.Err(); err != nil {
		return pcLogState{}, err
	}
	if found != len(want) {
		return pcLogState{}, fmt.Errorf("metrics of %s: %d of %d log metrics found", endpoint, found, len(want))
	}
	return s, nil
}

// pcRound is what the phases of one round saw.
type pcRound struct {
	built   bool // batches above the engine's durable index
	refused bool // runs refused: the snapshot point stood still
	last    pcLogState
}

// drivePhases runs the two phases of a round against the member at
// endpoint while the load runs (see the comment at the top), then waits a
// random moment so that the kill lands anywhere in the refusing phase.
func drivePhases(t *testing.T, endpoint string, l *pcLoad, rng *rand.Rand, killAfterBuild bool) pcRound {
	t.Helper()
	var r pcRound
	poll := func(done func(s pcLogState) bool) bool {
		deadline := time.Now().Add(pcPhaseTimeout)
		for time.Now().Before(deadline) {
			s, err := scrapeLogState(endpoint)
			if err == nil {
				r.last = s
				if done(s) {
					return true
				}
			}
			time.Sleep(100 * time.Millisecond) // poll interval
		}
		return false
	}
	// Build phase: a batch built in this round, ending above the durable
	// index, so that a kill now leaves it for the restart to replay. (The
	// snapshot point may be above the durable index already: after a
	// restart, from the batches just replayed; on a member of a cluster
	// not killed last round, from batches built then. A member that
	// refused a run last round builds none until a truncation passes it.)
	l.mode.Store(pcModeBuild)
	base := int64(-1)
	r.built = poll(func(s pcLogState) bool {
		if base < 0 {
			base = s.compactions
		}
		return s.compactions > base && s.snapPoint() > s.durable
	})
	if !r.built {
		t.Logf("build phase: no batch above the durable index after %v (last %+v)", pcPhaseTimeout, r.last)
	} else if killAfterBuild {
		// The kill lands at once, before the engine's next flush (every
		// memtable's worth of writes: about a second at full load) passes
		// the batch just built, so that the restart replays it.
		return r
	} else {
		// A few more batches, some rounds: more records to replay.
		time.Sleep(time.Duration(rng.IntN(1000)) * time.Millisecond)
	}
	// Head phase. Once a compaction at the head has reached the run after
	// the snapshot point, the member refuses it until a truncation passes
	// it: the snapshot point stands still while the applied index runs on.
	l.mode.Store(pcModeHead)
	var from pcLogState
	r.refused = poll(func(s pcLogState) bool {
		if s.first != from.first {
			from = s // a batch was built, or the log truncated: start again
			return false
		}
		return s.first > pcBootstrapEntries && s.applied-s.snapPoint() >= pcStallEntries
	})
	if !r.refused {
		t.Logf("head phase: the log's snapshot point never stood still for %d entries in %v (last %+v)", pcStallEntries, pcPhaseTimeout, r.last)
	}
	// Where the kill lands in the write stream; this synchronises nothing.
	time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond)
	return r
}

// replayedBatches returns the batches and records the start-up log line
// "replayed compacted log batches" of out counts, 0 if there is none.
func replayedBatches(out string) (batches, records int) {
	for _, line := range strings.Split(out, "\n") {
		if !strings.Contains(line, "replayed compacted log batches") {
			continue
		}
		var m struct {
			Msg     string `json:"msg"`
			Batches int    `json:"batches"`
			Records int    `json:"records"`
		}
		if json.Unmarshal([]byte(line), &m) == nil && m.Msg == "replayed compacted log batches" {
			batches += m.Batches
			records += m.Records
		}
	}
	return batches, records
}

// pcCoverage counts the rounds that exercised each path; a case whose
// rounds never did fails, since it tested nothing of the scenario.
type pcCoverage struct {
	built, refused, replayed int
}

// complete reports whether every path was exercised.
func (c pcCoverage) complete() bool { return c.built > 0 && c.refused > 0 && c.replayed > 0 }

func (c pcCoverage) check(t *testing.T) {
	t.Helper()
	if c.built == 0 {
		t.Errorf("no round built a compacted batch above the engine's durable index: the test did not exercise batches")
	}
	if c.refused == 0 {
		t.Errorf("no round saw the member refuse a run that physical compaction had reached")
	}
	if c.replayed == 0 {
		t.Errorf("no restart replayed compacted batches (log line \"replayed compacted log batches\"): the test did not exercise the recovery path")
	}
}

// TestLogCompactionPhysicalCompactKill is the scenario on one member, with
// full history and with --history latest: clients put, delete and run txns
// over 2,000 keys while another compacts physically every 300 ms; the
// member is killed with SIGKILL and restarted, three times (up to
// pcMaxRounds while a path is unexercised). After each
// restart every acknowledged write must be there (a put with its value and
// mod_revision, a delete absent) unless a later acknowledged one on the
// key superseded it, and the revision must not have gone backwards.
func TestLogCompactionPhysicalCompactKill(t *testing.T) {
	testutil.RequireEngine(t, "appendlog writes every commit through to its files, so a kill -9 loses nothing the engine applied and a restart never replays compacted batches: the recovery path these tests must reach does not exist there", "pebble", "bbolt", "hybridlog")
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"full history", nil},
		{"history latest", []string{"--history=latest"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(seed, 2<<32))
			p := testutil.StartProcess(t, testutil.Options{Binary: binary(t, strata), Flags: append(append([]string(nil), pcFlags...), tc.flags...)})
			l := newPCLoad(seed)
			var cov pcCoverage
			for round := 0; round < pcRounds || (round < pcMaxRounds && !cov.complete()); round++ {
				start := time.Now()
				cli := pcClient(t, p.Endpoint())
				l.start(cli, cli)
				// Late rounds that still lack a replay kill right after
				// the build phase: otherwise whether a kill lands before
				// the next flush is left to the machine's speed.
				r := drivePhases(t, p.Endpoint(), l, rng, round >= pcRounds && cov.replayed == 0)
				p.Kill()
				l.halt()
				p.Restart()
				batches, records := replayedBatches(p.CurrentOutput())
				cov.built += btoi(r.built)
				cov.refused += btoi(r.refused)
				cov.replayed += btoi(batches > 0)
				t.Logf("round %d (%v): %s; log at kill: first index %d, applied %d, durable %d, %d batches built; restart replayed %d batches (%d records)",
					round, time.Since(start).Round(time.Millisecond), l.report(), r.last.first, r.last.applied, r.last.durable, r.last.compactions, batches, records)
				got, rev := l.checkMember(t, p.Name(), p.Endpoint())
				if t.Failed() {
					return
				}
				l.resolve(got, rev)
			}
			cov.check(t)
		})
	}
}

// TestClusterLogCompactionPhysicalCompactKill is the scenario on three
// members: each round kills one member with SIGKILL (a follower, the
// leader, then either; later rounds, run while a path is unexercised as in
// the one-member test, a follower or either), lets the others take writes
// for a moment, and restarts it. Once every member is at the same revision, HashKV there
// must be equal on all three, and the checks of the one-member test must
// pass through every member with serializable reads pinned to it: the
// restarted one first.
func TestClusterLogCompactionPhysicalCompactKill(t *testing.T) {
	testutil.RequireEngine(t, "appendlog writes every commit through to its files, so a kill -9 loses nothing the engine applied and a restart never replays compacted batches: the recovery path these tests must reach does not exist there", "pebble", "bbolt", "hybridlog")
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2<<32))
	// Three members on two cores take a fifth of one member's writes, and
	// a round builds batches only after a truncation (an engine flush
	// every --snapshot-count entries, 10,000 by default) has passed the
	// run refused in the round before: flush more often, so that a round
	// takes seconds rather than half a minute. It changes how much a
	// restart replays, not how.
	c := startTestCluster(t, 3, append([]string{"--snapshot-count=4000"}, pcFlags...)...)
	l := newPCLoad(seed)
	var cov pcCoverage
	for round := 0; round < pcRounds || (round < pcMaxRounds && !cov.complete()); round++ {
		start := time.Now()
		leader := leaderIndex(t, c)
		victim := followers(c, leader)[rng.IntN(2)]
		if round == 1 || (round == 2 && rng.IntN(2) == 0) {
			victim = leader
		}
		m := c.Members[victim]
		cli := pcClient(t, c.Endpoints()...)
		l.start(cli, pcClient(t, c.Endpoints()...))
		r := drivePhases(t, m.Endpoint(), l, rng, round >= pcRounds && cov.replayed == 0)
		m.Kill()
		// The member falls behind: it catches up after its restart from
		// the leader's log, batches or a snapshot.
		time.Sleep(time.Duration(500+rng.IntN(1000)) * time.Millisecond)
		l.halt()
		c.RestartMembers(victim)
		batches, records := replayedBatches(m.CurrentOutput())
		cov.built += btoi(r.built)
		cov.refused += btoi(r.refused)
		cov.replayed += btoi(batches > 0)
		role := "follower"
		if victim == leader {
			role = "leader"
		}
		t.Logf("round %d (%v): killed %s %s; %s; its log at kill: first index %d, applied %d, durable %d, %d batches built; restart replayed %d batches (%d records)",
			round, time.Since(start).Round(time.Millisecond), role, m.Name(), l.report(), r.last.first, r.last.applied, r.last.durable, r.last.compactions, batches, records)

		revs := pcSettle(t, c)
		rev := revs[victim]
		if slices.ContainsFunc(revs, func(r int64) bool { return r != rev }) {
			// HashKV at one revision means nothing then; the checks below
			// show where the members differ.
			t.Errorf("members disagree at the same applied index: revisions %v (restarted %s at %d)", revs, m.Name(), rev)
		} else {
			want := hashKV(t, m.Endpoint(), rev)
			for _, o := range c.Members {
				if got := hashKV(t, o.Endpoint(), rev); got != want {
					t.Errorf("HashKV at revision %d: restarted %s %d, %s %d", rev, m.Name(), want, o.Name(), got)
				}
			}
		}
		got, grev := l.checkMember(t, m.Name(), m.Endpoint())
		for i, o := range c.Members {
			if i != victim {
				l.checkMember(t, o.Name(), o.Endpoint())
			}
		}
		if t.Failed() {
			return
		}
		l.resolve(got, grev)
	}
	cov.check(t)
}

// pcSettle waits until every member has applied the same raft index (the
// load is halted, so it no longer moves) and returns the members'
// revisions there: equal, unless a member diverged.
func pcSettle(t *testing.T, c *testutil.Cluster) []int64 {
	t.Helper()
	clients := make([]*clientv3.Client, len(c.Members))
	for i, m := range c.Members {
		clients[i] = pcClient(t, m.Endpoint())
	}
	deadline := time.Now().Add(faultTimeout)
	var applied, revs []uint64
	for time.Now().Before(deadline) {
		applied, revs = applied[:0], revs[:0]
		for i, cli := range clients {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			st, err := cli.Status(ctx, c.Members[i].Endpoint())
			cancel()
			if err != nil {
				break
			}
			applied = append(applied, st.RaftAppliedIndex)
			revs = append(revs, uint64(st.Header.Revision))
		}
		if len(applied) == len(clients) && !slices.ContainsFunc(applied, func(a uint64) bool { return a != applied[0] }) {
			out := make([]int64, len(revs))
			for i, r := range revs {
				out[i] = int64(r)
			}
			return out
		}
		time.Sleep(100 * time.Millisecond) // poll interval
	}
	t.Fatalf("members not at the same applied index after %v: %v", faultTimeout, applied)
	return nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
