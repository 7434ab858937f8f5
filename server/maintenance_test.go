package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-kv/strata/membership/memberlist"
)

// lostAlarms is a MaintenanceBackend whose alarm proposals are never
// answered (lost in a leader change): ProposeAlarm returns only when its
// context ends.
type lostAlarms struct{}

func (lostAlarms) WriteBackup(context.Context, io.Writer) (int64, error) { return 0, nil }
func (lostAlarms) Hash() (uint32, int64, error)                          { return 0, 0, nil }
func (lostAlarms) Defragment() error                                     { return nil }
func (lostAlarms) Alarms() []*pb.AlarmMember                             { return nil }
func (lostAlarms) ProposeAlarm(ctx context.Context, _ *pb.AlarmRequest) (*pb.AlarmResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestAlarmProposalBounded: raising or clearing an alarm is bounded by the
// request timeout, as etcd bounds every proposal, and answers etcd's
// timeout; a client without a deadline waited for good (found by review).
func TestAlarmProposalBounded(t *testing.T) {
	m := NewMaintenance(nil, lostAlarms{}, nil, 0, 50*time.Millisecond)
	done := make(chan error, 1)
	go func() {
		_, err := m.Alarm(context.Background(), &pb.AlarmRequest{Action: pb.AlarmRequest_DEACTIVATE, Alarm: pb.AlarmType_NOSPACE})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, rpctypes.ErrGRPCTimeout) {
			t.Fatalf("alarm with its proposal lost: %v, want %v", err, rpctypes.ErrGRPCTimeout)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("alarm still waiting 10 s after its proposal was lost")
	}
}

// TestMembershipErrors: the errors of membership changes and MoveLeader
// reach the client as etcd's.
func TestMembershipErrors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code codes.Code
		msg  string
	}{
		{ErrMemberNotFound, codes.NotFound, "etcdserver: member not found"},
		{memberlist.ErrIDRemoved, codes.NotFound, "etcdserver: member not found"},
		{ErrMemberExists, codes.FailedPrecondition, "etcdserver: member ID already exist"},
		{ErrTooManyLearners, codes.FailedPrecondition, "etcdserver: too many learner members in cluster"},
		{ErrTimeoutLeaderTransfer, codes.Unknown, "etcdserver: request timed out, leader transfer took too long"},
	} {
		st, _ := status.FromError(membershipError(fmt.Errorf("wrapped: %w", tc.err)))
		if st.Code() != tc.code || st.Message() != tc.msg {
			t.Errorf("%v: %v %q, want %v %q", tc.err, st.Code(), st.Message(), tc.code, tc.msg)
		}
	}
}
