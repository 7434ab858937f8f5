package member

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/strata-kv/strata/apply"
	"github.com/strata-kv/strata/logcompact"
	"github.com/strata-kv/strata/mvcc"
)

var (
	mixedRounds = flag.Int("mixed-rounds", 6, "power cuts in TestPowerCutMixed (the soak run uses hundreds)")
	mixedSeed   = flag.Uint64("mixed-seed", 0, "seed of TestPowerCutMixed; 0 picks one from the clock (printed)")
)

// TestPowerCutMixed runs, on a file system that can lose power
// (vfs.CrashableMem), a member with every feature that touches durability
// turned on at random -- log compaction in small batches with
// --history latest or full history and either recovery strategy, engine
// flushes every few entries, auto-compaction -- under a load of puts,
// deletes, txns, lease grants, revocations and expiry, and physical and
// non-physical revision compactions, and cuts power at random instants
// (some of the unsynced data survives in half the rounds). After each cut
// it restarts the member on what survived and checks it against a model of
// etcd's semantics built from the acknowledged answers:
//
//   - every key whose last acknowledged operation is known holds exactly
//     what that operation left: the value and mod revision of a put, absent
//     after a delete (a txn's branch, a lease revocation);
//   - a read at the revision of an acknowledged put returns that put, or is
//     refused as compacted (never another value);
//   - the compact revision is at least every acknowledged compaction's, and
//     the revision never goes backwards.
//
// Keys with an operation in flight at the cut, or attached to a lease that
// may expire, are unknown until their next acknowledged operation. Each
// worker owns its keys, so their operations are ordered.
//
// Reproduce a failure with -mixed-seed; a soak run:
// go test -run TestPowerCutMixed ./member/ -mixed-rounds 200
func TestPowerCutMixed(t *testing.T) {
	seed := *mixedSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (-mixed-seed %d reproduces it)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 99))
	fs := vfs.NewCrashableMem()
	model := newMixedModel()
	var lastRev int64
	batchRounds := 0 // rounds that started with compacted batch files
	for round := 0; round < *mixedRounds; round++ {
		adjust := randomDurabilityConfig(rng)
		m := startInMemory(t, fs, "mixed", adjust)
		t.Logf("round %d: snapshot count %d, log compaction %+v, auto-compaction %q", round,
			m.cfg.SnapshotCount, m.cfg.LogCompaction, m.cfg.AutoCompactionRetention)
		if bs, err := m.log.CompactedBatches(0); err == nil && len(bs) > 0 {
			batchRounds++
		}
		if round > 0 {
			if err := model.check(m.Store(), lastRev); err != nil {
				t.Fatalf("seed %d, round %d, after the power cut: %v", seed, round, err)
			}
		}
		lastRev = m.Store().Rev()
		model.thaw()

		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for w := range 4 {
			wrng := rand.New(rand.NewPCG(seed, uint64(round*16+w)))
			wg.Go(func() { model.work(ctx, m, wrng, w) })
		}
		crng := rand.New(rand.NewPCG(seed, uint64(round*16+15)))
		wg.Go(func() { model.compact(ctx, m, crng) })
		time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond)
		model.waitAcks(20 * time.Second)

		// The power cut: what was acknowledged until now must survive.
		cfg := vfs.CrashCloneCfg{}
		if rng.IntN(2) == 1 {
			cfg = vfs.CrashCloneCfg{UnsyncedDataPercent: rng.IntN(100), RNG: rng}
		}
		model.mu.Lock()
		clone := fs.CrashClone(cfg)
		model.cut()
		model.mu.Unlock()
		cancel()
		wg.Wait()
		if err := m.Stop(); err != nil {
			t.Fatalf("stop: %v", err)
		}
		fs = clone
	}
	m := startInMemory(t, fs, "mixed", randomDurabilityConfig(rng))
	defer func() { _ = m.Stop() }()
	if err := model.check(m.Store(), lastRev); err != nil {
		t.Fatalf("seed %d, after the last power cut: %v", seed, err)
	}
	t.Logf("%d power cuts, %d started with compacted batches, %d keys known at the end, %d acknowledged operations",
		*mixedRounds, batchRounds, model.known(), model.acks)
}

// randomDurabilityConfig turns on, at random, what touches durability.
func randomDurabilityConfig(rng *rand.Rand) func(*Config) {
	snapshotCount := uint64(20 + rng.IntN(150))
	batch := uint64(5 + rng.IntN(60))
	latest := rng.IntN(2) == 0
	strategy := logcompact.RecoveryNaive
	if rng.IntN(2) == 0 {
		strategy = logcompact.RecoveryDescending
	}
	autoCompact := rng.IntN(3) == 0
	return func(cfg *Config) {
		cfg.SnapshotCount = snapshotCount
		cfg.CatchUpEntries = 10
		cfg.LogCompaction = logcompact.Config{Enabled: true, BatchEntries: batch, HistoryLatest: latest,
			RecoveryStrategy: strategy, Interval: 10 * time.Millisecond}
		if autoCompact {
			cfg.AutoCompactionMode, cfg.AutoCompactionRetention = "revision", "200"
		}
	}
}

// keyState is what the model knows of one key.
type keyState struct {
	known   bool // false: an operation's outcome, or a lease expiry, is unknown
	present bool
	value   string
	modRev  int64
	lease   int64 // the lease the key is attached to, if present
	expires bool  // attached to a lease that may expire
}

// putAt is an acknowledged put: a read at its revision must return it or
// be refused as compacted.
type putAt struct {
	key, value string
	rev        int64
}

type mixedModel struct {
	mu         sync.Mutex
	keys       map[string]*keyState
	inflight   map[string]bool
	puts       []putAt
	compactRev int64 // the highest acknowledged compaction
	acks       int
	// frozen is set at a cut: answers after it are from a member whose
	// state did not survive, and change nothing.
	frozen bool
	// snapshot, taken at the cut, is what check compares against.
	snapKeys    map[string]keyState
	snapPuts    []putAt
	snapCompact int64
}

func newMixedModel() *mixedModel {
	// -1: no compaction yet, as the store says.
	return &mixedModel{keys: map[string]*keyState{}, inflight: map[string]bool{}, compactRev: -1, snapCompact: -1}
}

// cut records the model at the instant of a power cut.
// REQUIRES: mu held.
func (md *mixedModel) cut() {
	md.snapKeys = map[string]keyState{}
	for k, s := range md.keys {
		st := *s
		if md.inflight[k] || st.expires {
			st.known = false
		}
		md.snapKeys[k] = st
	}
	md.snapPuts = append([]putAt(nil), md.puts...)
	md.snapCompact = md.compactRev
	// The next round starts from what survived.
	md.keys = map[string]*keyState{}
	for k, st := range md.snapKeys {
		md.keys[k] = &st
	}
	md.frozen = true
}

// thaw starts a round: answers count again.
func (md *mixedModel) thaw() {
	md.mu.Lock()
	md.frozen = false
	md.inflight = map[string]bool{}
	md.mu.Unlock()
}

func (md *mixedModel) known() int {
	md.mu.Lock()
	defer md.mu.Unlock()
	n := 0
	for _, s := range md.keys {
		if s.known {
			n++
		}
	}
	return n
}

// waitAcks waits for some acknowledged operations (a loaded machine may
// take a while to answer the first ones).
func (md *mixedModel) waitAcks(timeout time.Duration) {
	start := md.ackCount()
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline) && md.ackCount() < start+5; {
		time.Sleep(5 * time.Millisecond)
	}
}

func (md *mixedModel) ackCount() int {
	md.mu.Lock()
	defer md.mu.Unlock()
	return md.acks
}

// begin marks keys as having an operation in flight.
func (md *mixedModel) begin(keys ...string) {
	md.mu.Lock()
	for _, k := range keys {
		md.inflight[k] = true
		if md.keys[k] == nil {
			md.keys[k] = &keyState{known: true}
		}
	}
	md.mu.Unlock()
}

// end records the outcome of an operation on keys: apply, if the
// operation was acknowledged, updates their states (under mu); otherwise
// their outcome is unknown.
func (md *mixedModel) end(acked bool, apply func(), keys ...string) {
	md.mu.Lock()
	defer md.mu.Unlock()
	for _, k := range keys {
		delete(md.inflight, k)
	}
	if md.frozen {
		return
	}
	for _, k := range keys {
		if !acked {
			md.keys[k].known = false
		}
	}
	if acked {
		md.acks++
		apply()
	}
}

// proposer is where the load's operations go: a member (TestPowerCutMixed)
// or a cluster that hands each one to its current leader
// (TestPowerCutMixedCluster). Store is read only for its revision and
// compact revision, which the compactor aims at.
type proposer interface {
	Propose(ctx context.Context, req *pb.InternalRaftRequest) (apply.Result, error)
	Store() *mvcc.Store
}

// work runs one worker's operations on its own keys until ctx ends.
func (md *mixedModel) work(ctx context.Context, m proposer, rng *rand.Rand, w int) {
	key := func() string { return fmt.Sprintf("w%d/k%02d", w, rng.IntN(24)) }
	var leases []int64
	expiring := map[int64]bool{}
	leaseKeys := map[int64][]string{}
	for i := 0; ctx.Err() == nil; i++ {
		switch p := rng.IntN(100); {
		case p < 45: // put, sometimes with a lease
			k, v := key(), fmt.Sprintf("v%d-%d", w, i)
			var lease int64
			if len(leases) > 0 && rng.IntN(4) == 0 {
				lease = leases[rng.IntN(len(leases))]
			}
			md.begin(k)
			res, err := m.Propose(ctx, &pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte(k), Value: []byte(v), Lease: lease}})
			acked := err == nil && res.Err == nil
			md.end(acked, func() {
				rev := res.Response.(*pb.PutResponse).Header.Revision
				md.keys[k] = &keyState{known: true, present: true, value: v, modRev: rev, lease: lease, expires: expiring[lease]}
				md.puts = append(md.puts, putAt{key: k, value: v, rev: rev})
			}, k)
			if acked && lease != 0 {
				leaseKeys[lease] = append(leaseKeys[lease], k)
			}
		case p < 60: // delete
			k := key()
			md.begin(k)
			res, err := m.Propose(ctx, &pb.InternalRaftRequest{DeleteRange: &pb.DeleteRangeRequest{Key: []byte(k)}})
			md.end(err == nil && res.Err == nil, func() { md.keys[k] = &keyState{known: true} }, k)
		case p < 75: // txn: if k1 is unchanged since we last saw it, put k2 and delete k3, else put k1
			k1, k2, k3 := fmt.Sprintf("w%d/t%d", w, rng.IntN(4)), key(), key()
			if k2 == k3 {
				continue
			}
			md.mu.Lock()
			s1 := md.keys[k1]
			var modRev int64
			if s1 != nil {
				modRev = s1.modRev
			}
			md.mu.Unlock()
			v := fmt.Sprintf("t%d-%d", w, i)
			req := &pb.TxnRequest{
				Compare: []*pb.Compare{{Key: []byte(k1), Target: pb.Compare_MOD, Result: pb.Compare_EQUAL,
					TargetUnion: &pb.Compare_ModRevision{ModRevision: modRev}}},
				Success: []*pb.RequestOp{
					{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(k2), Value: []byte(v)}}},
					{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte(k3)}}},
				},
				Failure: []*pb.RequestOp{
					{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(k1), Value: []byte(v)}}},
				},
			}
			md.begin(k1, k2, k3)
			res, err := m.Propose(ctx, &pb.InternalRaftRequest{Txn: req})
			md.end(err == nil && res.Err == nil, func() {
				resp := res.Response.(*pb.TxnResponse)
				rev := resp.Header.Revision
				if resp.Succeeded {
					md.keys[k2] = &keyState{known: true, present: true, value: v, modRev: rev}
					md.keys[k3] = &keyState{known: true}
					md.puts = append(md.puts, putAt{key: k2, value: v, rev: rev})
				} else {
					md.keys[k1] = &keyState{known: true, present: true, value: v, modRev: rev}
					md.puts = append(md.puts, putAt{key: k1, value: v, rev: rev})
				}
			}, k1, k2, k3)
		case p < 82: // grant: most leases live long, some expire within the run
			id := 1 + rng.Int64N(1<<40)
			ttl := int64(3600)
			if rng.IntN(3) == 0 {
				ttl = 1 // raised to the lessor's minimum: expires within seconds
			}
			res, err := m.Propose(ctx, &pb.InternalRaftRequest{LeaseGrant: &pb.LeaseGrantRequest{ID: id, TTL: ttl}})
			if err == nil && res.Err == nil {
				expiring[id] = ttl == 1
				leases = append(leases, id)
			}
		case p < 88 && len(leases) > 0: // revoke: its keys are deleted
			j := rng.IntN(len(leases))
			id := leases[j]
			leases = append(leases[:j], leases[j+1:]...)
			attached := leaseKeys[id]
			delete(leaseKeys, id)
			md.begin(attached...)
			res, err := m.Propose(ctx, &pb.InternalRaftRequest{LeaseRevoke: &pb.LeaseRevokeRequest{ID: id}})
			acked := err == nil && (res.Err == nil || errors.Is(res.Err, mvcc.ErrLeaseNotFound))
			md.end(acked, func() {
				for _, k := range attached {
					if s := md.keys[k]; s.known && s.lease == id {
						md.keys[k] = &keyState{known: true}
					}
				}
			}, attached...)
		default:
			time.Sleep(time.Millisecond)
		}
	}
}

// compact compacts now and then, physically or not, to a revision a
// little behind the newest or to the newest.
func (md *mixedModel) compact(ctx context.Context, m proposer, rng *rand.Rand) {
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(20+rng.IntN(200)) * time.Millisecond):
		}
		// Near the newest revision (which holds log compaction back), or
		// far behind it, as a history window does.
		rev := m.Store().Rev() - int64(rng.IntN(50))
		if rng.IntN(2) == 0 {
			rev = m.Store().Rev() / 2
		}
		if rev <= m.Store().CompactRev() {
			continue
		}
		res, err := m.Propose(ctx, &pb.InternalRaftRequest{Compaction: &pb.CompactionRequest{Revision: rev, Physical: rng.IntN(2) == 0}})
		if err == nil && res.Err == nil {
			md.mu.Lock()
			if !md.frozen {
				md.compactRev = max(md.compactRev, rev)
				md.acks++
			}
			md.mu.Unlock()
		}
	}
}

// check compares the store with the model as it was at the cut.
func (md *mixedModel) check(s *mvcc.Store, lastRev int64) error {
	md.mu.Lock()
	defer md.mu.Unlock()
	if rev := s.Rev(); rev < lastRev {
		return fmt.Errorf("revision went back from %d to %d", lastRev, rev)
	}
	if c := s.CompactRev(); c < md.snapCompact {
		return fmt.Errorf("compact revision %d, below the acknowledged compaction at %d", c, md.snapCompact)
	}
	for k, want := range md.snapKeys {
		if !want.known {
			continue
		}
		resp, err := s.Range(&pb.RangeRequest{Key: []byte(k)})
		if err != nil {
			return fmt.Errorf("read %s: %w", k, err)
		}
		switch {
		case !want.present && len(resp.Kvs) != 0:
			return fmt.Errorf("%s was deleted (acknowledged), but holds %q at mod revision %d", k, resp.Kvs[0].Value, resp.Kvs[0].ModRevision)
		case want.present && len(resp.Kvs) != 1:
			return fmt.Errorf("%s = %q at %d was acknowledged, but it is absent", k, want.value, want.modRev)
		case want.present && (string(resp.Kvs[0].Value) != want.value || resp.Kvs[0].ModRevision != want.modRev):
			return fmt.Errorf("%s = %q at %d was acknowledged, but it holds %q at %d", k, want.value, want.modRev, resp.Kvs[0].Value, resp.Kvs[0].ModRevision)
		}
	}
	for _, p := range md.snapPuts {
		resp, err := s.Range(&pb.RangeRequest{Key: []byte(p.key), Revision: p.rev})
		if errors.Is(err, mvcc.ErrCompacted) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read %s at %d: %w", p.key, p.rev, err)
		}
		if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != p.value || resp.Kvs[0].ModRevision != p.rev {
			return fmt.Errorf("read %s at revision %d (compact revision %d): %v, want %q put there", p.key, p.rev, s.CompactRev(), resp.Kvs, p.value)
		}
	}
	// The model goes on from what survived: unknown keys stay unknown.
	return nil
}
