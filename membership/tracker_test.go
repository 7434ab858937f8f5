package membership

import (
	"context"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// recordingTransport records the peer lists and removed IDs it is given;
// refused stands for a peer's refusal of this member as removed.
type recordingTransport struct {
	lists   [][]*pb.Member
	removed [][]uint64
	refused chan struct{}
}

func (r *recordingTransport) SetPeers(members []*pb.Member)  { r.lists = append(r.lists, members) }
func (r *recordingTransport) SetRemoved(ids []uint64)        { r.removed = append(r.removed, ids) }
func (r *recordingTransport) RemovedByPeer() <-chan struct{} { return r.refused }

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
		// refusedByPeer: a peer refused this member's stream as removed.
		refusedByPeer bool
		removed       bool
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
		// The removal was never applied here: a peer that applied it says so.
		{name: "refused by a peer", initial: list{members: []*pb.Member{self, other}}, refusedByPeer: true, removed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := &recordingTransport{refused: make(chan struct{})}
			tracker := NewTracker(TrackerConfig{MemberID: self.ID, Transport: tr, StopDelay: stopDelay},
				tt.initial.members, tt.initial.removed)
			for _, c := range tt.changes {
				tracker.Changed(c.members, c.removed)
			}
			if tt.refusedByPeer {
				close(tr.refused)
			}
			if len(tr.lists) != 1+len(tt.changes) || len(tr.removed) != len(tr.lists) {
				t.Fatalf("transport given %d lists and %d removed lists, want %d", len(tr.lists), len(tr.removed), 1+len(tt.changes))
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
