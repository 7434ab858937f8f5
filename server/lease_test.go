package server

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pebbleengine "github.com/strata-kv/strata/engine/pebble"
	"github.com/strata-kv/strata/lease"
	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/tlsconfig"
)

func TestLeaseErrors(t *testing.T) {
	tests := []struct {
		name string
		in   error
		want error
	}{
		{"not found", fmt.Errorf("apply: %w", lease.ErrLeaseNotFound), rpctypes.ErrGRPCLeaseNotFound},
		{"exists", lease.ErrLeaseExists, rpctypes.ErrGRPCLeaseExist},
		{"ttl too large", lease.ErrLeaseTTLTooLarge, rpctypes.ErrGRPCLeaseTTLTooLarge},
		{"not primary", lease.ErrNotPrimary, rpctypes.ErrGRPCNoLeader},
		{"timeout", context.DeadlineExceeded, rpctypes.ErrGRPCTimeout},
	}
	for _, tc := range tests {
		if got := leaseError(tc.in); !errors.Is(got, tc.want) {
			t.Errorf("%s: leaseError(%v) = %v, want %v", tc.name, tc.in, got, tc.want)
		}
	}
}

// TestForwardError: the leader's etcd errors reach the client unchanged;
// a broken path to the leader becomes "no leader", which clients retry.
func TestForwardError(t *testing.T) {
	tests := []struct {
		in, want error
	}{
		{rpctypes.ErrGRPCLeaseNotFound, rpctypes.ErrGRPCLeaseNotFound},
		{rpctypes.ErrGRPCLeaseTTLTooLarge, rpctypes.ErrGRPCLeaseTTLTooLarge},
		{status.Error(codes.Unavailable, "connection refused"), rpctypes.ErrGRPCNoLeader},
		{status.Error(codes.DeadlineExceeded, "deadline"), rpctypes.ErrGRPCNoLeader},
	}
	for _, tc := range tests {
		if got := forwardError(tc.in); !errors.Is(got, tc.want) {
			t.Errorf("forwardError(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// lateLeader is a leader whose applier is behind: a grant another member
// has applied and answered reaches it only with its read barrier.
type lateLeader struct {
	Backend
	store   *mvcc.Store
	lessor  *lease.Lessor
	pending *pb.LeaseGrantRequest
	t       *testing.T
}

func (b *lateLeader) MemberID() uint64   { return 1 }
func (b *lateLeader) Leader() uint64     { return 1 }
func (b *lateLeader) ClusterID() uint64  { return 9 }
func (b *lateLeader) Term() uint64       { return 2 }
func (b *lateLeader) Store() *mvcc.Store { return b.store }
func (b *lateLeader) ReadBarrier(context.Context) error {
	if b.pending != nil {
		w := b.store.Write(b.lessor)
		if _, err := b.lessor.Grant(w, b.pending); err != nil {
			b.t.Fatal(err)
		}
		if err := w.Commit(b.store.AppliedIndex() + 1); err != nil {
			b.t.Fatal(err)
		}
		b.pending = nil
	}
	return nil
}

// TestKeepAliveWaitsForCommittedGrant: a keepalive that reaches the leader
// before it applied the lease's grant (another member applied it and
// answered the client) gets the lease's TTL once the leader has caught up,
// not TTL 0, which clientv3 takes for an expired lease and stops keeping
// alive (etcd #13675).
func TestKeepAliveWaitsForCommittedGrant(t *testing.T) {
	e, err := pebbleengine.Open("engine", pebbleengine.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	store, err := mvcc.Open(e, mvcc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	l := lease.New(lease.Config{})
	if err := l.Load(store); err != nil {
		t.Fatal(err)
	}
	l.Promote(0)
	b := &lateLeader{store: store, lessor: l, pending: &pb.LeaseGrantRequest{ID: 7, TTL: 60}, t: t}
	s := NewLease(b, l, Limits{RequestTimeout: time.Second, MaxRequestBytes: 1 << 20}, tlsconfig.Info{}, nil)
	var fwd *keepAliveForward
	resp, err := s.keepAliveOne(context.Background(), &pb.LeaseKeepAliveRequest{ID: 7}, &fwd)
	if err != nil || resp.TTL != 60 {
		t.Fatalf("keepalive of a lease whose grant the leader had yet to apply: %v, %v; want TTL 60", resp, err)
	}
}
