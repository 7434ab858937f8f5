package e2e

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/metadata"

	"github.com/strata-kv/strata/internal/testutil"
)

// authCtlCases run in order on a fresh server: etcdctl's user, role and
// auth commands, then what users with and without permissions may do.
func authCtlCases() []ctlCase {
	alice := []string{"--user", "alice:apw"}
	root := []string{"--user", "root:rootpw"}
	as := func(who []string, args ...string) []string { return append(append([]string(nil), who...), args...) }
	return []ctlCase{
		{name: "auth enable without root", args: []string{"auth", "enable"}, wantCode: 1, wantStderr: "etcdserver: root user does not exist"},
		{name: "user add root", args: []string{"user", "add", "root:rootpw"}, wantStdout: "User root created\n"},
		{name: "user add root again", args: []string{"user", "add", "root:x"}, wantCode: 1, wantStderr: "etcdserver: user name already exists"},
		{name: "role add r", args: []string{"role", "add", "r"}, wantStdout: "Role r created\n"},
		{name: "grant readwrite foo/ prefix", args: []string{"role", "grant-permission", "r", "readwrite", "foo/", "--prefix=true"}, wantStdout: "Role r updated\n"},
		{name: "grant read ro", args: []string{"role", "grant-permission", "r", "read", "ro"}, wantStdout: "Role r updated\n"},
		{name: "grant to missing role", args: []string{"role", "grant-permission", "nope", "read", "ro"}, wantCode: 1, wantStderr: "etcdserver: role name not found"},
		{name: "user add alice", args: []string{"user", "add", "alice:apw"}, wantStdout: "User alice created\n"},
		{name: "user grant-role alice r", args: []string{"user", "grant-role", "alice", "r"}, wantStdout: "Role r is granted to user alice\n"},
		{name: "user add no-password user", args: []string{"user", "add", "nopw", "--no-password"}, wantStdout: "User nopw created\n"},
		{name: "auth enable", args: []string{"auth", "enable"}, wantStdout: "Authentication Enabled\n"},
		{name: "put without user", args: []string{"put", "foo/a", "1"}, wantCode: 1, wantStderr: "etcdserver: user name is empty"},
		{name: "alice put in her prefix", args: as(alice, "put", "foo/a", "1"), wantStdout: "OK\n"},
		{name: "alice get in her prefix", args: as(alice, "get", "foo/a"), wantStdout: "foo/a\n1\n"},
		{name: "alice get her whole prefix", args: as(alice, "get", "--prefix", "foo/"), wantStdout: "foo/a\n1\n"},
		{name: "alice get a wider prefix", args: as(alice, "get", "--prefix", "fo"), wantCode: 1, wantStderr: "etcdserver: permission denied"},
		{name: "alice put outside", args: as(alice, "put", "bar", "1"), wantCode: 1, wantStderr: "etcdserver: permission denied"},
		{name: "alice put read-only key", args: as(alice, "put", "ro", "1"), wantCode: 1, wantStderr: "etcdserver: permission denied"},
		{name: "alice get read-only key", args: as(alice, "get", "ro"), wantStdout: ""},
		{name: "alice del outside", args: as(alice, "del", "bar"), wantCode: 1, wantStderr: "etcdserver: permission denied"},
		{name: "alice txn with a denied branch", args: as(alice, "txn"), stdin: "\nput foo/b 2\n\nput bar 2\n\n",
			wantCode: 1, wantStderr: "etcdserver: permission denied"},
		{name: "alice wrong password", args: []string{"--user", "alice:wrong", "get", "foo/a"}, wantCode: 2,
			wantStderr: "etcdserver: authentication failed, invalid user ID or password"},
		{name: "no-password user has no password to log in with", args: []string{"--user", "nopw:", "get", "foo/a"}, wantCode: 1,
			wantStderr: "etcdserver: user name is empty"},
		{name: "alice user list", args: as(alice, "user", "list"), wantCode: 1, wantStderr: "etcdserver: permission denied"},
		{name: "alice compaction", args: as(alice, "compaction", "2"), wantCode: 1, wantStderr: "etcdserver: permission denied"},
		{name: "alice gets herself", args: as(alice, "user", "get", "alice"), wantStdout: "User: alice\nRoles: r\n"},
		{name: "root user list", args: as(root, "user", "list"), wantStdout: "alice\nnopw\nroot\n"},
		{name: "root role list", args: as(root, "role", "list"), wantStdout: "r\nroot\n"},
		{name: "root role get r", args: as(root, "role", "get", "r"),
			wantStdout: "Role r\nKV Read:\n\t[foo/, foo0) (prefix foo/)\n\tro\nKV Write:\n\t[foo/, foo0) (prefix foo/)\n"},
		{name: "root reads anything", args: as(root, "get", "foo/a"), wantStdout: "foo/a\n1\n"},
		{name: "root deletes root", args: as(root, "user", "delete", "root"), wantCode: 1, wantStderr: "etcdserver: invalid auth management"},
		{name: "root revokes root's root role", args: as(root, "user", "revoke-role", "root", "root"), wantCode: 1, wantStderr: "etcdserver: invalid auth management"},
		{name: "root compaction", args: as(root, "compaction", "2"), wantStdout: "compacted revision 2\n"},
		{name: "revoke r from alice", args: as(root, "user", "revoke-role", "alice", "r"), wantStdout: "Role r is revoked from user alice\n"},
		{name: "alice without her role", args: as(alice, "get", "foo/a"), wantCode: 1, wantStderr: "etcdserver: permission denied"},
		{name: "change alice's password", args: as(root, "user", "passwd", "alice", "--interactive=false"), stdin: "apw2\n",
			wantStdout: "Password updated\n"},
		{name: "old password refused", args: as(alice, "get", "foo/a"), wantCode: 2,
			wantStderr: "etcdserver: authentication failed, invalid user ID or password"},
		{name: "auth disable", args: as(root, "auth", "disable"), wantStdout: "Authentication Disabled\n"},
		{name: "anyone after disable", args: []string{"get", "foo/a"}, wantStdout: "foo/a\n1\n"},
		{name: "delete root after disable", args: []string{"user", "delete", "root"}, wantStdout: "User root deleted\n"},
	}
}

// TestAuthEtcdctl runs etcdctl's auth commands against strata and etcd:
// both must answer the same.
func TestAuthEtcdctl(t *testing.T) {
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			p := testutil.StartProcess(t, testutil.Options{Binary: binary(t, f), Flags: []string{"--bcrypt-cost=4"}})
			for _, c := range authCtlCases() {
				args := append([]string{"--endpoints=" + p.Endpoint(), "--dial-timeout=5s", "--command-timeout=10s"}, c.args...)
				res := testutil.RunToExit(t, 20*time.Second, c.stdin, nil, bins.Etcdctl, args...)
				if res.Code != c.wantCode {
					t.Fatalf("%s: exit code %d, want %d\nstdout: %s\nstderr: %s", c.name, res.Code, c.wantCode, res.Stdout, res.Stderr)
				}
				if c.wantCode == 0 && res.Stdout != c.wantStdout {
					t.Errorf("%s: stdout %q, want %q", c.name, res.Stdout, c.wantStdout)
				}
				if c.wantStderr != "" && !strings.Contains(res.Stderr, c.wantStderr) {
					t.Errorf("%s: stderr %q lacks %q", c.name, res.Stderr, c.wantStderr)
				}
			}
		})
	}
}

// setupAuth creates root (password rootpw) and alice (password apw,
// read-write on the prefix "foo/") and enables auth.
func setupAuth(t *testing.T, cli *clientv3.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	steps := []func() error{
		func() error { _, err := cli.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.RoleAdd(ctx, "r"); return err },
		func() error {
			_, err := cli.RoleGrantPermission(ctx, "r", "foo/", clientv3.GetPrefixRangeEnd("foo/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := cli.UserAdd(ctx, "alice", "apw"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "alice", "r"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("auth setup step %d: %v", i, err)
		}
	}
}

// TestAuthTokensAndWatch checks token expiry with --auth-token-ttl, that
// clientv3 with a user name and password works, and that a watch outside
// the user's permissions is refused as etcd refuses it.
func TestAuthTokensAndWatch(t *testing.T) {
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			p := testutil.StartProcess(t, testutil.Options{Binary: binary(t, f), Flags: []string{"--bcrypt-cost=4", "--auth-token-ttl=1"}})
			setupAuth(t, p.Client(t))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()

			alice, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Endpoint()}, Username: "alice", Password: "apw",
				DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
			if err != nil {
				t.Fatal(err)
			}
			defer alice.Close()
			if _, err := alice.Put(ctx, "foo/x", "1"); err != nil {
				t.Fatalf("alice put: %v", err)
			}
			if _, err := alice.Put(ctx, "bar", "1"); !errors.Is(rpctypes.Error(err), rpctypes.ErrPermissionDenied) {
				t.Fatalf("alice put outside: %v, want permission denied", err)
			}
			wresp := <-alice.Watch(ctx, "bar")
			if !wresp.Canceled || !strings.Contains(wresp.Err().Error(), "permission denied") {
				t.Fatalf("watch outside: canceled %v err %v, want canceled with permission denied", wresp.Canceled, wresp.Err())
			}
			// A permitted watch on the same client still works.
			wc := alice.Watch(ctx, "foo/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
			if w := <-wc; !w.Created || w.Err() != nil {
				t.Fatalf("watch inside: %+v %v", w, w.Err())
			}

			// TimeToLive with keys needs read access to every key attached;
			// revoking needs write access.
			root, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Endpoint()}, Username: "root", Password: "rootpw",
				DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			mine, err := alice.Grant(ctx, 60)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := alice.Put(ctx, "foo/leased", "1", clientv3.WithLease(mine.ID)); err != nil {
				t.Fatal(err)
			}
			if ttl, err := alice.TimeToLive(ctx, mine.ID, clientv3.WithAttachedKeys()); err != nil || len(ttl.Keys) != 1 {
				t.Fatalf("alice's lease time-to-live: %v %v", ttl, err)
			}
			theirs, err := root.Grant(ctx, 60)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := root.Put(ctx, "bar", "1", clientv3.WithLease(theirs.ID)); err != nil {
				t.Fatal(err)
			}
			if _, err := alice.TimeToLive(ctx, theirs.ID, clientv3.WithAttachedKeys()); !errors.Is(rpctypes.Error(err), rpctypes.ErrPermissionDenied) {
				t.Fatalf("time-to-live with keys of a lease on another's key: %v, want permission denied", err)
			}
			if _, err := alice.TimeToLive(ctx, theirs.ID); err != nil {
				t.Fatalf("time-to-live without keys of a lease on another's key: %v", err)
			}
			if _, err := alice.Revoke(ctx, theirs.ID); !errors.Is(rpctypes.Error(err), rpctypes.ErrPermissionDenied) {
				t.Fatalf("revoke of a lease on another's key: %v, want permission denied", err)
			}
			// Without a token at all the revoke is refused too, and the key
			// stays (strata once let it through and deleted the key).
			if _, err := p.Client(t).Revoke(ctx, theirs.ID); !errors.Is(rpctypes.Error(err), rpctypes.ErrUserEmpty) {
				t.Fatalf("revoke with no user of a lease with keys: %v, want user name is empty", err)
			}
			if resp, err := root.Get(ctx, "bar"); err != nil || len(resp.Kvs) != 1 {
				t.Fatalf("the leased key after refused revokes: %v, %v; want it kept", resp, err)
			}

			// A raw token, as clientv3 sends it, expires after its TTL
			// without use.
			plain := p.Client(t)
			ar, err := pb.NewAuthClient(plain.ActiveConnection()).Authenticate(ctx, &pb.AuthenticateRequest{Name: "alice", Password: "apw"})
			if err != nil {
				t.Fatal(err)
			}
			kv := pb.NewKVClient(plain.ActiveConnection())
			tctx := metadata.AppendToOutgoingContext(ctx, rpctypes.TokenFieldNameGRPC, ar.Token)
			if _, err := kv.Range(tctx, &pb.RangeRequest{Key: []byte("foo/x")}); err != nil {
				t.Fatalf("range with fresh token: %v", err)
			}
			if _, err := kv.Range(metadata.AppendToOutgoingContext(ctx, rpctypes.TokenFieldNameGRPC, "bogus.1"), &pb.RangeRequest{Key: []byte("foo/x")}); !errors.Is(rpctypes.Error(err), rpctypes.ErrInvalidAuthToken) {
				t.Fatalf("range with bogus token: %v", err)
			}
			time.Sleep(2500 * time.Millisecond) // the TTL is wall-clock time
			if _, err := kv.Range(tctx, &pb.RangeRequest{Key: []byte("foo/x")}); !errors.Is(rpctypes.Error(err), rpctypes.ErrInvalidAuthToken) {
				t.Fatalf("range with expired token: %v, want invalid auth token", err)
			}
			// clientv3 authenticates again by itself.
			if _, err := alice.Get(ctx, "foo/x"); err != nil {
				t.Fatalf("alice after expiry: %v", err)
			}
		})
	}
}

// TestAuthWatchStreamOpenedBefore: a watch stream opened while auth was
// off, without a token, gets its later creates refused once auth is on
// ("user name is empty", etcd's reason for it), as etcd checks each create
// against auth as it stands. strata once checked only streams opened with
// auth on, so such a stream could watch any key.
func TestAuthWatchStreamOpenedBefore(t *testing.T) {
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			p := testutil.StartProcess(t, testutil.Options{Binary: binary(t, f), Flags: []string{"--bcrypt-cost=4"}})
			cli := p.Client(t)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			// clientv3 sends every watch of one context over one stream.
			wctx := clientv3.WithRequireLeader(ctx)
			if w := <-cli.Watch(wctx, "before", clientv3.WithCreatedNotify()); !w.Created || w.Err() != nil {
				t.Fatalf("watch with auth off: %+v %v", w, w.Err())
			}
			setupAuth(t, p.Client(t))
			w := <-cli.Watch(wctx, "secret", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
			if !w.Canceled || w.Err() == nil || !strings.Contains(w.Err().Error(), "etcdserver: user name is empty") {
				t.Fatalf("watch created after auth was enabled, on a stream without a token: canceled %v err %v; want canceled, user name is empty",
					w.Canceled, w.Err())
			}
		})
	}
}

// TestAuthWatchTokenExpiresOnStream: each watch create is checked with the
// stream's token as it stands then, as etcd's isWatchPermitted finds the
// caller again: once a simple token has outlived --auth-token-ttl unused,
// a create on the stream it opened is refused ("invalid auth token"), and
// a create while it is valid restarts its TTL. strata checked the token
// once, when the stream opened, so an expired token watched on.
func TestAuthWatchTokenExpiresOnStream(t *testing.T) {
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			p := testutil.StartProcess(t, testutil.Options{Binary: binary(t, f), Flags: []string{"--bcrypt-cost=4", "--auth-token-ttl=2"}})
			cli := p.Client(t)
			setupAuth(t, cli)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			login, err := cli.Authenticate(ctx, "alice", "apw")
			if err != nil {
				t.Fatal(err)
			}
			stream, err := pb.NewWatchClient(cli.ActiveConnection()).Watch(
				metadata.AppendToOutgoingContext(ctx, rpctypes.TokenFieldNameGRPC, login.Token))
			if err != nil {
				t.Fatal(err)
			}
			create := func(key string) *pb.WatchResponse {
				t.Helper()
				if err := stream.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{
					CreateRequest: &pb.WatchCreateRequest{Key: []byte(key)}}}); err != nil {
					t.Fatal(err)
				}
				resp, err := stream.Recv()
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}
			// Used every second, the token outlives its TTL.
			for i := range 4 {
				if r := create(fmt.Sprintf("foo/%d", i)); !r.Created || r.Canceled {
					t.Fatalf("create %d with a token in use: %+v", i, r)
				}
				time.Sleep(time.Second)
			}
			time.Sleep(3500 * time.Millisecond) // unused for longer than its TTL
			r := create("foo/late")
			if !r.Canceled || r.WatchId != -1 || r.CancelReason != rpctypes.ErrGRPCInvalidAuthToken.Error() {
				t.Fatalf("create after the token expired: %+v; want canceled, watch ID -1, reason %q", r, rpctypes.ErrGRPCInvalidAuthToken.Error())
			}
		})
	}
}

// TestAuthJWT runs with --auth-token jwt (RS256, keys made by the test):
// clientv3 logs in, the token is a JWT, and a forged one is refused.
func TestAuthJWT(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	priv := writePEM(t, dir, "jwt.key", "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key))
	pub := writePEM(t, dir, "jwt.pub", "PUBLIC KEY", pubDER)
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			p := testutil.StartProcess(t, testutil.Options{Binary: binary(t, f), Flags: []string{
				"--bcrypt-cost=4", "--auth-token=jwt,pub-key=" + pub + ",priv-key=" + priv + ",sign-method=RS256,ttl=10m",
			}})
			setupAuth(t, p.Client(t))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			plain := p.Client(t)
			ar, err := pb.NewAuthClient(plain.ActiveConnection()).Authenticate(ctx, &pb.AuthenticateRequest{Name: "alice", Password: "apw"})
			if err != nil {
				t.Fatal(err)
			}
			if parts := strings.Split(ar.Token, "."); len(parts) != 3 {
				t.Fatalf("token %q is not a JWT", ar.Token)
			}
			kv := pb.NewKVClient(plain.ActiveConnection())
			if _, err := kv.Put(metadata.AppendToOutgoingContext(ctx, rpctypes.TokenFieldNameGRPC, ar.Token), &pb.PutRequest{Key: []byte("foo/j"), Value: []byte("1")}); err != nil {
				t.Fatalf("put with JWT: %v", err)
			}
			forged := ar.Token[:strings.LastIndex(ar.Token, ".")+1] + "AAAA"
			if _, err := kv.Range(metadata.AppendToOutgoingContext(ctx, rpctypes.TokenFieldNameGRPC, forged), &pb.RangeRequest{Key: []byte("foo/j")}); !errors.Is(rpctypes.Error(err), rpctypes.ErrInvalidAuthToken) {
				t.Fatalf("range with forged JWT: %v, want invalid auth token", err)
			}
			alice, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Endpoint()}, Username: "alice", Password: "apw",
				DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
			if err != nil {
				t.Fatal(err)
			}
			defer alice.Close()
			if resp, err := alice.Get(ctx, "foo/j"); err != nil || len(resp.Kvs) != 1 {
				t.Fatalf("clientv3 get with JWT login: %v %v", resp, err)
			}
		})
	}
}

// TestAuthCluster checks on three members that a simple token issued by
// one member is honoured by the others (its issue is replicated), and that
// the auth state survives a member's restart.
func TestAuthCluster(t *testing.T) {
	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, strata), Size: 3, Flags: []string{"--bcrypt-cost=4"}})
	setupAuth(t, c.Client(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	eps := c.Endpoints()
	first := c.Client(t, eps[0])
	ar, err := pb.NewAuthClient(first.ActiveConnection()).Authenticate(ctx, &pb.AuthenticateRequest{Name: "alice", Password: "apw"})
	if err != nil {
		t.Fatal(err)
	}
	tctx := metadata.AppendToOutgoingContext(ctx, rpctypes.TokenFieldNameGRPC, ar.Token)
	for i, ep := range eps {
		kv := pb.NewKVClient(c.Client(t, ep).ActiveConnection())
		// A follower learns the token when it applies the Authenticate
		// entry, which may be just after the issuing member answered.
		for {
			_, err := kv.Put(tctx, &pb.PutRequest{Key: []byte(fmt.Sprintf("foo/%d", i)), Value: []byte("v")})
			if err == nil {
				break
			}
			if !errors.Is(rpctypes.Error(err), rpctypes.ErrInvalidAuthToken) || ctx.Err() != nil {
				t.Fatalf("put through member %d with a token issued by member 0: %v", i, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	m := c.Members[1]
	m.Kill()
	m.Launch()
	alice, err := clientv3.New(clientv3.Config{Endpoints: []string{m.Endpoint()}, Username: "alice", Password: "apw",
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	for {
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		resp, err := alice.Get(rctx, "foo/", clientv3.WithPrefix())
		rcancel()
		if err == nil {
			if len(resp.Kvs) != 3 {
				t.Fatalf("after restart: %d keys, want 3", len(resp.Kvs))
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("alice after restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	anon := c.Client(t, m.Endpoint())
	if _, err := anon.Get(ctx, "foo/0"); !errors.Is(rpctypes.Error(err), rpctypes.ErrUserEmpty) {
		t.Fatalf("anonymous get after restart: %v, want user name is empty", err)
	}
}
