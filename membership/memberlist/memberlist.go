// Package memberlist is a cluster's member list as data, and the rules
// every change to it keeps. The list is the applier's (apply.Applier keeps
// it in the engine beside the key space, in the batch of the entry that
// changes it); this package says what a committed membership change does to
// it, and when a change is refused.
//
// etcd checks a membership change twice: when it is proposed, against the
// list the proposing member sees (package membership), and again when it
// applies, against the list that every entry before it produced
// (ValidateConfigurationChange). Only the second check is exact: two changes
// proposed at once both pass the first, and raft commits both (raft's own
// rule of one change at a time holds a second change back only while the
// first is not yet applied). strata checks twice too. A refused change
// changes neither the list nor raft's configuration: the node asks the
// applier before it hands the change to raft, and hands raft a change of
// node 0 instead, which raft ignores (etcd does the same); the member that
// proposed it answers its caller with the refusal.
//
// The second check is deterministic: it reads only the list and raft's
// configuration where the list stands (List.Config), and every member
// applies the same entries to both. The one exception is
// the learner limit, which is each member's own flag (--max-learners), as
// in etcd: members started with different limits can decide a learner's
// addition differently.
//
// Invariants of a List, kept by Apply (a list built otherwise, a
// bootstrap's or a snapshot's, is taken as it is):
//
//  1. Members is sorted by ID, with one record per ID.
//  2. No two members share a peer URL.
//  3. An ID once removed is never a member again: Removed holds it, and an
//     addition or promotion of it is refused (etcd's "ID removed").
//  4. A learner is added only while fewer members than the limit are
//     learners, strata loggers not counted (IsLogger).
//  5. Only a learner is promoted, and never a strata logger.
//  6. A removal of an ID raft's configuration holds (List.Config) always
//     applies, so that raft and the list never keep a member apart.
//
// Version-2 conf changes (ConfChangeV2) are applied as raft applies them
// and never refused: neither etcd nor strata proposes one.
//
// The package also holds the mark that tells a strata logger from an
// ordinary learner in the list (logger.go), which rules 4 and 5 need.
package memberlist

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// DefaultMaxLearners is etcd's default limit on learners in a cluster
// (--max-learners). Strata loggers are not counted: they are never
// promoted, and a cluster may have a logger or two (seed 003's k+1) and
// still add a member the etcd way, as a learner first.
const DefaultMaxLearners = 1

// Why a change is refused, in etcd's terms (the server maps them to etcd's
// gRPC errors).
var (
	ErrIDExists         = errors.New("membership: member ID already exists")
	ErrIDNotFound       = errors.New("membership: member not found")
	ErrIDRemoved        = errors.New("membership: member ID removed")
	ErrPeerURLExists    = errors.New("membership: peer URLs already exist")
	ErrMemberNotLearner = errors.New("membership: can only promote a learner member")
	ErrTooManyLearners  = errors.New("membership: too many learner members in cluster")
	// ErrLoggerNotPromotable refuses to promote a strata logger: a logger
	// keeps the log and never votes (docs/logger.md).
	ErrLoggerNotPromotable = errors.New("membership: can not promote a strata logger: a logger never votes")
)

// List is a cluster's member list, with the IDs of the members removed
// from it. See the package comment for its invariants.
type List struct {
	// Members is sorted by ID. Apply never changes a record in place: it
	// replaces the record, so readers may hold the records of an older
	// list.
	Members []*pb.Member
	// Removed holds the IDs of removed members, sorted.
	Removed []uint64
	// Config is raft's configuration where the list stands, as the applier
	// recorded it (nil: unknown). A removal of an ID it holds always
	// applies, whatever the list says: a list that lost a member (a bug,
	// a version-2 change) must never keep raft from dropping it, or raft
	// would keep a voter no change could remove.
	Config *raftpb.ConfState
}

// inConfig says whether raft's configuration holds id.
func (l *List) inConfig(id uint64) bool {
	if l.Config == nil {
		return false
	}
	return slices.Contains(l.Config.GetVoters(), id) || slices.Contains(l.Config.GetLearners(), id) ||
		slices.Contains(l.Config.GetVotersOutgoing(), id) || slices.Contains(l.Config.GetLearnersNext(), id)
}

// Find returns the member with ID id, or nil.
func (l *List) Find(id uint64) *pb.Member {
	return Find(l.Members, id)
}

// Find returns the member of members with ID id, or nil.
func Find(members []*pb.Member, id uint64) *pb.Member {
	for _, m := range members {
		if m.ID == id {
			return m
		}
	}
	return nil
}

// URLsTaken says whether a member of members other than except (0: none)
// has one of urls among its peer URLs.
func URLsTaken(members []*pb.Member, urls []string, except uint64) bool {
	for _, m := range members {
		if m.ID == except {
			continue
		}
		for _, have := range m.PeerURLs {
			if slices.Contains(urls, have) {
				return true
			}
		}
	}
	return false
}

// Learners counts the learners of members that count against the learner
// limit: strata loggers do not (invariant 4).
func Learners(members []*pb.Member) int {
	n := 0
	for _, m := range members {
		if m.IsLearner && !IsLogger(m) {
			n++
		}
	}
	return n
}

// LearnerLimitReached says whether members hold as many learners as
// maxLearners allows (0: DefaultMaxLearners), so that no learner may be
// added.
func LearnerLimitReached(members []*pb.Member, maxLearners int) bool {
	return Learners(members) >= cmp.Or(maxLearners, DefaultMaxLearners)
}

// Change is a committed membership change, decoded from its raft entry.
type Change struct {
	// RequestID is the ID of the proposal that waits for the change, which
	// a version-1 change carries (0: none).
	RequestID uint64
	// Changes are the change's steps: one for a version-1 change.
	Changes []*raftpb.ConfChangeSingle
	// Member is the record the change carries in its context, as etcd
	// does: the member added, promoted or updated. Nil if none.
	Member *pb.Member
	// V2 is set for a version-2 change, which is never refused.
	V2 bool
}

// DecodeChange reads the membership change in e, an EntryConfChange or an
// EntryConfChangeV2.
func DecodeChange(e *raftpb.Entry) (Change, error) {
	var c Change
	var context []byte
	switch e.GetType() {
	case raftpb.EntryConfChange:
		var cc raftpb.ConfChange
		if err := proto.Unmarshal(e.GetData(), &cc); err != nil {
			return Change{}, fmt.Errorf("decode conf change %d: %w", e.GetIndex(), err)
		}
		c.Changes = cc.AsV2().GetChanges()
		c.RequestID = cc.GetId()
		context = cc.GetContext()
	case raftpb.EntryConfChangeV2:
		var cc raftpb.ConfChangeV2
		if err := proto.Unmarshal(e.GetData(), &cc); err != nil {
			return Change{}, fmt.Errorf("decode conf change %d: %w", e.GetIndex(), err)
		}
		c.Changes, c.V2 = cc.GetChanges(), true
		context = cc.GetContext()
	default:
		return Change{}, fmt.Errorf("entry %d is not a conf change (%s)", e.GetIndex(), e.GetType())
	}
	if len(context) > 0 {
		c.Member = &pb.Member{}
		if err := proto.Unmarshal(context, c.Member); err != nil {
			return Change{}, fmt.Errorf("decode member in conf change %d: %w", e.GetIndex(), err)
		}
	}
	return c, nil
}

// Check returns why c may not apply to l, or nil if it may: etcd's
// ValidateConfigurationChange, with strata's rules for loggers
// (invariants 2 to 5). maxLearners is --max-learners (0: the default).
func (l *List) Check(c Change, maxLearners int) error {
	if c.V2 || len(c.Changes) != 1 {
		return nil
	}
	ch := c.Changes[0]
	id := ch.GetNodeId()
	if ch.GetType() == raftpb.ConfChangeRemoveNode && l.inConfig(id) {
		return nil
	}
	if _, removed := slices.BinarySearch(l.Removed, id); removed {
		return fmt.Errorf("%w: %x", ErrIDRemoved, id)
	}
	var urls []string
	if c.Member != nil {
		urls = c.Member.PeerURLs
	}
	have := l.Find(id)
	switch ch.GetType() {
	case raftpb.ConfChangeAddNode:
		if have != nil {
			// A voter added under an ID the list holds is a promotion
			// (package membership proposes one that way).
			if !have.IsLearner {
				return fmt.Errorf("%w: %x is a voter", ErrMemberNotLearner, id)
			}
			if IsLogger(have) {
				return fmt.Errorf("%w: member %x (%s)", ErrLoggerNotPromotable, id, have.Name)
			}
			return nil
		}
		if URLsTaken(l.Members, urls, 0) {
			return fmt.Errorf("%w: %v", ErrPeerURLExists, urls)
		}
	case raftpb.ConfChangeAddLearnerNode:
		if have != nil {
			return fmt.Errorf("%w: %x", ErrIDExists, id)
		}
		if URLsTaken(l.Members, urls, 0) {
			return fmt.Errorf("%w: %v", ErrPeerURLExists, urls)
		}
		if LearnerLimitReached(l.Members, maxLearners) {
			return ErrTooManyLearners
		}
	case raftpb.ConfChangeRemoveNode:
		if have == nil {
			return fmt.Errorf("%w: %x", ErrIDNotFound, id)
		}
	case raftpb.ConfChangeUpdateNode:
		if have == nil {
			return fmt.Errorf("%w: %x", ErrIDNotFound, id)
		}
		if URLsTaken(l.Members, urls, id) {
			return fmt.Errorf("%w: %v", ErrPeerURLExists, urls)
		}
	}
	return nil
}

// Apply applies c to l if Check allows it, and returns the refusal
// otherwise; changed says whether l changed. l's slices are replaced, never
// written in place, so a caller may keep the old ones (to abandon a batch,
// or for readers).
func (l *List) Apply(c Change, maxLearners int) (changed bool, refused error) {
	if err := l.Check(c, maxLearners); err != nil {
		return false, err
	}
	return l.Reapply(c), nil
}

// Reapply applies c to l as it was decided before (it applied), without
// checking it again: for a change the engine already holds, redelivered to
// rebuild a lost list, whose decision stands.
func (l *List) Reapply(c Change) (changed bool) {
	for _, ch := range c.Changes {
		id := ch.GetNodeId()
		if id == 0 {
			continue // raft ignores it too (a change refused upstream of raft)
		}
		switch ch.GetType() {
		case raftpb.ConfChangeAddNode, raftpb.ConfChangeAddLearnerNode:
			learner := ch.GetType() == raftpb.ConfChangeAddLearnerNode
			var rec *pb.Member
			if have := l.Find(id); have != nil {
				rec = proto.CloneOf(have)
			} else if c.Member != nil {
				rec = proto.CloneOf(c.Member)
			} else {
				rec = &pb.Member{}
			}
			rec.ID, rec.IsLearner = id, learner
			l.Members = replace(l.Members, rec)
			changed = true
		case raftpb.ConfChangeRemoveNode:
			if l.Find(id) != nil {
				l.Members = slices.DeleteFunc(slices.Clone(l.Members), func(m *pb.Member) bool { return m.ID == id })
				changed = true
			}
			if i, found := slices.BinarySearch(l.Removed, id); !found {
				l.Removed = slices.Insert(slices.Clip(l.Removed), i, id)
				changed = true
			}
		case raftpb.ConfChangeUpdateNode:
			if have := l.Find(id); have != nil && c.Member != nil {
				rec := proto.CloneOf(have)
				rec.PeerURLs = c.Member.PeerURLs
				l.Members = replace(l.Members, rec)
				changed = true
			}
		}
	}
	return changed
}

// replace returns a copy of members with rec in place of the record with
// its ID, or inserted before the first member with a larger ID.
func replace(members []*pb.Member, rec *pb.Member) []*pb.Member {
	out := slices.Clone(members)
	if i := slices.IndexFunc(out, func(m *pb.Member) bool { return m.ID == rec.ID }); i >= 0 {
		out[i] = rec
		return out
	}
	i := slices.IndexFunc(out, func(m *pb.Member) bool { return m.ID > rec.ID })
	if i < 0 {
		i = len(out)
	}
	return slices.Insert(out, i, rec)
}
