package membership

import (
	"context"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// recordingTransport records the peer lists it is given.
type recordingTransport struct{ lists [][]*pb.Member }

func (r *recordingTransport) SetPeers(members []*pb.Member) { r.lists = append(r.lists, members) }

// leaderKnown is a raft node that always knows a leader, so the tracker
// never asks its peers.
type leaderKnown struct{}

func (leaderKnown) Leader() uint64 { return 1 }

func TestTrackerRemoval(t *testing.T) {
	const stopDelay = 50 * time.Millisecond
	self, other := &pb.Member{ID: 7}, &pb.Member{ID: 9}
	tests := []struct {
		name string
		// initial is the list at start-up; changes are the lists applied after.
		initial []*pb.Member
		changes [][]*pb.Member
		removed bool
	}{
		{name: "still a member", initial: []*pb.Member{self, other}, changes: [][]*pb.Member{{self}}},
		{name: "removed after being a member", initial: []*pb.Member{self, other}, changes: [][]*pb.Member{{other}}, removed: true},
		{name: "removed, learned at start-up", initial: []*pb.Member{self}, changes: [][]*pb.Member{{other}}, removed: true},
		// A joining member's first lists may not hold it yet.
		{name: "never a member", initial: []*pb.Member{other}, changes: [][]*pb.Member{{other}}},
		{name: "empty list means nothing", initial: []*pb.Member{self}, changes: [][]*pb.Member{{}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := &recordingTransport{}
			tracker := NewTracker(TrackerConfig{
				MemberID: self.ID, Transport: tr, Raft: leaderKnown{}, ElectionTimeout: time.Hour, StopDelay: stopDelay,
			}, tt.initial)
			for _, c := range tt.changes {
				tracker.Changed(c)
			}
			if len(tr.lists) != 1+len(tt.changes) {
				t.Fatalf("transport given %d lists, want %d", len(tr.lists), 1+len(tt.changes))
			}
			ctx, cancel := context.WithTimeout(context.Background(), stopDelay+500*time.Millisecond)
			defer cancel()
			ran := make(chan struct{})
			go func() { tracker.Run(ctx); close(ran) }()
			select {
			case <-tracker.Removed():
				if !tt.removed {
					t.Fatal("Removed closed for a member still in the cluster")
				}
			case <-ctx.Done():
				if tt.removed {
					t.Fatal("Removed not closed after the member left the list")
				}
			}
			cancel()
			<-ran
		})
	}
}
