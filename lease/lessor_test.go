package lease

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	epebble "github.com/strata-kv/strata/engine/pebble"
	"github.com/strata-kv/strata/mvcc"
)

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// env is a lessor over a store on an in-memory engine, with a fake clock
// and a Propose that applies requests at once, as a one-member raft would.
type env struct {
	t      *testing.T
	fs     vfs.FS
	e      *epebble.Engine
	store  *mvcc.Store
	l      *Lessor
	clock  *fakeClock
	index  uint64
	leader bool
	cfg    Config
	// progress, if set, gives the raft log's last index and the applied
	// index; unset, the lessor always sees its log applied.
	progress func() (last, applied uint64)
	// lost makes every proposal go unanswered (Submit).
	lost bool
	// notLeader: this member still sees itself as leader, but a quorum
	// has moved on (ConfirmLeader fails).
	notLeader bool
}

// IsLeader implements Raft.
func (v *env) IsLeader() bool { return v.leader }

// ConfirmLeader implements Raft: a quorum answers as notLeader says.
func (v *env) ConfirmLeader(context.Context) error {
	if v.notLeader {
		return errors.New("a quorum follows another leader")
	}
	return nil
}

// EnsureLeader implements Raft: this member's raft loop stalled when
// notLeader is set, and a quorum has moved on.
func (v *env) EnsureLeader(ctx context.Context) error { return v.ConfirmLeader(ctx) }

// LastIndex implements Raft.
func (v *env) LastIndex() uint64 {
	if v.progress == nil {
		return 0
	}
	last, _ := v.progress()
	return last
}

// AppliedIndex implements Raft.
func (v *env) AppliedIndex() uint64 {
	if v.progress == nil {
		return 1
	}
	_, applied := v.progress()
	return applied
}

// Submit implements Proposer: the request applies at once, as in a
// one-member raft; with lost set, it is never answered (a leader change
// dropped it) and Submit returns when ctx ends.
func (v *env) Submit(ctx context.Context, req *pb.InternalRaftRequest) error {
	if v.lost {
		<-ctx.Done()
		return ctx.Err()
	}
	return v.apply(req)
}

func newEnv(t *testing.T, cfg Config) *env {
	t.Helper()
	v := &env{t: t, fs: vfs.NewMem(), clock: &fakeClock{now: time.Unix(1_000_000, 0)}, leader: true, cfg: cfg}
	v.open()
	return v
}

func (v *env) open() {
	v.t.Helper()
	e, err := epebble.Open("db", epebble.Options{FS: v.fs})
	if err != nil {
		v.t.Fatal(err)
	}
	cfg := v.cfg
	cfg.Clock = v.clock
	cfg.Raft = v
	cfg.Proposer = v
	l := New(cfg)
	s, err := mvcc.Open(e, mvcc.Options{})
	if err != nil {
		v.t.Fatal(err)
	}
	if err := l.Load(s); err != nil {
		v.t.Fatal(err)
	}
	v.e, v.store, v.l, v.index = e, s, l, e.AppliedIndex()
	v.t.Cleanup(func() { v.close() })
}

func (v *env) close() {
	if v.store == nil {
		return
	}
	_ = v.store.Close()
	_ = v.e.Flush()
	_ = v.e.Close()
	v.store = nil
}

// restart closes and reopens the store and a new lessor on the same files.
func (v *env) restart() {
	v.t.Helper()
	v.close()
	v.open()
}

// apply applies one request in its own batch, as the applier would.
func (v *env) apply(req *pb.InternalRaftRequest) error {
	w := v.store.Write(v.l)
	var err error
	switch {
	case req.LeaseGrant != nil:
		_, err = v.l.Grant(w, req.LeaseGrant)
	case req.LeaseRevoke != nil:
		_, err = v.l.Revoke(w, req.LeaseRevoke)
	case req.LeaseCheckpoint != nil:
		_, err = v.l.Checkpoint(w, req.LeaseCheckpoint)
	case req.Put != nil:
		_, err = w.Put(req.Put)
	}
	v.index++
	if cerr := w.Commit(v.index); cerr != nil {
		v.t.Fatalf("commit: %v", cerr)
	}
	return err
}

func (v *env) grant(id, ttl int64) error {
	return v.apply(&pb.InternalRaftRequest{LeaseGrant: &pb.LeaseGrantRequest{ID: id, TTL: ttl}})
}

func (v *env) put(key string, lease int64) error {
	return v.apply(&pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte(key), Value: []byte("v"), Lease: lease}})
}

// tick runs one step of Run and waits for the proposals it made.
func (v *env) tick() {
	var wg sync.WaitGroup
	v.l.step(context.Background(), &wg)
	wg.Wait()
}

func (v *env) count(key string) int64 {
	v.t.Helper()
	resp, err := v.store.Range(&pb.RangeRequest{Key: []byte(key), RangeEnd: []byte{0}, CountOnly: true})
	if err != nil {
		v.t.Fatal(err)
	}
	return resp.Count
}

func TestGrantErrors(t *testing.T) {
	v := newEnv(t, Config{MinTTL: 5})
	tests := []struct {
		name    string
		id, ttl int64
		want    error
		wantTTL int64
	}{
		{"grant", 1, 60, nil, 60},
		{"below the minimum is raised", 2, 1, nil, 5},
		{"existing id", 1, 60, ErrLeaseExists, 0},
		{"largest ttl", 3, MaxLeaseTTL, nil, MaxLeaseTTL},
		{"too large", 4, MaxLeaseTTL + 1, ErrLeaseTTLTooLarge, 0},
	}
	for _, tc := range tests {
		w := v.store.Write(v.l)
		resp, err := v.l.Grant(w, &pb.LeaseGrantRequest{ID: tc.id, TTL: tc.ttl})
		v.index++
		if cerr := w.Commit(v.index); cerr != nil {
			t.Fatal(cerr)
		}
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
			continue
		}
		if err == nil && (resp.ID != tc.id || resp.TTL != tc.wantTTL) {
			t.Errorf("%s: got ID %d TTL %d, want %d %d", tc.name, resp.ID, resp.TTL, tc.id, tc.wantTTL)
		}
	}
	if got := v.l.Leases(); len(got) != 3 || got[0] != 1 || got[1] != 2 || got[2] != 3 {
		t.Errorf("Leases() = %v, want [1 2 3]", got)
	}
}

func TestExpiryRevokesKeysInOneRevision(t *testing.T) {
	v := newEnv(t, Config{ElectionTimeout: time.Second})
	v.tick() // promote
	if !v.l.Primary() {
		t.Fatal("not promoted while leader")
	}
	if err := v.grant(7, 10); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b", "c"} {
		if err := v.put(k, 7); err != nil {
			t.Fatal(err)
		}
	}
	if err := v.put("d", 0); err != nil {
		t.Fatal(err)
	}
	if err := v.put("x", 99); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("put with missing lease: %v", err)
	}
	rev := v.store.Rev()
	v.clock.advance(9 * time.Second)
	v.tick()
	if !v.l.Exists(7) || v.count("") != 4 {
		t.Fatal("lease expired early")
	}
	v.clock.advance(time.Second)
	v.tick()
	if v.l.Exists(7) {
		t.Fatal("lease not revoked at its deadline")
	}
	if got := v.count(""); got != 1 {
		t.Fatalf("%d keys left, want 1 (d)", got)
	}
	if got := v.store.Rev(); got != rev+1 {
		t.Fatalf("revision after revoke %d, want %d (one revision for three keys)", got, rev+1)
	}
	if keys, _ := v.store.LeaseKeys(7); len(keys) != 0 {
		t.Fatalf("lease index still holds %q", keys)
	}
}

func TestRenewHoldsLease(t *testing.T) {
	v := newEnv(t, Config{})
	if _, err := v.l.Renew(context.Background(), 1); !errors.Is(err, ErrNotPrimary) {
		t.Fatalf("renew on a follower: %v, want ErrNotPrimary", err)
	}
	v.tick()
	if err := v.grant(1, 10); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		v.clock.advance(8 * time.Second)
		v.tick()
		ttl, err := v.l.Renew(context.Background(), 1)
		if err != nil || ttl != 10 {
			t.Fatalf("renew: %d, %v", ttl, err)
		}
	}
	if !v.l.Exists(1) {
		t.Fatal("renewed lease revoked")
	}
	left, granted, err := v.l.TimeToLive(1)
	if err != nil || left != 10 || granted != 10 {
		t.Fatalf("TimeToLive = %d, %d, %v; want 10, 10", left, granted, err)
	}
	if _, err := v.l.Renew(context.Background(), 2); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("renew of a missing lease: %v", err)
	}
	v.clock.advance(11 * time.Second)
	if _, err := v.l.Renew(context.Background(), 1); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("renew of an expired lease: %v", err)
	}
}

// TestRenewOnStalledLeaderRefused: a primary whose raft loop stalled, and
// which a quorum no longer follows, refuses renewals (ErrNotPrimary, etcd's
// answer, so the client moves to another member) instead of extending a
// lease the new leader will revoke; it renewed from memory (found by
// review).
func TestRenewOnStalledLeaderRefused(t *testing.T) {
	v := newEnv(t, Config{})
	v.tick()
	if err := v.grant(1, 10); err != nil {
		t.Fatal(err)
	}
	v.clock.advance(8 * time.Second)
	v.notLeader = true
	if _, err := v.l.Renew(context.Background(), 1); !errors.Is(err, ErrNotPrimary) {
		t.Fatalf("renew on a stalled leader a quorum left: %v, want ErrNotPrimary", err)
	}
	if left, _, err := v.l.TimeToLive(1); err != nil || left != 2 {
		t.Fatalf("TimeToLive after the refused renewal = %d, %v; want 2 (not extended)", left, err)
	}
	// Past its deadline on this leader's clock (a newer leader may have
	// renewed it meanwhile): still refused as not primary, not answered
	// TTL 0, which would end the client's keep-alive (found by review).
	v.clock.advance(5 * time.Second)
	if ttl, err := v.l.Renew(context.Background(), 1); !errors.Is(err, ErrNotPrimary) {
		t.Fatalf("renew of a lease expired on a stalled leader's clock: %d, %v; want ErrNotPrimary", ttl, err)
	}
	v.notLeader = false
	if _, err := v.l.Renew(context.Background(), 1); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("renew of an expired lease on the confirmed leader: %v, want ErrLeaseNotFound", err)
	}
	if err := v.grant(2, 10); err != nil {
		t.Fatal(err)
	}
	if ttl, err := v.l.Renew(context.Background(), 2); err != nil || ttl != 10 {
		t.Fatalf("renew on the confirmed leader: %d, %v", ttl, err)
	}
}

// TestCheckpointSurvivesRestart: the remaining TTL a leader checkpoints
// is where a restarted leader counts from (plus the election timeout),
// and a renewal clears it so that it cannot shorten a renewed lease.
func TestCheckpointSurvivesRestart(t *testing.T) {
	v := newEnv(t, Config{CheckpointInterval: 5 * time.Second, ElectionTimeout: time.Second})
	v.tick()
	if err := v.grant(1, 100); err != nil {
		t.Fatal(err)
	}
	if err := v.grant(2, 100); err != nil {
		t.Fatal(err)
	}
	v.clock.advance(30 * time.Second)
	v.tick() // checkpoints both at 70 s
	if _, err := v.l.Renew(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	v.restart()
	if v.l.Primary() {
		t.Fatal("primary before Run saw leadership")
	}
	v.tick()
	for _, tc := range []struct {
		id   int64
		want int64
	}{{1, 71}, {2, 101}} {
		left, _, err := v.l.TimeToLive(tc.id)
		if err != nil || left != tc.want {
			t.Errorf("lease %d after restart: %d s left (%v), want %d", tc.id, left, err, tc.want)
		}
	}
}

func TestLeaderChange(t *testing.T) {
	v := newEnv(t, Config{ElectionTimeout: 2 * time.Second})
	v.tick()
	if err := v.grant(1, 10); err != nil {
		t.Fatal(err)
	}
	v.leader = false
	v.tick()
	if v.l.Primary() {
		t.Fatal("still primary after losing leadership")
	}
	if _, _, err := v.l.TimeToLive(1); !errors.Is(err, ErrNotPrimary) {
		t.Fatalf("TimeToLive on a follower: %v", err)
	}
	v.clock.advance(time.Hour)
	v.tick()
	if !v.l.Exists(1) {
		t.Fatal("a follower revoked a lease")
	}
	v.leader = true
	v.tick()
	left, _, _ := v.l.TimeToLive(1)
	if left != 12 {
		t.Fatalf("after promotion %d s left, want TTL + election timeout = 12", left)
	}
	v.clock.advance(12 * time.Second)
	v.tick()
	if v.l.Exists(1) {
		t.Fatal("lease not revoked by the new leader")
	}
}

// TestRevokeRetry: a revoke that does not apply is proposed again after
// revokeRetry, not on every tick.
func TestRevokeRetry(t *testing.T) {
	v := newEnv(t, Config{})
	v.tick()
	if err := v.grant(1, 5); err != nil {
		t.Fatal(err)
	}
	now := v.clock.Now().Add(6 * time.Second)
	if got := v.l.expired(now, 10); len(got) != 1 {
		t.Fatalf("expired = %v, want [1]", got)
	}
	if got := v.l.expired(now.Add(time.Second), 10); len(got) != 0 {
		t.Fatalf("proposed again before the retry interval: %v", got)
	}
	if got := v.l.expired(now.Add(revokeRetry), 10); len(got) != 1 {
		t.Fatalf("not proposed again after the retry interval: %v", got)
	}
}

// TestLoadWhilePrimary: a primary that reloads its table (after a raft
// snapshot install) gives every lease a deadline, so none lives forever.
func TestLoadWhilePrimary(t *testing.T) {
	v := newEnv(t, Config{ElectionTimeout: time.Second})
	v.tick()
	if err := v.grant(1, 10); err != nil {
		t.Fatal(err)
	}
	if err := v.l.Load(v.store); err != nil {
		t.Fatal(err)
	}
	if left, granted, err := v.l.TimeToLive(1); err != nil || left != 11 || granted != 10 {
		t.Fatalf("after Load: %d, %d, %v; want 11, 10", left, granted, err)
	}
	v.clock.advance(11 * time.Second)
	v.tick()
	if v.l.Exists(1) {
		t.Fatal("reloaded lease never expired")
	}
}

// TestPromoteWaitsForReplay: a new leader is promoted only once it has
// applied its log, so a checkpoint replayed after a restart still counts.
func TestPromoteWaitsForReplay(t *testing.T) {
	var last, applied uint64 = 10, 7
	v := &env{t: t, fs: vfs.NewMem(), clock: &fakeClock{now: time.Unix(1_000_000, 0)}, leader: true,
		progress: func() (uint64, uint64) { return last, applied }}
	v.open()
	if err := v.grant(1, 100); err != nil {
		t.Fatal(err)
	}
	v.tick()
	if v.l.Primary() {
		t.Fatal("promoted before applying its log")
	}
	// Replay reaches a checkpoint, then the end of the log as it was.
	if err := v.apply(&pb.InternalRaftRequest{LeaseCheckpoint: &pb.LeaseCheckpointRequest{
		Checkpoints: []*pb.LeaseCheckpoint{{ID: 1, Remaining_TTL: 30}},
	}}); err != nil {
		t.Fatal(err)
	}
	last, applied = 12, 10
	v.tick()
	if !v.l.Primary() {
		t.Fatal("not promoted after applying its log")
	}
	if left, _, _ := v.l.TimeToLive(1); left != 30 {
		t.Fatalf("%d s left, want the replayed checkpoint's 30", left)
	}
}

// TestForget: Forget drops a lease from memory only (its keys and record
// stay, for the caller), also from the primary's expiry heap; forgetting
// an unknown lease does nothing.
func TestForget(t *testing.T) {
	v := newEnv(t, Config{ElectionTimeout: time.Second})
	v.tick() // promote: leases get deadlines in the heap
	for _, id := range []int64{1, 2} {
		if err := v.grant(id, 5); err != nil {
			t.Fatal(err)
		}
	}
	if err := v.put("k", 1); err != nil {
		t.Fatal(err)
	}
	v.l.Forget(1)
	v.l.Forget(99)
	if v.l.Exists(1) || !v.l.Exists(2) {
		t.Fatalf("after Forget(1): Exists(1) %v, Exists(2) %v", v.l.Exists(1), v.l.Exists(2))
	}
	if err := v.put("k2", 1); !errors.Is(err, mvcc.ErrLeaseNotFound) {
		t.Fatalf("put with a forgotten lease: %v, want ErrLeaseNotFound", err)
	}
	// Its key is untouched, and the expiry of the other lease still works
	// (the heap holds no stale entry).
	v.clock.advance(time.Minute)
	v.tick()
	if v.count("k") != 1 {
		t.Fatalf("key of the forgotten lease: count %d, want 1", v.count("k"))
	}
	if v.l.Exists(2) {
		t.Fatalf("lease 2 did not expire")
	}
	// Reloading from the engine brings the lease back: its record stayed.
	if err := v.l.Load(v.store); err != nil {
		t.Fatal(err)
	}
	if !v.l.Exists(1) {
		t.Fatalf("lease 1 not reloaded from its record")
	}
}

func TestMinTTL(t *testing.T) {
	tests := []struct {
		heartbeat, election time.Duration
		want                int64
	}{
		{100 * time.Millisecond, time.Second, 2},            // etcd's defaults: ceil(1.5 s)
		{100 * time.Millisecond, 3 * time.Second, 5},        // ceil(4.5 s)
		{time.Second, time.Second, 3},                       // at least two ticks: 1.5 x 2 s
		{100 * time.Millisecond, 100 * time.Millisecond, 1}, // 0.3 s rounds up to 1 s
		{0, time.Second, 0},
	}
	for _, tt := range tests {
		if got := MinTTL(tt.heartbeat, tt.election); got != tt.want {
			t.Errorf("MinTTL(%v, %v) = %d, want %d", tt.heartbeat, tt.election, got, tt.want)
		}
	}
}

// TestRenewBoundedWhenClearIsLost: a renewal that clears the lease's
// checkpoint waits for a raft round; when a leader change drops that
// proposal nothing ever answers it. The renewal returns an error after the
// request timeout instead of holding the client's keepalive stream (and
// every lease on it) forever, as it did with the stream's context alone.
func TestRenewBoundedWhenClearIsLost(t *testing.T) {
	v := newEnv(t, Config{CheckpointInterval: 5 * time.Second, ElectionTimeout: time.Second,
		RequestTimeout: 50 * time.Millisecond})
	v.tick()
	if err := v.grant(1, 100); err != nil {
		t.Fatal(err)
	}
	v.clock.advance(30 * time.Second)
	v.tick() // checkpoints the lease: the next renewal clears it
	v.lost = true
	done := make(chan error, 1)
	go func() {
		_, err := v.l.Renew(context.Background(), 1)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Renew with its checkpoint clear lost = %v, want the request timeout", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Renew still waiting 10 s after its checkpoint clear was lost (request timeout 50 ms)")
	}
}

// TestExpiryWaitsForConfirmedLeadership: a leader that stalled past an
// election timeout still sees itself as leader while the others elected
// another, through which clients keep their leases alive; it revokes
// expired leases only once a quorum confirms it still leads (etcd #15247),
// and so never deletes keys of leases the new leader renews.
func TestExpiryWaitsForConfirmedLeadership(t *testing.T) {
	v := newEnv(t, Config{ElectionTimeout: time.Second})
	v.tick()
	if err := v.grant(1, 10); err != nil {
		t.Fatal(err)
	}
	if err := v.put("k", 1); err != nil {
		t.Fatal(err)
	}
	v.clock.advance(20 * time.Second)
	v.notLeader = true
	v.tick()
	if v.count("k") != 1 || !v.l.Exists(1) {
		t.Fatal("a leader that a quorum no longer follows revoked an expired lease")
	}
	v.notLeader = false
	v.tick()
	if v.count("k") != 0 || v.l.Exists(1) {
		t.Fatal("the confirmed leader did not revoke the expired lease")
	}
}
