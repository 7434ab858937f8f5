package concurrencye2e

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/strata-kv/strata/internal/testutil"
	"github.com/strata-kv/strata/server/concurrency/v3electionpb"
	"github.com/strata-kv/strata/server/concurrency/v3lockpb"
)

// flavors are the servers the service tests run against: strata, and
// etcd as the reference (and the proof that our .proto files are etcd's
// wire API).
var flavors = []string{"strata", "etcd"}

func dial(t *testing.T, p *testutil.Process) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(strings.TrimPrefix(p.Endpoint(), "http://"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", p.Endpoint(), err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func grant(t *testing.T, cli *clientv3.Client, ttl int64) int64 {
	t.Helper()
	resp, err := cli.Grant(ctxT(t, 10*time.Second), ttl)
	if err != nil {
		t.Fatalf("grant: %v", err)
	}
	return int64(resp.ID)
}

// wantErr checks an RPC error: etcd's text, and code Unknown (etcd's
// in-process client drops the KV service's codes).
func wantErr(t *testing.T, what string, err error, msg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want %q", what, msg)
	}
	if got := status.Convert(err).Message(); got != msg || status.Code(err) != codes.Unknown {
		t.Fatalf("%s: error %q (%v), want %q", what, got, status.Code(err), msg)
	}
}

// result is an RPC answered on another goroutine.
type result[T any] struct {
	resp T
	err  error
}

func async[T any](fn func() (T, error)) <-chan result[T] {
	ch := make(chan result[T], 1)
	go func() {
		resp, err := fn()
		ch <- result[T]{resp, err}
	}()
	return ch
}

func await[T any](t *testing.T, what string, ch <-chan result[T]) T {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r.resp
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: no answer in 20 s", what)
	}
	var zero T
	return zero
}

func pending[T any](t *testing.T, what string, ch <-chan result[T]) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s answered (%v, %v) while it should wait", what, r.resp, r.err)
	default:
	}
}

// TestLockService drives the v3lock service as a gRPC client would.
func TestLockService(t *testing.T) {
	for _, flavor := range flavors {
		t.Run(flavor, func(t *testing.T) {
			p, cli := start(t, flavor)
			lc := v3lockpb.NewLockClient(dial(t, p))
			ctx := ctxT(t, 60*time.Second)

			l1 := grant(t, cli, 30)
			first, err := lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("svc"), Lease: l1})
			if err != nil {
				t.Fatalf("lock: %v", err)
			}
			if !strings.HasPrefix(string(first.Key), "svc/") || first.Header.GetRevision() == 0 {
				t.Fatalf("lock answered key %q, header %v", first.Key, first.Header)
			}
			again, err := lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("svc"), Lease: l1})
			if err != nil || string(again.Key) != string(first.Key) {
				t.Fatalf("second lock with the same lease: %v, %v; want the same key %q", again, err, first.Key)
			}

			// The service and the client-side recipe share the keys: a
			// Mutex cannot take a lock the service holds.
			sess, err := concurrency.NewSession(cli)
			if err != nil {
				t.Fatal(err)
			}
			defer sess.Close()
			if err := concurrency.NewMutex(sess, "svc").TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
				t.Fatalf("Mutex.TryLock of a lock the service holds: %v, want ErrLocked", err)
			}

			l2 := grant(t, cli, 30)
			second := async(func() (*v3lockpb.LockResponse, error) {
				return lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("svc"), Lease: l2})
			})
			eventually(t, "the second locker to queue", func() bool { return len(keysUnder(t, cli, "svc/")) == 2 })
			pending(t, "lock held by another lease", second)

			// A locker that gives up while waiting leaves the queue.
			short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err = lc.Lock(short, &v3lockpb.LockRequest{Name: []byte("svc"), Lease: grant(t, cli, 30)})
			cancel()
			if status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("lock with a deadline while held: %v, want DeadlineExceeded", err)
			}
			eventually(t, "the canceled locker's key to go", func() bool { return len(keysUnder(t, cli, "svc/")) == 2 })
			pending(t, "lock held by another lease", second)

			un, err := lc.Unlock(ctx, &v3lockpb.UnlockRequest{Key: first.Key})
			if err != nil || un.Header.GetRevision() == 0 {
				t.Fatalf("unlock: %v, %v", un, err)
			}
			got := await(t, "lock after unlock", second)
			if keys := keysUnder(t, cli, "svc/"); len(keys) != 1 || keys[0] != string(got.Key) {
				t.Fatalf("keys %v, want only the new holder's %q", keys, got.Key)
			}
			if got.Header.Revision < un.Header.Revision {
				t.Errorf("lock answered at revision %d, before the unlock at %d", got.Header.Revision, un.Header.Revision)
			}

			// Revoking the holder's lease releases the lock.
			third := async(func() (*v3lockpb.LockResponse, error) {
				return lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("svc"), Lease: grant(t, cli, 30)})
			})
			eventually(t, "the third locker to queue", func() bool { return len(keysUnder(t, cli, "svc/")) == 2 })
			if _, err := cli.Revoke(ctx, clientv3.LeaseID(l2)); err != nil {
				t.Fatal(err)
			}
			await(t, "lock after the holder's lease was revoked", third)

			// Without a lease, the server grants one of 60 s.
			free, err := lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("free")})
			if err != nil {
				t.Fatalf("lock without a lease: %v", err)
			}
			kv, err := cli.Get(ctx, string(free.Key))
			if err != nil || len(kv.Kvs) != 1 || kv.Kvs[0].Lease == 0 {
				t.Fatalf("key of a lock without a lease: %v, %v", kv, err)
			}
			ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(kv.Kvs[0].Lease))
			if err != nil || ttl.GrantedTTL != 60 {
				t.Fatalf("lease of a lock without a lease: %v, %v; want granted TTL 60", ttl, err)
			}

			_, err = lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("svc"), Lease: 12345})
			wantErr(t, "lock with a missing lease", err, "etcdserver: requested lease not found")
			_, err = lc.Unlock(ctx, &v3lockpb.UnlockRequest{})
			wantErr(t, "unlock without a key", err, "etcdserver: key is not provided")
			if _, err := lc.Unlock(ctx, &v3lockpb.UnlockRequest{Key: first.Key}); err != nil {
				t.Errorf("unlock of a key already gone: %v", err)
			}
		})
	}
}

// TestElectionService drives the v3election service as a gRPC client
// would.
func TestElectionService(t *testing.T) {
	for _, flavor := range flavors {
		t.Run(flavor, func(t *testing.T) {
			p, cli := start(t, flavor)
			ec := v3electionpb.NewElectionClient(dial(t, p))
			ctx := ctxT(t, 60*time.Second)
			name := []byte("ballot")

			_, err := ec.Leader(ctx, &v3electionpb.LeaderRequest{Name: name})
			wantErr(t, "leader of an empty election", err, "election: no leader")

			l1 := grant(t, cli, 30)
			won, err := ec.Campaign(ctx, &v3electionpb.CampaignRequest{Name: name, Lease: l1, Value: []byte("a")})
			if err != nil {
				t.Fatalf("campaign: %v", err)
			}
			lk := won.Leader
			if string(lk.Name) != "ballot" || !strings.HasPrefix(string(lk.Key), "ballot/") || lk.Lease != l1 || lk.Rev != won.Header.Revision {
				t.Fatalf("campaign answered leader %v, header %v", lk, won.Header)
			}

			obs, err := ec.Observe(ctx, &v3electionpb.LeaderRequest{Name: name})
			if err != nil {
				t.Fatal(err)
			}
			observe := func(want string) {
				t.Helper()
				resp, err := obs.Recv()
				if err != nil {
					t.Fatalf("observe: %v", err)
				}
				if string(resp.Kv.Value) != want || resp.Header.GetRevision() < resp.Kv.ModRevision {
					t.Fatalf("observed %q at header revision %d (kv %v), want %q at or after the kv's revision",
						resp.Kv.Value, resp.Header.GetRevision(), resp.Kv, want)
				}
			}
			observe("a")

			if _, err := ec.Proclaim(ctx, &v3electionpb.ProclaimRequest{Leader: lk, Value: []byte("b")}); err != nil {
				t.Fatalf("proclaim: %v", err)
			}
			observe("b")
			leader, err := ec.Leader(ctx, &v3electionpb.LeaderRequest{Name: name})
			if err != nil || string(leader.Kv.Value) != "b" || string(leader.Kv.Key) != string(lk.Key) {
				t.Fatalf("leader: %v, %v; want %s=b", leader, err, lk.Key)
			}

			l2 := grant(t, cli, 30)
			second := async(func() (*v3electionpb.CampaignResponse, error) {
				return ec.Campaign(ctx, &v3electionpb.CampaignRequest{Name: name, Lease: l2, Value: []byte("c")})
			})
			eventually(t, "the second campaigner to queue", func() bool { return len(keysUnder(t, cli, "ballot/")) == 2 })
			pending(t, "campaign while another leads", second)

			stale := &v3electionpb.LeaderKey{Name: lk.Name, Key: lk.Key, Rev: lk.Rev + 100, Lease: lk.Lease}
			_, err = ec.Proclaim(ctx, &v3electionpb.ProclaimRequest{Leader: stale, Value: []byte("x")})
			wantErr(t, "proclaim with a stale leader key", err, "election: not leader")
			_, err = ec.Proclaim(ctx, &v3electionpb.ProclaimRequest{Value: []byte("x")})
			wantErr(t, "proclaim without a leader key", err, `"leader" field must be provided`)
			_, err = ec.Resign(ctx, &v3electionpb.ResignRequest{})
			wantErr(t, "resign without a leader key", err, `"leader" field must be provided`)

			if _, err := ec.Resign(ctx, &v3electionpb.ResignRequest{Leader: lk}); err != nil {
				t.Fatalf("resign: %v", err)
			}
			next := await(t, "campaign after the leader resigned", second).Leader
			if next.Lease != l2 {
				t.Fatalf("new leader %v, want lease %x", next, l2)
			}
			observe("c")
			if _, err := ec.Resign(ctx, &v3electionpb.ResignRequest{Leader: lk}); err != nil {
				t.Errorf("resign of a leadership already lost: %v", err)
			}

			// Campaigning again with the leader's lease keeps the key and
			// proclaims the new value.
			again, err := ec.Campaign(ctx, &v3electionpb.CampaignRequest{Name: name, Lease: l2, Value: []byte("d")})
			if err != nil || string(again.Leader.Key) != string(next.Key) || again.Leader.Rev != next.Rev {
				t.Fatalf("campaign again: %v, %v; want leader %v", again, err, next)
			}
			observe("d")

			// The leader's lease ending elects nobody; the observer waits
			// for the next campaigner.
			if _, err := cli.Revoke(ctx, clientv3.LeaseID(l2)); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the election to empty", func() bool { return len(keysUnder(t, cli, "ballot/")) == 0 })
			if _, err := ec.Campaign(ctx, &v3electionpb.CampaignRequest{Name: name, Lease: grant(t, cli, 30), Value: []byte("e")}); err != nil {
				t.Fatalf("campaign in an empty election: %v", err)
			}
			observe("e")
		})
	}
}
