package membership

import (
	"context"
	"errors"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"

	"github.com/strata-kv/strata/apply"
	"github.com/strata-kv/strata/server"
)

// cluster is the state the checks read: a member list, which peers are
// connected, raft's view. proposed records what reached the proposer.
type cluster struct {
	members []*pb.Member
	// active are the peers connected long enough to count; fresh ones
	// connected a second ago.
	active   map[uint64]bool
	fresh    map[uint64]bool
	leader   uint64
	progress map[uint64]tracker.Progress
	proposed []*raftpb.ConfChange
	// stuck makes TransferLeadership wait for its context: the transferee
	// never takes over.
	stuck bool
}

func (c *cluster) Members() []*pb.Member { return c.members }
func (c *cluster) ActiveSince(id uint64) time.Time {
	switch {
	case c.active[id]:
		return testNow.Add(-time.Minute)
	case c.fresh[id]:
		return testNow.Add(-time.Second)
	}
	return time.Time{}
}

// testNow is the checks' clock in these tests.
var testNow = time.Unix(1_000_000, 0)

func (c *cluster) Leader() uint64 { return c.leader }
func (c *cluster) Status(context.Context) (raft.Status, error) {
	return raft.Status{Progress: c.progress}, nil
}
func (c *cluster) TransferLeadership(ctx context.Context, _ uint64) error {
	if c.stuck {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}
func (c *cluster) WaitLeader(context.Context) error { return nil }
func (c *cluster) ProposeConfChange(_ context.Context, cc *raftpb.ConfChange) (<-chan apply.Result, func(), error) {
	c.proposed = append(c.proposed, cc)
	res := make(chan apply.Result, 1)
	res <- apply.Result{}
	return res, func() {}, nil
}
func (c *cluster) Propose(context.Context, *pb.InternalRaftRequest) (apply.Result, error) {
	return apply.Result{}, nil
}

// TestChecks: etcd's strict reconfiguration check (Service's numbered
// checks, as etcd 3.7's mayAddMember, mayRemoveMember and mayPromoteMember
// decide), and that a refused change never reaches raft.
func TestChecks(t *testing.T) {
	// Members with a name are started (they published their attributes).
	three := func() []*pb.Member {
		return []*pb.Member{{ID: 1, Name: "a", PeerURLs: []string{"http://a:2380"}}, {ID: 2, Name: "b", PeerURLs: []string{"http://b:2380"}},
			{ID: 3, Name: "c", PeerURLs: []string{"http://c:2380"}}}
	}
	one := func() []*pb.Member { return three()[:1] }
	unstarted := func() []*pb.Member { m := three(); m[2].Name = ""; return m }
	twoUnstarted := func() []*pb.Member { m := unstarted(); m[1].Name = ""; return m }
	withLearner := func() []*pb.Member {
		return append(three(), &pb.Member{ID: 4, PeerURLs: []string{"http://d:2380"}, IsLearner: true})
	}
	withLogger := func() []*pb.Member {
		return append(three(), &pb.Member{ID: 4, Name: "L1", PeerURLs: []string{"http://d:2380"}, IsLearner: true,
			ClientURLs: []string{"http://d:2479/strata-logger"}})
	}
	progress := func(learnerMatch uint64) map[uint64]tracker.Progress {
		return map[uint64]tracker.Progress{1: {Match: 100}, 4: {Match: learnerMatch}}
	}
	for _, tc := range []struct {
		name    string
		members []*pb.Member
		active  []uint64
		fresh   []uint64
		leader  uint64
		learner uint64 // its match index, when the change promotes member 4
		do      func(s *Service) error
		want    error
		// cfg changes the service's flags (--max-learners,
		// --strict-reconfig-check).
		cfg func(*Config)
		// stuck: a leadership transfer never completes.
		stuck bool
	}{
		{name: "add to a cluster of one", members: one(), do: func(s *Service) error {
			_, _, err := s.AddMember(context.Background(), []string{"http://d:2380"}, false)
			return err
		}},
		{name: "add voter: a member not started", members: unstarted(), active: []uint64{2, 3}, do: func(s *Service) error {
			_, _, err := s.AddMember(context.Background(), []string{"http://d:2380"}, false)
			return err
		}, want: server.ErrNotEnoughStarted},
		{name: "add learner: a member not started", members: unstarted(), active: []uint64{2, 3}, do: func(s *Service) error {
			_, _, err := s.AddMember(context.Background(), []string{"http://d:2380"}, true)
			return err
		}},
		{name: "add learner: a voter down", members: three(), active: []uint64{2}, do: func(s *Service) error {
			_, _, err := s.AddMember(context.Background(), []string{"http://d:2380"}, true)
			return err
		}, want: server.ErrUnhealthy},
		{name: "add: a connection a second old does not count", members: three(), active: []uint64{2}, fresh: []uint64{3}, do: func(s *Service) error {
			_, _, err := s.AddMember(context.Background(), []string{"http://d:2380"}, true)
			return err
		}, want: server.ErrUnhealthy},
		{name: "add: peer URL taken", members: three(), active: []uint64{2, 3}, do: func(s *Service) error {
			_, _, err := s.AddMember(context.Background(), []string{"http://b:2380"}, false)
			return err
		}, want: server.ErrPeerURLExists},
		{name: "add voter: too few connected", members: three(), active: []uint64{2}, do: func(s *Service) error {
			_, _, err := s.AddMember(context.Background(), []string{"http://d:2380"}, false)
			return err
		}, want: server.ErrUnhealthy},
		{name: "add voter", members: three(), active: []uint64{2, 3}, do: func(s *Service) error {
			_, _, err := s.AddMember(context.Background(), []string{"http://d:2380"}, false)
			return err
		}},
		{name: "add learner beside a learner", members: withLearner(), active: []uint64{2, 3}, do: func(s *Service) error {
			_, _, err := s.AddMember(context.Background(), []string{"http://e:2380"}, true)
			return err
		}, want: server.ErrTooManyLearners},
		{name: "add learner beside a logger", members: withLogger(), active: []uint64{2, 3}, do: func(s *Service) error {
			_, _, err := s.AddMember(context.Background(), []string{"http://e:2380"}, true)
			return err
		}},
		{name: "add learner beside a logger and a learner", members: append(withLogger(), &pb.Member{ID: 5, PeerURLs: []string{"http://e:2380"}, IsLearner: true}),
			active: []uint64{2, 3}, do: func(s *Service) error {
				_, _, err := s.AddMember(context.Background(), []string{"http://f:2380"}, true)
				return err
			}, want: server.ErrTooManyLearners},
		{name: "add learner, peers down", members: three(), do: func(s *Service) error {
			_, _, err := s.AddMember(context.Background(), []string{"http://d:2380"}, true)
			return err
		}, want: server.ErrUnhealthy},
		{name: "remove unknown", members: three(), active: []uint64{2, 3}, do: func(s *Service) error {
			_, err := s.RemoveMember(context.Background(), 9)
			return err
		}, want: server.ErrMemberNotFound},
		{name: "remove a voter that is down", members: three(), active: []uint64{}, do: func(s *Service) error {
			_, err := s.RemoveMember(context.Background(), 3)
			return err
		}},
		{name: "remove a connected voter, another down", members: three(), active: []uint64{3}, do: func(s *Service) error {
			_, err := s.RemoveMember(context.Background(), 3)
			return err
		}, want: server.ErrUnhealthy},
		{name: "remove voter: the rest not started", members: twoUnstarted(), active: []uint64{2, 3}, do: func(s *Service) error {
			_, err := s.RemoveMember(context.Background(), 1)
			return err
		}, want: server.ErrNotEnoughStarted},
		{name: "remove a learner, peers down", members: withLearner(), do: func(s *Service) error {
			_, err := s.RemoveMember(context.Background(), 4)
			return err
		}},
		{name: "remove voter", members: three(), active: []uint64{2}, do: func(s *Service) error {
			_, err := s.RemoveMember(context.Background(), 3)
			return err
		}},
		{name: "update to a taken URL", members: three(), do: func(s *Service) error {
			_, err := s.UpdateMember(context.Background(), 2, []string{"http://c:2380"})
			return err
		}, want: server.ErrPeerURLExists},
		{name: "promote a voter", members: withLearner(), leader: 1, do: func(s *Service) error {
			_, err := s.PromoteMember(context.Background(), 2)
			return err
		}, want: server.ErrMemberNotLearner},
		{name: "promote a learner behind", members: withLearner(), leader: 1, learner: 89, do: func(s *Service) error {
			_, err := s.PromoteMember(context.Background(), 4)
			return err
		}, want: server.ErrLearnerNotReady},
		{name: "promote a learner close enough", members: withLearner(), leader: 1, learner: 90, do: func(s *Service) error {
			_, err := s.PromoteMember(context.Background(), 4)
			return err
		}},
		{name: "promote a logger", members: withLogger(), leader: 1, learner: 100, do: func(s *Service) error {
			_, err := s.PromoteMember(context.Background(), 4)
			return err
		}, want: server.ErrLoggerNotPromotable},
		{name: "promote a logger from a follower", members: withLogger(), leader: 2, learner: 100, do: func(s *Service) error {
			_, err := s.PromoteMember(context.Background(), 4)
			return err
		}, want: server.ErrLoggerNotPromotable},
		{name: "promote with voters not started", members: append(twoUnstarted(), &pb.Member{ID: 4, PeerURLs: []string{"http://d:2380"}, IsLearner: true}),
			leader: 1, learner: 100, do: func(s *Service) error {
				_, err := s.PromoteMember(context.Background(), 4)
				return err
			}, want: server.ErrNotEnoughStarted},
		{name: "--max-learners=2: a second learner", members: withLearner(), active: []uint64{2, 3},
			cfg: func(c *Config) { c.MaxLearners = 2 }, do: func(s *Service) error {
				_, _, err := s.AddMember(context.Background(), []string{"http://e:2380"}, true)
				return err
			}},
		{name: "--max-learners=2: a third learner", members: append(withLearner(), &pb.Member{ID: 5, PeerURLs: []string{"http://e:2380"}, IsLearner: true}),
			active: []uint64{2, 3}, cfg: func(c *Config) { c.MaxLearners = 2 }, do: func(s *Service) error {
				_, _, err := s.AddMember(context.Background(), []string{"http://f:2380"}, true)
				return err
			}, want: server.ErrTooManyLearners},
		{name: "--strict-reconfig-check=false: add voter, a member not started", members: unstarted(),
			cfg: func(c *Config) { c.NoStrictReconfig = true }, do: func(s *Service) error {
				_, _, err := s.AddMember(context.Background(), []string{"http://d:2380"}, false)
				return err
			}},
		{name: "--strict-reconfig-check=false: add learner, peers down", members: three(),
			cfg: func(c *Config) { c.NoStrictReconfig = true }, do: func(s *Service) error {
				_, _, err := s.AddMember(context.Background(), []string{"http://d:2380"}, true)
				return err
			}},
		{name: "--strict-reconfig-check=false: remove a connected voter, another down", members: three(), active: []uint64{3},
			cfg: func(c *Config) { c.NoStrictReconfig = true }, do: func(s *Service) error {
				_, err := s.RemoveMember(context.Background(), 3)
				return err
			}},
		{name: "--strict-reconfig-check=false: promote a learner behind", members: withLearner(), leader: 1, learner: 89,
			cfg: func(c *Config) { c.NoStrictReconfig = true }, do: func(s *Service) error {
				_, err := s.PromoteMember(context.Background(), 4)
				return err
			}, want: server.ErrLearnerNotReady},
		{name: "--strict-reconfig-check=false: learner limit stays", members: withLearner(),
			cfg: func(c *Config) { c.NoStrictReconfig = true }, do: func(s *Service) error {
				_, _, err := s.AddMember(context.Background(), []string{"http://e:2380"}, true)
				return err
			}, want: server.ErrTooManyLearners},
		{name: "move leader from a follower", members: three(), leader: 2, do: func(s *Service) error {
			return s.MoveLeader(context.Background(), 3)
		}, want: server.ErrNotLeader},
		{name: "move leader to a learner", members: withLearner(), leader: 1, do: func(s *Service) error {
			return s.MoveLeader(context.Background(), 4)
		}, want: server.ErrBadLeaderTransferee},
		// etcd's error, not a bare deadline (which the server would call
		// "request timed out").
		{name: "move leader to a voter that never takes over", members: three(), leader: 1, stuck: true,
			cfg: func(c *Config) { c.Timeout = 50 * time.Millisecond }, do: func(s *Service) error {
				return s.MoveLeader(context.Background(), 3)
			}, want: server.ErrTimeoutLeaderTransfer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &cluster{members: tc.members, active: map[uint64]bool{}, fresh: map[uint64]bool{}, leader: tc.leader, progress: progress(tc.learner),
				stuck: tc.stuck}
			for _, id := range tc.active {
				c.active[id] = true
			}
			for _, id := range tc.fresh {
				c.fresh[id] = true
			}
			cfg := Config{MemberID: 1, Token: "t", Timeout: time.Second, Members: c, Raft: c, Proposer: c, Activity: c}
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			s := New(cfg)
			s.now = func() time.Time { return testNow }
			err := tc.do(s)
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			if tc.want != nil && len(c.proposed) != 0 {
				t.Fatalf("a refused change was proposed: %v", c.proposed)
			}
		})
	}
}

// TestNewMemberID: a member added again with the same URLs gets a new ID
// (the time is part of it); the order of the URLs does not matter.
func TestNewMemberID(t *testing.T) {
	now := time.Unix(100, 0)
	a := newMemberID([]string{"http://a:2380", "http://b:2380"}, "tok", now)
	if b := newMemberID([]string{"http://b:2380", "http://a:2380"}, "tok", now); a != b {
		t.Fatalf("URL order changed the ID: %x, %x", a, b)
	}
	if b := newMemberID([]string{"http://a:2380", "http://b:2380"}, "tok", now.Add(time.Nanosecond)); a == b {
		t.Fatal("a later add got the same ID")
	}
}

func TestBootstrapPeersRefusesDuplicatedURL(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cluster map[string][]string
		wantErr string
	}{
		{name: "distinct", cluster: map[string][]string{"m1": {"http://a:2380"}, "m2": {"http://b:2380"}}},
		{name: "one URL under two names", cluster: map[string][]string{"m1": {"http://a:2380"}, "m2": {"http://b:2380", "http://a:2380"}},
			wantErr: "initial cluster has duplicated url http://a:2380 (members m1 and m2)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peers, err := BootstrapPeers(tc.cluster, "tok")
			if tc.wantErr == "" {
				if err != nil || len(peers) != len(tc.cluster) {
					t.Fatalf("peers %v, %v", peers, err)
				}
				return
			}
			if err == nil || err.Error() != tc.wantErr {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
		})
	}
}
