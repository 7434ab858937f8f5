package node

// Catching up from a strata logger while running (docs/logger.md, "A
// running member behind"). A follower whose leader is about to send it a
// snapshot, because the leader's log no longer holds the follower's next
// entry, may get the missing committed entries from a logger instead; the
// member asks the node to append them with AppendCommitted before it
// accepts the snapshot's data. The node keeps raft the only writer of its
// log:
//
//  1. The entries are handed to raft as an append from the current leader
//     at the current term, after this member's commit index: a committed
//     entry, so its term in the message is right whatever the member's
//     uncommitted tail holds, and raft's conflict rule replaces a tail that
//     differs.
//  2. Only committed entries are handed over (the caller's contract: a
//     logger serves only committed ones), so by log matching they equal
//     every leader's entries at those indexes, and the message commits
//     nothing the leader did not.
//  3. Entries of a term above the member's current term are not handed
//     over: a leader of an older term never sends them.
//  4. The append is persisted like any other (Ready: append and sync, then
//     the MsgAppResp to the leader), and AppendCommitted returns once the
//     log holds the last entry handed over.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// ErrNotFollowing: AppendCommitted was called while this member follows no
// leader (it leads, or no leader is known).
var ErrNotFollowing = errors.New("node: not following a leader")

// CommitPoint is where a catch-up starts: this member's commit index and
// the leader and term it follows.
type CommitPoint struct {
	Commit, Term, Leader uint64
}

// FollowingFrom returns this member's commit point, or ErrNotFollowing.
// The entries to fetch are those after Commit.
func (n *Node) FollowingFrom(ctx context.Context) (CommitPoint, error) {
	type answer struct {
		p   CommitPoint
		err error
	}
	c := make(chan answer, 1)
	n.control(func(rn *raft.RawNode) {
		st := rn.BasicStatus()
		if st.RaftState != raft.StateFollower || st.Lead == raft.None {
			c <- answer{err: ErrNotFollowing}
			return
		}
		c <- answer{p: CommitPoint{Commit: st.GetCommit(), Term: st.GetTerm(), Leader: st.Lead}}
	})
	select {
	case a := <-c:
		return a.p, a.err
	case <-ctx.Done():
		return CommitPoint{}, ctx.Err()
	case <-n.done:
		return CommitPoint{}, n.err()
	}
}

// AppendCommitted hands raft the committed entries that follow from (the
// point FollowingFrom returned; rules 1-4 above) and waits until the log
// holds them. It returns the last index handed over, 0 if none was (the
// member no longer follows from's leader at from's term, or the entries
// do not start right after from.Commit). The caller must pass only
// committed entries of this member's cluster.
func (n *Node) AppendCommitted(ctx context.Context, from CommitPoint, entries []*raftpb.Entry) (uint64, error) {
	for i, e := range entries {
		if e.GetIndex() != from.Commit+1+uint64(i) {
			return 0, fmt.Errorf("node: entry %d of the catch-up has index %d, want %d", i, e.GetIndex(), from.Commit+1+uint64(i))
		}
	}
	c := make(chan error, 1)
	var last uint64
	n.control(func(rn *raft.RawNode) {
		m, err := n.catchUpMessage(rn, from, entries)
		if err != nil || m == nil {
			c <- err
			return
		}
		last = m.Entries[len(m.Entries)-1].GetIndex()
		if err := rn.Step(m); err != nil {
			c <- fmt.Errorf("node: step the catch-up: %w", err)
			return
		}
		c <- nil
	})
	select {
	case err := <-c:
		if err != nil || last == 0 {
			return 0, err
		}
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-n.done:
		return 0, n.err()
	}
	// Rule 4: the node's loop persists the append in the next Ready.
	for n.lastIdx.Load() < last {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-n.done:
			return 0, n.err()
		case <-time.After(time.Millisecond):
		}
	}
	return last, nil
}

// catchUpMessage is the append AppendCommitted steps, or nil if the
// member no longer follows from's leader at from's term, or nothing is
// left to hand over.
//
// REQUIRES: the node goroutine.
func (n *Node) catchUpMessage(rn *raft.RawNode, from CommitPoint, entries []*raftpb.Entry) (*raftpb.Message, error) {
	st := rn.BasicStatus()
	if st.RaftState != raft.StateFollower || st.Lead != from.Leader || st.GetTerm() != from.Term {
		return nil, nil
	}
	// Rule 3.
	for i, e := range entries {
		if e.GetTerm() > st.GetTerm() {
			entries = entries[:i]
			break
		}
	}
	if len(entries) == 0 {
		return nil, nil
	}
	// Rule 1: the entry at from.Commit is committed; the log holds it (or
	// its term, at the snapshot point) until it is truncated behind the
	// engine's durable index, which a member behind its leader has not
	// passed.
	logTerm, err := n.cfg.Log.Term(from.Commit)
	if err != nil {
		return nil, fmt.Errorf("node: term of the catch-up's commit point %d: %w", from.Commit, err)
	}
	return &raftpb.Message{Type: raftpb.MessageType_MsgApp.Enum(), From: proto.Uint64(from.Leader), To: proto.Uint64(n.cfg.ID),
		Term: proto.Uint64(from.Term), Index: proto.Uint64(from.Commit), LogTerm: proto.Uint64(logTerm),
		Entries: entries, Commit: proto.Uint64(entries[len(entries)-1].GetIndex())}, nil
}
