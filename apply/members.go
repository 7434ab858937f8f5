package apply

import (
	"encoding/binary"
	"fmt"
	"slices"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/membershippb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/membership/memberlist"
	"github.com/strata-kv/strata/mvcc"
)

// Membership, the applier's half. The member list is changed by committed
// membership changes, checked once more as they apply (memberlist.List.Check:
// two changes proposed at once both passed the proposer's check), and by the
// attributes members publish. A refused change changes nothing but the
// record of refusals below; the node hands raft a change of node 0 in its
// place, having asked the applier first (Decide).
//
// Three records live in the engine, each written in the batch of the entry
// that changes it:
//
//   - metaMembers, the member list (a MemberListResponse);
//   - metaRemoved, the IDs of removed members (memberlist.List.Removed),
//     8-byte big-endian IDs in ascending order;
//   - metaRefused, the indexes of the membership entries refused, in the
//     same encoding. A restart whose engine lost its raft conf state has
//     raft redeliver entries the engine already holds (node.raftAppliedIndex),
//     and the node must hand raft the same decisions again; the list after
//     them cannot tell what they were. One record per refusal, kept for
//     good: a refusal is an operator's race, rare enough that the record
//     stays small.
const (
	metaRemoved = "cluster/removed"
	metaRefused = "raft/refused-confchanges"
)

// ClusterStateMeta are the meta names (mvcc.MetaKey) of the state the
// applier keeps that belongs to one cluster rather than to its data: raft's
// conf state, the member list, the removed IDs, the refused changes and the
// raised alarms. A restore into a new cluster leaves them out, as etcd's
// restore trims the membership (and members_removed) from its backend.
var ClusterStateMeta = []string{metaConfState, metaMembers, metaRemoved, metaRefused, metaAlarms}

// memberState is the membership as one engine batch changes it: a private
// copy of the applier's, written with the batch and published after its
// commit.
type memberState struct {
	list memberlist.List
	// refused are the indexes of refused membership entries (metaRefused).
	refused []uint64
	// changedMembers, changedRemoved and changedRefused say which records
	// the batch must write.
	changedMembers, changedRemoved, changedRefused bool
}

// memberState returns a private copy of the applier's membership. Only the
// applier goroutine (or recovery, before Run) calls it.
func (a *Applier) memberState() *memberState {
	return &memberState{
		list:    memberlist.List{Members: slices.Clone(a.Members()), Removed: a.removed, Config: a.confState.Load()},
		refused: a.refused,
	}
}

// applyChange applies the membership change committed in e, unless the
// list refuses it: then refused says why, and the refusal is recorded.
func (s *memberState) applyChange(e *raftpb.Entry, maxLearners int) (requestID uint64, refused, err error) {
	c, err := memberlist.DecodeChange(e)
	if err != nil {
		return 0, nil, err
	}
	removedBefore := len(s.list.Removed)
	changed, refused := s.list.Apply(c, maxLearners)
	if refused != nil {
		s.refused = append(slices.Clip(s.refused), e.GetIndex())
		s.changedRefused = true
		return c.RequestID, refused, nil
	}
	s.changedMembers = s.changedMembers || changed
	s.changedRemoved = s.changedRemoved || len(s.list.Removed) != removedBefore
	return c.RequestID, nil, nil
}

// reapplyChange applies again a membership entry the engine already
// holds, to rebuild a lost member list (Applier.applyBatches), with the
// decision it had: refused if the record of refusals says so (the node hands
// raft the same decision, decide), applied otherwise, without checking it
// again against a list that may lack what the log's compacted part added.
func (s *memberState) reapplyChange(e *raftpb.Entry) error {
	if _, refused := slices.BinarySearch(s.refused, e.GetIndex()); refused {
		return nil
	}
	c, err := memberlist.DecodeChange(e)
	if err != nil {
		return err
	}
	removedBefore := len(s.list.Removed)
	changed := s.list.Reapply(c)
	s.changedMembers = s.changedMembers || changed
	s.changedRemoved = s.changedRemoved || len(s.list.Removed) != removedBefore
	return nil
}

// setAttributes records the attributes a member published.
func (s *memberState) setAttributes(set *membershippb.ClusterMemberAttrSetRequest) {
	if set.MemberAttributes == nil {
		return
	}
	for i, m := range s.list.Members {
		if m.ID == set.Member_ID {
			m = proto.CloneOf(m)
			m.Name = set.MemberAttributes.Name
			m.ClientURLs = set.MemberAttributes.ClientUrls
			s.list.Members = slices.Clone(s.list.Members)
			s.list.Members[i] = m
			s.changedMembers = true
			return
		}
	}
}

// write adds the records the batch changed to w.
func (s *memberState) write(w *mvcc.WriteBatch) error {
	if s.changedMembers {
		raw, err := proto.Marshal(&pb.MemberListResponse{Members: s.list.Members})
		if err != nil {
			return fmt.Errorf("encode membership: %w", err)
		}
		if err := w.SetMeta(metaMembers, raw); err != nil {
			return err
		}
	}
	if s.changedRemoved {
		if err := w.SetMeta(metaRemoved, encodeUint64s(s.list.Removed)); err != nil {
			return err
		}
	}
	if s.changedRefused {
		if err := w.SetMeta(metaRefused, encodeUint64s(s.refused)); err != nil {
			return err
		}
	}
	return nil
}

// publish makes the batch's membership the applier's, once the batch is
// committed; it returns the new member list and removed IDs if either
// changed, else nils.
func (a *Applier) publish(s *memberState) (members []*pb.Member, removed []uint64) {
	a.removed, a.refused = s.list.Removed, s.refused
	if !s.changedMembers && !s.changedRemoved {
		return nil, nil
	}
	members = s.list.Members
	a.members.Store(&members)
	return members, a.removed
}

// decide answers the node's question about the membership entry e
// (node.Committed.Decide), once every entry before it is applied: why it is
// refused, or nil. An entry the engine already holds (raft redelivers the
// log to a member whose engine lost its conf state) was decided when it was
// first applied, and the record of refusals says how.
func (a *Applier) decide(e *raftpb.Entry) (refused error, err error) {
	if e.GetIndex() <= a.applied.Load() {
		if _, found := slices.BinarySearch(a.refused, e.GetIndex()); found {
			return fmt.Errorf("membership change %d was refused when it was first applied", e.GetIndex()), nil
		}
		return nil, nil
	}
	if e.GetIndex() != a.applied.Load()+1 {
		// The node hands the entries before a membership change off
		// first: an index past the next one means some were lost.
		return nil, fmt.Errorf("apply: decide membership change %d with %d applied", e.GetIndex(), a.applied.Load())
	}
	c, err := memberlist.DecodeChange(e)
	if err != nil {
		return nil, err
	}
	list := memberlist.List{Members: a.Members(), Removed: a.removed, Config: a.confState.Load()}
	return list.Check(c, a.cfg.MaxLearners), nil
}

// encodeUint64s encodes ids as 8-byte big-endian numbers.
func encodeUint64s(ids []uint64) []byte {
	out := make([]byte, 0, 8*len(ids))
	for _, id := range ids {
		out = binary.BigEndian.AppendUint64(out, id)
	}
	return out
}

// decodeUint64s decodes what encodeUint64s encoded, sorted.
func decodeUint64s(raw []byte) ([]uint64, error) {
	if len(raw)%8 != 0 {
		return nil, fmt.Errorf("%d bytes are not a list of 8-byte numbers", len(raw))
	}
	ids := make([]uint64, 0, len(raw)/8)
	for i := 0; i < len(raw); i += 8 {
		ids = append(ids, binary.BigEndian.Uint64(raw[i:]))
	}
	slices.Sort(ids)
	return ids, nil
}
