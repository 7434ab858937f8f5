package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strata-kv/strata/discovery"
	"github.com/strata-kv/strata/internal/testutil"
)

// discoveryTimeout bounds a member's wait for its cluster through
// discovery, and a refused member's run to its exit.
const discoveryTimeout = 60 * time.Second

// discoveryService starts a real etcd as the discovery service and returns
// it with a fresh token; size > 0 writes the token's size key as an
// operator does (etcdctl put /_etcd/registry/<token>/_config/size N).
func discoveryService(t *testing.T, f flavor, size int) (*testutil.Process, string) {
	t.Helper()
	svc := testutil.StartProcess(t, testutil.Options{Binary: bins.Etcd, Name: "discovery"})
	token := fmt.Sprintf("e2e-%s-%d", f, time.Now().UnixNano())
	if size > 0 {
		res := testutil.RunToExit(t, 20*time.Second, "", nil, bins.Etcdctl, "--endpoints="+svc.Endpoint(), "--command-timeout=5s",
			"put", discovery.SizeKey(token), strconv.Itoa(size))
		if res.Code != 0 {
			t.Fatalf("etcdctl put size: exit %d: %s", res.Code, res.Stderr)
		}
	}
	return svc, token
}

// discoveryMember prepares member name of flavor f that bootstraps with
// only --discovery-token and --discovery-endpoints (no --initial-cluster).
func discoveryMember(t *testing.T, f flavor, name string, svc *testutil.Process, token string) *testutil.Process {
	t.Helper()
	return testutil.NewProcess(t, testutil.Options{
		Binary: binary(t, f), Name: name, NoInitialCluster: true, ReadyTimeout: discoveryTimeout,
		Flags: []string{"--discovery-token=" + token, "--discovery-endpoints=" + svc.Endpoint()},
	})
}

// TestDiscovery: three members given only a discovery token and the
// discovery service's endpoint form one cluster of three (their names and
// peer URLs in the member list, their registrations under their member
// IDs, a write on one read on another); a fourth member with the same
// token is refused with etcd's "discovery: cluster is full" and exits. Run
// on both flavors: a failure on etcd means the test is wrong.
func TestDiscovery(t *testing.T) {
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			svc, token := discoveryService(t, f, 3)
			var members []*testutil.Process
			for i := range 3 {
				m := discoveryMember(t, f, fmt.Sprintf("m%d", i+1), svc, token)
				m.Launch()
				members = append(members, m)
			}
			// No member serves before a quorum has registered and
			// started: launch all, then wait for each.
			for _, m := range members {
				if err := m.WaitReady(discoveryTimeout); err != nil {
					t.Fatalf("member %s: %v", m.Name(), err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			list, err := members[0].Client(t).MemberList(ctx)
			if err != nil {
				t.Fatalf("member list: %v", err)
			}
			var got, want []string
			for _, m := range list.Members {
				got = append(got, m.Name+"="+strings.Join(m.PeerURLs, ","))
			}
			for _, m := range members {
				want = append(want, m.Name()+"="+m.PeerURL())
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Fatalf("member list %v, want %v", got, want)
			}
			// Every member registered under its member ID, in hex.
			reg, err := svc.Client(t).Get(ctx, discovery.MembersPrefix(token), clientv3.WithPrefix())
			if err != nil {
				t.Fatalf("registrations: %v", err)
			}
			var keys, wantKeys []string
			for _, kv := range reg.Kvs {
				keys = append(keys, string(kv.Key))
			}
			for _, m := range list.Members {
				wantKeys = append(wantKeys, discovery.MemberKey(token, m.ID))
			}
			slices.Sort(keys)
			slices.Sort(wantKeys)
			if !slices.Equal(keys, wantKeys) {
				t.Errorf("registrations %v, want %v (the member list's IDs)", keys, wantKeys)
			}

			put, err := members[0].Client(t).Put(ctx, "discovery/key", "value")
			if err != nil {
				t.Fatalf("put on %s: %v", members[0].Name(), err)
			}
			get, err := members[2].Client(t).Get(ctx, "discovery/key")
			if err != nil {
				t.Fatalf("get on %s: %v", members[2].Name(), err)
			}
			if len(get.Kvs) != 1 || string(get.Kvs[0].Value) != "value" || get.Kvs[0].ModRevision != put.Header.Revision {
				t.Fatalf("get on %s after put on %s: %v (put at revision %d)", members[2].Name(), members[0].Name(), get.Kvs, put.Header.Revision)
			}

			// A fourth member with the same token finds the cluster full.
			fourth := discoveryMember(t, f, "m4", svc, token)
			res := testutil.RunToExit(t, discoveryTimeout, "", nil, binary(t, f), fourth.Args()...)
			const full = "failed to join discovery cluster (discovery: cluster is full)"
			if res.Code == 0 || !strings.Contains(res.Stderr, full) {
				t.Errorf("fourth member: exit %d, want a failure saying %q; stderr:\n%s", res.Code, full, res.Stderr)
			}
			reg, err = svc.Client(t).Get(ctx, discovery.MembersPrefix(token), clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil || reg.Count != 3 {
				t.Errorf("registrations after the fourth member: %v, %v; want 3 (a full cluster is refused before registering)", reg, err)
			}
		})
	}
}

// TestDiscoveryNoSizeKey: a token whose size key the operator has not
// written is refused at once with etcd's "discovery: size key not found"
// (etcd does not wait for it), and the member exits without registering.
func TestDiscoveryNoSizeKey(t *testing.T) {
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			svc, token := discoveryService(t, f, 0)
			m := discoveryMember(t, f, "m1", svc, token)
			res := testutil.RunToExit(t, discoveryTimeout, "", nil, binary(t, f), m.Args()...)
			const notFound = "failed to join discovery cluster (discovery: size key not found)"
			if res.Code == 0 || !strings.Contains(res.Stderr, notFound) {
				t.Errorf("exit %d, want a failure saying %q; stderr:\n%s", res.Code, notFound, res.Stderr)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			reg, err := svc.Client(t).Get(ctx, discovery.MembersPrefix(token), clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil || reg.Count != 0 {
				t.Errorf("registrations: %v, %v; want none", reg, err)
			}
		})
	}
}

// TestDiscoveryRefusals: discovery only bootstraps a new cluster, so both
// servers refuse it, in etcd's words, beside --initial-cluster (before
// anything is written) and beside --initial-cluster-state=existing on an
// empty data directory.
func TestDiscoveryRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		// initialCluster keeps the harness's --initial-cluster.
		initialCluster bool
		args           []string
		want           string
	}{
		{name: "beside initial cluster", initialCluster: true, args: []string{"--discovery-token=t", "--discovery-endpoints=http://127.0.0.1:1"},
			want: `multiple discovery or bootstrap flags are set. Choose one of "initial-cluster", "discovery-endpoints" or "discovery-srv"`},
		{name: "token alone", args: []string{"--discovery-token=t"}, want: "both --discovery-token and --discovery-endpoints must be set"},
		{name: "empty endpoint", args: []string{"--discovery-token=t", "--discovery-endpoints=http://127.0.0.1:1,"},
			want: "--discovery-endpoints must not contain empty endpoints"},
		{name: "existing cluster", args: []string{"--discovery-token=t", "--discovery-endpoints=http://127.0.0.1:1", "--initial-cluster-state=existing"},
			want: "discovery URL should not be set when joining existing initial cluster"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, f := range flavors {
				t.Run(string(f), func(t *testing.T) {
					t.Parallel()
					p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, f), NoInitialCluster: !tc.initialCluster})
					res := testutil.RunToExit(t, discoveryTimeout, "", nil, binary(t, f), append(p.Args(), tc.args...)...)
					if res.Code == 0 || (!strings.Contains(res.Stderr, tc.want) && !strings.Contains(res.Stderr, strings.ReplaceAll(tc.want, `"`, `\"`))) {
						t.Errorf("exit %d, want a refusal saying %q; stderr:\n%s", res.Code, tc.want, res.Stderr)
					}
				})
			}
		})
	}
}
