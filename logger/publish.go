package logger

import (
	"fmt"
	"slices"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/membershippb"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
)

// Publishing the logger's attributes (docs/logger.md, "The logger in the
// member list"): a strata member publishes its name and client URLs by
// proposing a ClusterMemberAttrSet request through raft
// (membership.Service.PublishAttributes); the logger's learner proposes the
// same request on its own raft, which forwards it to the leader as etcd's
// learners do (a follower's raft forwards a proposal, MsgProp, to the
// leader it knows). The members apply it like their own: no username in
// its header, so it is the member's own request, as etcd makes it as root.
// The client URLs carry the logger's marker (memberlist.LoggerURLPath).
//
// A forwarded proposal may be dropped (no leader yet, a leader change), and
// nothing answers the learner; so the learner proposes again every
// publishRetry until it finds the request among the committed entries it
// receives, then records the attributes in cluster.json and stops. A
// restarted logger whose record holds the same attributes publishes
// nothing.

// publishRetry is how long the learner waits for its proposal to come back
// committed before it proposes again.
const publishRetry = 2 * time.Second

// Attributes are a member's published attributes, as etcd's
// membershippb.Attributes.
type Attributes struct {
	// Name is the name shown in the member list.
	Name string `json:"name"`
	// ClientURLs are the logger's client URLs, marked (memberlist.LoggerURLPath).
	ClientURLs []string `json:"client_urls"`
}

func (a *Attributes) equal(b *Attributes) bool {
	return a != nil && b != nil && a.Name == b.Name && slices.Equal(a.ClientURLs, b.ClientURLs)
}

// maybePublish proposes the learner's attributes when they are not known
// to be committed, a leader is known, and the last proposal is
// publishRetry old.
//
// REQUIRES: the learner's goroutine.
func (l *learner) maybePublish() {
	attrs := l.cfg.Attributes
	if attrs == nil || l.published || l.leader.Load() == 0 {
		return
	}
	now := l.cfg.Now()
	if !l.lastPublish.IsZero() && now.Sub(l.lastPublish) < publishRetry {
		return
	}
	l.lastPublish = now
	if l.publishID == 0 {
		// A request ID as strata's proposer makes them: the member ID in
		// the top 16 bits, so that no member's waiter takes the answer.
		l.publishID = (l.cfg.Record.MemberID&0xffff)<<48 | (uint64(now.UnixMilli())&(1<<40-1))<<8
	}
	l.publishID++
	req := &pb.InternalRaftRequest{
		Header: &pb.RequestHeader{ID: l.publishID},
		ClusterMemberAttrSet: &membershippb.ClusterMemberAttrSetRequest{
			Member_ID:        l.cfg.Record.MemberID,
			MemberAttributes: &membershippb.Attributes{Name: attrs.Name, ClientUrls: attrs.ClientURLs},
		},
	}
	data, err := proto.Marshal(req)
	if err != nil {
		l.lg.Warn("cannot encode the logger's attributes", zap.Error(err))
		return
	}
	if err := l.rn.Propose(data); err != nil {
		l.lg.Debug("proposal of the logger's attributes dropped; retrying", zap.Error(err))
	}
}

// notePublished looks for the learner's attributes among committed
// entries; once found, it records them in cluster.json and publishing
// stops.
//
// REQUIRES: the learner's goroutine.
func (l *learner) notePublished(committed []*raftpb.Entry) error {
	attrs := l.cfg.Attributes
	if attrs == nil || l.published {
		return nil
	}
	for _, e := range committed {
		if e.GetType() != raftpb.EntryNormal || len(e.GetData()) == 0 {
			continue
		}
		var req pb.InternalRaftRequest
		if err := proto.Unmarshal(e.GetData(), &req); err != nil {
			continue // not ours to judge: the members apply it
		}
		set := req.ClusterMemberAttrSet
		if set == nil || set.Member_ID != l.cfg.Record.MemberID || set.MemberAttributes == nil {
			continue
		}
		got := &Attributes{Name: set.MemberAttributes.Name, ClientURLs: set.MemberAttributes.ClientUrls}
		if !got.equal(attrs) {
			continue
		}
		l.publishedAttrs = got
		if err := writeRecord(l.cfg.FS, l.cfg.Dir, l.record()); err != nil {
			return fmt.Errorf("record the published attributes of cluster %x: %w", l.cfg.Record.ClusterID, err)
		}
		l.published = true
		l.lg.Info("the logger's attributes are published", zap.Uint64("index", e.GetIndex()),
			zap.String("name", got.Name), zap.Strings("client-urls", got.ClientURLs))
		return nil
	}
	return nil
}
