package server

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-kv/strata/lease"
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
