package membership

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/strata-kv/strata/logger"
)

type heldRecorder struct{ last map[uint64]uint64 }

func (h *heldRecorder) LoggersHeld(held map[uint64]uint64) { h.last = maps.Clone(held) }

type fakeMembers []*pb.Member

func (l fakeMembers) Members() []*pb.Member { return l }

// TestLoggerWatch: each round tells the node the committed index every
// logger of the member list answers; one that does not answer keeps what
// it last answered, one that never answered is absent (the node then
// holds everything), an endpoint answering as another member is not
// believed, and a logger removed from the list is forgotten.
func TestLoggerWatch(t *testing.T) {
	members := fakeMembers{
		{ID: 1, Name: "m1", ClientURLs: []string{"http://m1:2379"}},
		{ID: 7, Name: "L1", IsLearner: true, ClientURLs: []string{"http://l1:2479/strata-logger"}},
		{ID: 8, Name: "L2", IsLearner: true, ClientURLs: []string{"http://l2:2479/strata-logger"}},
	}
	type answer struct {
		member, commit uint64
		err            error
	}
	answers := map[string]answer{}
	rec := &heldRecorder{}
	w := NewLoggerWatch(LoggerWatchConfig{ClusterID: 0xc1, Members: &members, Node: rec,
		Status: func(_ context.Context, endpoint string, cluster uint64) (*logger.ClusterStatus, error) {
			a, ok := answers[endpoint]
			if !ok || cluster != 0xc1 {
				t.Fatalf("asked %s for cluster %x", endpoint, cluster)
			}
			if a.err != nil {
				return nil, a.err
			}
			return &logger.ClusterStatus{ClusterID: cluster, MemberID: a.member, CommitIndex: a.commit}, nil
		}})
	down := errors.New("connection refused")
	for _, step := range []struct {
		name    string
		answers map[string]answer
		members fakeMembers
		want    map[uint64]uint64
	}{
		{name: "L1 answers, L2 never did", answers: map[string]answer{
			"http://l1:2479/strata-logger": {member: 7, commit: 50}, "http://l2:2479/strata-logger": {err: down}},
			want: map[uint64]uint64{7: 50}},
		{name: "both answer", answers: map[string]answer{
			"http://l1:2479/strata-logger": {member: 7, commit: 60}, "http://l2:2479/strata-logger": {member: 8, commit: 40}},
			want: map[uint64]uint64{7: 60, 8: 40}},
		{name: "L2 stopped: it keeps its last answer", answers: map[string]answer{
			"http://l1:2479/strata-logger": {member: 7, commit: 90}, "http://l2:2479/strata-logger": {err: down}},
			want: map[uint64]uint64{7: 90, 8: 40}},
		{name: "L2's URL answers as another member", answers: map[string]answer{
			"http://l1:2479/strata-logger": {member: 7, commit: 95}, "http://l2:2479/strata-logger": {member: 9, commit: 500}},
			want: map[uint64]uint64{7: 95, 8: 40}},
		{name: "L2 removed", members: members[:2], answers: map[string]answer{
			"http://l1:2479/strata-logger": {member: 7, commit: 99}},
			want: map[uint64]uint64{7: 99}},
	} {
		if step.members != nil {
			members = step.members
		}
		answers = step.answers
		w.round(context.Background())
		if !maps.Equal(rec.last, step.want) {
			t.Fatalf("%s: the node was told %v, want %v", step.name, rec.last, step.want)
		}
	}
}

// TestLoggerWatchTruncate: with Durable (--logger-truncate), a voter asks
// each logger to truncate at its engine's durable index each time that
// advanced, again after a failed request, never as a learner.
func TestLoggerWatchTruncate(t *testing.T) {
	members := fakeMembers{
		{ID: 1, Name: "m1", ClientURLs: []string{"http://m1:2379"}},
		{ID: 7, Name: "L1", IsLearner: true, ClientURLs: []string{"http://l1:2479/strata-logger"}},
		{ID: 8, Name: "L2", IsLearner: true, ClientURLs: []string{"http://l2:2479/strata-logger"}},
	}
	var durable uint64
	var asked []string
	failing := map[string]bool{}
	w := NewLoggerWatch(LoggerWatchConfig{ClusterID: 0xc1, MemberID: 1, Members: &members,
		Durable: func() uint64 { return durable },
		Truncate: func(_ context.Context, endpoint string, cluster, member, index uint64) error {
			if failing[endpoint] {
				return errors.New("connection refused")
			}
			asked = append(asked, fmt.Sprintf("%s %x m%x %d", endpoint, cluster, member, index))
			return nil
		}})
	for _, step := range []struct {
		name    string
		durable uint64
		failing map[string]bool
		learner bool
		want    []string
	}{
		{name: "nothing durable", durable: 0},
		{name: "durable 100", durable: 100, want: []string{"http://l1:2479/strata-logger c1 m1 100", "http://l2:2479/strata-logger c1 m1 100"}},
		{name: "no advance", durable: 100},
		{name: "L2 down", durable: 200, failing: map[string]bool{"http://l2:2479/strata-logger": true},
			want: []string{"http://l1:2479/strata-logger c1 m1 200"}},
		{name: "L2 back", durable: 200, want: []string{"http://l2:2479/strata-logger c1 m1 200"}},
		{name: "a learner asks nothing", durable: 300, learner: true},
	} {
		durable, failing, asked = step.durable, step.failing, nil
		members[0].IsLearner = step.learner
		w.round(context.Background())
		slices.Sort(asked)
		if !slices.Equal(asked, step.want) {
			t.Fatalf("%s: asked %q, want %q", step.name, asked, step.want)
		}
	}
}

// TestLoggerWatchTruncateAtBackup: with Backed (a member with a backup
// target), a voter asks at the lower of its durable index and the newest
// backup version's index: nothing before the target holds a version,
// nothing in a round the target cannot be read, and the durable index when
// that is the lower.
func TestLoggerWatchTruncateAtBackup(t *testing.T) {
	members := fakeMembers{
		{ID: 1, Name: "m1", ClientURLs: []string{"http://m1:2379"}},
		{ID: 7, Name: "L1", IsLearner: true, ClientURLs: []string{"http://l1:2479/strata-logger"}},
	}
	var durable, backed uint64
	var backedErr error
	var asked []uint64
	w := NewLoggerWatch(LoggerWatchConfig{ClusterID: 0xc1, MemberID: 1, Members: &members,
		Durable: func() uint64 { return durable },
		Backed:  func(context.Context) (uint64, error) { return backed, backedErr },
		Truncate: func(_ context.Context, _ string, _, _, index uint64) error {
			asked = append(asked, index)
			return nil
		}})
	unreachable := errors.New("target unreachable")
	for _, step := range []struct {
		name            string
		durable, backed uint64
		backedErr       error
		want            []uint64
	}{
		{name: "no version yet", durable: 500},
		{name: "a version at 120", durable: 500, backed: 120, want: []uint64{120}},
		{name: "durable moves on, the version does not", durable: 900, backed: 120},
		{name: "the target unreadable", durable: 900, backedErr: unreachable},
		{name: "a newer version at 700", durable: 900, backed: 700, want: []uint64{700}},
		{name: "a version past the durable index", durable: 800, backed: 1000, want: []uint64{800}},
	} {
		durable, backed, backedErr, asked = step.durable, step.backed, step.backedErr, nil
		w.round(context.Background())
		if !slices.Equal(asked, step.want) {
			t.Fatalf("%s: asked %v, want %v", step.name, asked, step.want)
		}
	}
}

// TestNewMemberLoggerWatch: a member's flags decide what the watch does:
// nothing (no watch) without either, the node told with --logger-retention,
// truncation asked with --logger-truncate.
func TestNewMemberLoggerWatch(t *testing.T) {
	node := &heldRecorder{}
	durable := func() uint64 { return 7 }
	for _, tt := range []struct {
		retention, truncate bool
		watch, tellsNode    bool
		truncates           bool
	}{
		{},
		{retention: true, watch: true, tellsNode: true},
		{truncate: true, watch: true, truncates: true},
		{retention: true, truncate: true, watch: true, tellsNode: true, truncates: true},
	} {
		w := NewMemberLoggerWatch(LoggerWatchConfig{ClusterID: 1, MemberID: 2}, tt.retention, node, tt.truncate, durable)
		if (w != nil) != tt.watch {
			t.Errorf("retention %v, truncate %v: watch %v, want %v", tt.retention, tt.truncate, w != nil, tt.watch)
			continue
		}
		if w == nil {
			continue
		}
		if (w.cfg.Node != nil) != tt.tellsNode || (w.cfg.Durable != nil) != tt.truncates {
			t.Errorf("retention %v, truncate %v: node %v, durable %v", tt.retention, tt.truncate, w.cfg.Node != nil, w.cfg.Durable != nil)
		}
	}
}
