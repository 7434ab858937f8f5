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
	self, other, third := &pb.Member{ID: 7}, &pb.Member{ID: 9}, &pb.Member{ID: 11}
	type list struct {
		members []*pb.Member
		removed []uint64
	}
	tests := []struct {
		name string
		// initial is the list at start-up; changes are the lists applied after.
		initial list
		changes []list
		removed bool
	}{
		{name: "still a member", initial: list{members: []*pb.Member{self, other}}, changes: []list{{members: []*pb.Member{self}, removed: []uint64{9}}}},
		{name: "removed after being a member", initial: list{members: []*pb.Member{self, other}},
			changes: []list{{members: []*pb.Member{other}, removed: []uint64{7}}}, removed: true},
		{name: "removed, learned at start-up", initial: list{members: []*pb.Member{other}, removed: []uint64{7}}, removed: true},
		// A joining member applies the cluster's history from the start:
		// the lists before its own addition do not hold it, and say
		// nothing of a removal (it stopped itself at once when they did).
		{name: "joining member replays the history", initial: list{members: []*pb.Member{self, other, third}},
			changes: []list{{members: []*pb.Member{other}}, {members: []*pb.Member{other, third}}, {members: []*pb.Member{other, self, third}}}},
		{name: "another member removed", initial: list{members: []*pb.Member{self, other}}, changes: []list{{members: []*pb.Member{self}, removed: []uint64{9, 11}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := &recordingTransport{}
			tracker := NewTracker(TrackerConfig{
				MemberID: self.ID, Transport: tr, Raft: leaderKnown{}, ElectionTimeout: time.Hour, StopDelay: stopDelay,
			}, tt.initial.members, tt.initial.removed)
			for _, c := range tt.changes {
				tracker.Changed(c.members, c.removed)
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
					t.Fatal("Removed not closed after the member was removed")
				}
			}
			cancel()
			<-ran
		})
	}
}
