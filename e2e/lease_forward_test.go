package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/internal/testutil"
)

// TestLeaseForwardToPausedLeader: a follower forwards keep-alives and
// TimeToLive to the leader; when the leader stops answering (paused: its
// connections stay open, nothing comes back), the follower answers within
// its request timeout, as etcd bounds the forward, so the client can move
// on. strata's forwards had no deadline and waited for the leader's TCP
// connection to fail, minutes later (found by review).
func TestLeaseForwardToPausedLeader(t *testing.T) {
	c := startTestCluster(t, 3)
	follower := c.Members[followers(c, leaderIndex(t, c))[0]]
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{follower.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	grant, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	leases := pb.NewLeaseClient(cli.ActiveConnection())
	stream, err := leases.LeaseKeepAlive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// One keep-alive through the follower while the leader answers: the
	// forward stream to the leader is open from then on.
	if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(grant.ID)}); err != nil {
		t.Fatal(err)
	}
	if resp, err := stream.Recv(); err != nil || resp.TTL <= 0 {
		t.Fatalf("keep-alive through the follower: %v, %v", resp, err)
	}
	// Pause the leader the follower forwards to (as it sees it now).
	st, err := cli.Status(ctx, follower.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	var paused *testutil.Member
	for _, m := range c.Members {
		if m.ID == st.Leader {
			paused = m
		}
	}
	if paused == nil || paused == follower {
		t.Fatalf("the follower's leader %x is not another member", st.Leader)
	}
	paused.Pause()
	defer paused.Resume()
	answered := make(chan error, 2)
	start := time.Now()
	go func() {
		if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(grant.ID)}); err != nil {
			answered <- err
			return
		}
		_, err := stream.Recv()
		answered <- err
	}()
	go func() {
		_, err := leases.LeaseTimeToLive(ctx, &pb.LeaseTimeToLiveRequest{ID: int64(grant.ID)})
		answered <- err
	}()
	// The request timeout is 5 s plus two election timeouts (250 ms here).
	for range 2 {
		select {
		case err := <-answered:
			t.Logf("answered after %v: %v", time.Since(start).Round(time.Millisecond), err)
		case <-time.After(15 * time.Second):
			t.Fatalf("a lease request through the follower still unanswered %v after the leader paused", time.Since(start).Round(time.Second))
		}
	}
}

// TestLeaseForwardOverPeerURLs: a follower forwards keep-alives and
// TimeToLive to its leader's peer URL, as etcd does, so they work whatever
// the members advertise as client URLs. Here every member advertises first
// a client URL nobody listens on (a load balancer's, say, that the members
// cannot reach themselves): strata forwarded to the leader's first client
// URL and answered "no leader" to every keep-alive through a follower
// (found by review). Run against both servers.
func TestLeaseForwardOverPeerURLs(t *testing.T) {
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			unreachable := fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePorts(t, 1)[0])
			c := testutil.StartCluster(t, testutil.ClusterOptions{
				Binary: binary(t, f), Size: 3, Flags: clusterFlags, AdvertiseClientURLsFirst: []string{unreachable},
			})
			follower := c.Members[followers(c, leaderIndex(t, c))[0]]
			cli, err := clientv3.New(clientv3.Config{Endpoints: []string{follower.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			grant, err := cli.Grant(ctx, 60)
			if err != nil {
				t.Fatal(err)
			}
			if resp, err := cli.KeepAliveOnce(ctx, grant.ID); err != nil || resp.TTL <= 0 {
				t.Fatalf("keep-alive through a follower: %v, %v", resp, err)
			}
			if _, err := cli.Put(ctx, "k", "v", clientv3.WithLease(grant.ID)); err != nil {
				t.Fatal(err)
			}
			ttl, err := cli.TimeToLive(ctx, grant.ID, clientv3.WithAttachedKeys())
			if err != nil || ttl.TTL <= 0 || ttl.GrantedTTL != 60 || len(ttl.Keys) != 1 || string(ttl.Keys[0]) != "k" {
				t.Fatalf("time to live through a follower: %+v, %v", ttl, err)
			}
		})
	}
}
