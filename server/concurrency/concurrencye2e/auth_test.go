package concurrencye2e

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"

	"github.com/strata-kv/strata/server/concurrency/v3electionpb"
	"github.com/strata-kv/strata/server/concurrency/v3lockpb"
)

// TestLockServiceAuth: with auth enabled, the Lock and Election services
// act as the caller: a user may lock under a prefix it may write, and is
// refused elsewhere, or without a token, with etcd's errors.
func TestLockServiceAuth(t *testing.T) {
	for _, flavor := range flavors {
		t.Run(flavor, func(t *testing.T) {
			p, cli := start(t, flavor)
			ctx := ctxT(t, 60*time.Second)
			for _, step := range []func() error{
				func() error { _, err := cli.UserAdd(ctx, "root", "rootpw"); return err },
				func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
				func() error { _, err := cli.UserAdd(ctx, "alice", "alicepw"); return err },
				func() error { _, err := cli.RoleAdd(ctx, "lockers"); return err },
				func() error {
					_, err := cli.RoleGrantPermission(ctx, "lockers", "mine/", clientv3.GetPrefixRangeEnd("mine/"), clientv3.PermissionType(clientv3.PermReadWrite))
					return err
				},
				func() error { _, err := cli.UserGrantRole(ctx, "alice", "lockers"); return err },
				func() error { _, err := cli.AuthEnable(ctx); return err },
			} {
				if err := step(); err != nil {
					t.Fatalf("auth setup: %v", err)
				}
			}
			root := authClient(t, p.Endpoint(), "root", "rootpw")
			lease, err := root.Grant(ctx, 30)
			if err != nil {
				t.Fatal(err)
			}
			alice := authClient(t, p.Endpoint(), "alice", "alicepw")
			auth, err := alice.Authenticate(ctx, "alice", "alicepw")
			if err != nil {
				t.Fatal(err)
			}
			actx := metadata.AppendToOutgoingContext(ctx, "token", auth.Token)
			lc := v3lockpb.NewLockClient(dial(t, p))
			held, err := lc.Lock(actx, &v3lockpb.LockRequest{Name: []byte("mine"), Lease: int64(lease.ID)})
			if err != nil {
				t.Fatalf("lock under a permitted prefix: %v", err)
			}
			_, err = lc.Lock(actx, &v3lockpb.LockRequest{Name: []byte("theirs"), Lease: int64(lease.ID)})
			wantErr(t, "lock under a forbidden prefix", err, "etcdserver: permission denied")
			_, err = lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("mine"), Lease: int64(lease.ID)})
			wantErr(t, "lock without a token", err, "etcdserver: user name is empty")
			// Reads are checked too: the leader of an election outside the
			// user's permissions is not shown.
			ec := v3electionpb.NewElectionClient(dial(t, p))
			_, err = ec.Leader(actx, &v3electionpb.LeaderRequest{Name: []byte("theirs")})
			wantErr(t, "leader of a forbidden election", err, "etcdserver: permission denied")
			// Locks and elections share the key layout: the lock's holder
			// is the "leader" of an election of the same name.
			if l, err := ec.Leader(actx, &v3electionpb.LeaderRequest{Name: []byte("mine")}); err != nil || string(l.Kv.Key) != string(held.Key) {
				t.Fatalf("leader of a permitted name: %v, %v; want the lock holder's key %s", l, err, held.Key)
			}
		})
	}
}

func authClient(t *testing.T, endpoint, user, password string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, Username: user, Password: password,
		DialTimeout: 5 * time.Second, Context: context.Background()})
	if err != nil {
		t.Fatalf("client as %s: %v", user, err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}
