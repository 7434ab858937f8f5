package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc/metadata"

	"github.com/strata-kv/strata/internal/testutil"
)

// authOutcomes runs, on a fresh server of flavor f with auth enabled
// (setupAuth), requests whose answers depend on who asks, and returns one
// line per request: what it answered. TestAuthLeaseAndTokensLikeEtcd
// compares the lines of strata with etcd's.
func authOutcomes(t *testing.T, f flavor) []string {
	p := testutil.StartProcess(t, testutil.Options{Binary: binary(t, f), Flags: []string{"--bcrypt-cost=4"}})
	cli := p.Client(t)
	setupAuth(t, cli)
	conn := cli.ActiveConnection()
	kv, leases, authc := pb.NewKVClient(conn), pb.NewLeaseClient(conn), pb.NewAuthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	token := func(user, password string) context.Context {
		t.Helper()
		resp, err := authc.Authenticate(ctx, &pb.AuthenticateRequest{Name: user, Password: password})
		if err != nil {
			t.Fatalf("authenticate %s: %v", user, err)
		}
		return metadata.AppendToOutgoingContext(ctx, "token", resp.Token)
	}
	var out []string
	note := func(what string, resp fmt.Stringer, err error) {
		if err != nil {
			code, msg := grpcError(err)
			out = append(out, fmt.Sprintf("%s: %v %s", what, code, msg))
			return
		}
		out = append(out, what+": ok")
	}
	root := token("root", "rootpw")
	// Root's leases: one bare, one holding a key only root may write.
	bare, err := leases.LeaseGrant(root, &pb.LeaseGrantRequest{TTL: 60})
	if err != nil {
		t.Fatal(err)
	}
	held, err := leases.LeaseGrant(root, &pb.LeaseGrantRequest{TTL: 60})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(root, &pb.PutRequest{Key: []byte("secret"), Value: []byte("v"), Lease: held.ID}); err != nil {
		t.Fatal(err)
	}
	keepAlive := func(ctx context.Context, id int64) (fmt.Stringer, error) {
		stream, err := leases.LeaseKeepAlive(ctx)
		if err != nil {
			return nil, err
		}
		defer func() { _ = stream.CloseSend() }()
		if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: id}); err != nil {
			return nil, err
		}
		return stream.Recv()
	}

	st, err := authc.AuthStatus(root, &pb.AuthStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, fmt.Sprintf("auth revision after setupAuth: %d", st.AuthRevision))
	// A hash sent with the password: etcd hashes the password and ignores
	// it when adding a user, and prefers the password when changing one.
	otherHash, err := bcrypt.GenerateFromPassword([]byte("other"), 4)
	if err != nil {
		t.Fatal(err)
	}
	hashed := base64.StdEncoding.EncodeToString(otherHash)
	_, err = authc.UserAdd(root, &pb.AuthUserAddRequest{Name: "carol", Password: "cpw", HashedPassword: hashed})
	note("add carol with a password and another hash", nil, err)
	_, err = authc.Authenticate(ctx, &pb.AuthenticateRequest{Name: "carol", Password: "cpw"})
	note("carol logs in with her password", nil, err)
	_, err = authc.UserChangePassword(root, &pb.AuthUserChangePasswordRequest{Name: "carol", Password: "cpw2", HashedPassword: hashed})
	note("change carol's password with a password and another hash", nil, err)
	_, err = authc.Authenticate(ctx, &pb.AuthenticateRequest{Name: "carol", Password: "cpw2"})
	note("carol logs in with her new password", nil, err)

	// Without a token.
	r1, err := leases.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 60})
	note("anonymous grant", r1, err)
	r2, err := leases.LeaseLeases(ctx, &pb.LeaseLeasesRequest{})
	note("anonymous leases", r2, err)
	r3, err := leases.LeaseTimeToLive(ctx, &pb.LeaseTimeToLiveRequest{ID: bare.ID})
	note("anonymous time to live", r3, err)
	r4, err := keepAlive(ctx, bare.ID)
	note("anonymous keep-alive", r4, err)
	r5, err := leases.LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: bare.ID})
	note("anonymous revoke of a lease without keys", r5, err)

	// alice may write foo/ only.
	alice := token("alice", "apw")
	r6, err := keepAlive(alice, held.ID)
	note("alice keeps alive root's lease on secret", r6, err)
	r7, err := leases.LeaseTimeToLive(alice, &pb.LeaseTimeToLiveRequest{ID: held.ID, Keys: true})
	note("alice asks the keys of root's lease", r7, err)
	r8, err := leases.LeaseLeases(alice, &pb.LeaseLeasesRequest{})
	note("alice lists leases", r8, err)
	r9, err := kv.Txn(alice, &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{
		RequestPut: &pb.PutRequest{Key: []byte("foo/t"), Value: []byte("v"), Lease: held.ID}}}}})
	note("alice attaches foo/t to root's lease on secret, in a txn", r9, err)
	r10, err := kv.Put(alice, &pb.PutRequest{Key: []byte("foo/p"), Value: []byte("v"), Lease: held.ID})
	note("alice attaches foo/p to root's lease on secret", r10, err)

	// A simple token after an auth change that is not alice's.
	if _, err := authc.UserAdd(root, &pb.AuthUserAddRequest{Name: "bob", Password: "bpw"}); err != nil {
		t.Fatal(err)
	}
	r11, err := kv.Put(alice, &pb.PutRequest{Key: []byte("foo/after"), Value: []byte("v")})
	note("alice's token after another user was added", r11, err)
	alice = token("alice", "apw")
	r12, err := authc.UserChangePassword(alice, &pb.AuthUserChangePasswordRequest{Name: "alice", Password: "apw2"})
	note("alice changes her own password", r12, err)
	return out
}

// TestAuthLeaseAndTokensLikeEtcd: with auth on, the lease requests of a
// caller without a token or without the permissions, a lease attached in a
// txn, a simple token after an unrelated auth change and a user changing
// her own password are answered as etcd answers them (found by review).
func TestAuthLeaseAndTokensLikeEtcd(t *testing.T) {
	got := map[flavor][]string{}
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) { got[f] = authOutcomes(t, f) })
	}
	want, have := got[etcd], got[strata]
	if len(want) != len(have) {
		t.Fatalf("etcd answered %d requests, strata %d", len(want), len(have))
	}
	var diff []string
	for i := range want {
		if want[i] != have[i] {
			diff = append(diff, fmt.Sprintf("  etcd:   %s\n  strata: %s", want[i], have[i]))
		}
	}
	if len(diff) > 0 {
		t.Errorf("strata answers differently from etcd:\n%s", strings.Join(diff, "\n"))
	}
	t.Logf("etcd's answers:\n  %s", strings.Join(want, "\n  "))
}
