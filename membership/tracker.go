package membership

import (
	"context"
	"errors"
	"slices"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// ErrRemoved is the error a member stops with once the cluster removed it.
var ErrRemoved = errors.New("the member has been permanently removed from the cluster")

// PeerSetter is the transport's side of the member list
// (transport.Transport): its peers are the cluster's other members; it
// refuses the streams of removed members, and tells this member when a
// peer refused it.
type PeerSetter interface {
	SetPeers(members []*pb.Member)
	SetRemoved(ids []uint64)
	// RemovedByPeer is closed once a peer refused this member as removed.
	RemovedByPeer() <-chan struct{}
}

// TrackerConfig is a Tracker's collaborators and settings.
type TrackerConfig struct {
	// MemberID is this member's ID.
	MemberID uint64
	// Transport's peers follow the member list, and its refusals follow
	// the removed IDs.
	Transport PeerSetter
	// StopDelay is how long a removed member goes on before Removed
	// closes; 0 means a second.
	StopDelay time.Duration
}

// Tracker follows the applied member list for the rest of the member: it
// keeps the transport's peers equal to the cluster's other members, and
// tells the member when the cluster has removed it, so that it stops, as
// etcd's does.
//
// A member learns of its removal in one of two ways:
//
//  1. It applies the conf change that removes it: its ID joins the removed
//     IDs it is given with the list (Changed). A list without it means
//     nothing by itself: a joining member applies the cluster's history
//     from the start, where it is added last.
//  2. It never applies it (the leader stops replicating to a member once
//     its removal commits): a peer that applied the removal refuses its
//     streams (transport.Transport.SetRemoved; etcd's peers answer 410 Gone),
//     and the transport says so (RemovedByPeer). A peer that does not know
//     this member (one yet to apply its addition) does not refuse it: only
//     a removal does. Until the twentieth session the member asked its
//     peers for their lists after three election timeouts without a
//     leader, and took a list without it for its removal, which a peer
//     lagging behind its addition also answered.
//
// Either way Removed closes a moment later (StopDelay), so that the answer to the
// removal, when this member was the one asked, reaches the client first, as
// etcd delays its stop.
//
// Concurrency: Changed is called from one goroutine (the member's outcome
// loop), Run from another.
type Tracker struct {
	cfg TrackerConfig
	// removedSeen is signalled once by Changed when this member's ID is
	// among the removed; Run acts on it.
	removedSeen chan struct{}
	// removed is closed by Run, a second after the removal was learned.
	removed chan struct{}
}

// NewTracker returns a tracker that has given the transport members, the
// member list known at start-up (the applied one, or the one a joining
// member discovered), and removed, the IDs removed before.
func NewTracker(cfg TrackerConfig, members []*pb.Member, removed []uint64) *Tracker {
	if cfg.StopDelay <= 0 {
		cfg.StopDelay = time.Second
	}
	t := &Tracker{cfg: cfg, removedSeen: make(chan struct{}, 1), removed: make(chan struct{})}
	t.Changed(members, removed)
	return t
}

// Changed is given each member list the applier reaches, with the IDs
// removed from the cluster.
func (t *Tracker) Changed(members []*pb.Member, removed []uint64) {
	t.cfg.Transport.SetPeers(members)
	t.cfg.Transport.SetRemoved(removed)
	if slices.Contains(removed, t.cfg.MemberID) {
		select {
		case t.removedSeen <- struct{}{}:
		default:
		}
	}
}

// Removed is closed once the cluster has removed this member.
func (t *Tracker) Removed() <-chan struct{} { return t.removed }

// Run watches for this member's removal until ctx ends or it is learned.
func (t *Tracker) Run(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-t.removedSeen:
	case <-t.cfg.Transport.RemovedByPeer():
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(t.cfg.StopDelay):
	}
	close(t.removed)
}
