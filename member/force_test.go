package member

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// TestForceNewClusterPowerCut forces a member of a three-member cluster
// (itself, a voter and a learner that never started) to be alone, then
// cuts the power at once, keeping only what was synced: the member started
// on what is left, without the flag, is still alone, with its data. The
// forced membership entries and the commit index that covers them are
// synced before Start returns, so before anything is served (node/force.go,
// step 3); a write acknowledged after them survives the cut too.
func TestForceNewClusterPowerCut(t *testing.T) {
	fs := vfs.NewCrashableMem()
	noStrict := func(cfg *Config) {
		cfg.NoStrictReconfig = true
		// Small segments: opening the log reads a segment's zeroed
		// preallocation, slow under the race detector.
		cfg.LogCompaction.SegmentSize = 1 << 20
	}
	m := startInMemory(t, fs, "force", noStrict)
	put := func(m *Member, k string) int64 {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := m.Propose(ctx, &pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte(k), Value: []byte("v-" + k)}})
		if err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
		return res.Response.(*pb.PutResponse).Header.Revision
	}
	revs := map[string]int64{}
	for i := range 5 {
		k := fmt.Sprint("k", i)
		revs[k] = put(m, k)
	}
	// A learner commits with the member alone; the voter added last
	// commits under the old membership too, and leaves a cluster that
	// cannot commit without it: the lost quorum the flag is for.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := m.membership.AddMember(ctx, []string{"http://127.0.0.1:2391"}, true); err != nil {
		t.Fatalf("add learner: %v", err)
	}
	if _, _, err := m.membership.AddMember(ctx, []string{"http://127.0.0.1:2392"}, false); err != nil {
		t.Fatalf("add voter: %v", err)
	}
	if n := len(m.Members()); n != 3 {
		t.Fatalf("%d members after two additions, want 3", n)
	}
	id := m.MemberID()
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}

	// Forced, then the power cut before anything else.
	m = startInMemory(t, fs, "force", func(cfg *Config) { noStrict(cfg); cfg.ForceNewCluster = true })
	alone := func(m *Member, when string) {
		t.Helper()
		if ms := m.Members(); len(ms) != 1 || ms[0].ID != id {
			t.Fatalf("%s: members %v, want %x alone", when, ms, id)
		}
		if cs := m.applier.ConfState(); len(cs.GetVoters()) != 1 || cs.GetVoters()[0] != id || len(cs.GetLearners()) != 0 {
			t.Fatalf("%s: conf state %v, want voter %x alone", when, cs, id)
		}
		for k, rev := range revs {
			resp, err := m.Store().Range(&pb.RangeRequest{Key: []byte(k)})
			if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].ModRevision != rev {
				t.Fatalf("%s: %s: %v, %v; want it at revision %d", when, k, resp, err, rev)
			}
		}
	}
	alone(m, "forced")
	clone := fs.CrashClone(vfs.CrashCloneCfg{})
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	m = startInMemory(t, clone, "force", noStrict)
	alone(m, "power cut after forcing")

	// A write on the forced member, then another cut.
	revs["after"] = put(m, "after")
	clone = clone.CrashClone(vfs.CrashCloneCfg{})
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	m = startInMemory(t, clone, "force", noStrict)
	defer m.Stop()
	alone(m, "power cut after a write")
}
