package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strata-kv/strata/internal/testutil"
)

// TestForceNewCluster is etcd's disaster recovery with --force-new-cluster,
// on strata and on etcd: a cluster of three takes writes, every member is
// killed with SIGKILL, and one is restarted on its data directory with the
// flag (as ETCD_FORCE_NEW_CLUSTER, which both read). It must answer every
// acknowledged write with its revision, list itself alone with its member
// ID, accept writes (the revision going on from the last acknowledged
// one), keep being a cluster of one when restarted without the flag, and
// take a new member that catches up. The same steps against etcd show that
// the behaviour is etcd's.
func TestForceNewCluster(t *testing.T) {
	t.Parallel()
	for _, v := range []struct {
		name  string
		f     flavor
		flags []string
		// follower forces a follower rather than the leader; atOnce kills
		// the leader right after the last acknowledged write, before its
		// commit index is written (strata only: etcd may then lose the
		// write, TestForceNewClusterSingleMember).
		follower, atOnce bool
	}{
		{name: "strata", f: strata},
		{name: "strata leader killed at once", f: strata, atOnce: true},
		{name: "strata follower", f: strata, follower: true},
		// Compacted batch files stand for applied entries below the log's
		// snapshot point: the membership must still be found.
		{name: "strata log compaction", f: strata, flags: []string{"--log-compaction", "--log-segment-size=32768"}},
		{name: "etcd", f: etcd},
		{name: "etcd follower", f: etcd, follower: true},
	} {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			// The engine is flushed and the log truncated every 100
			// entries: the member restarts from its engine's applied
			// index and conf state and a log that starts past index 1.
			flags := append(append([]string{"--snapshot-count=100", "--snapshot-catchup-entries=10"}, clusterFlags...), v.flags...)
			c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, v.f), Size: 3, Flags: flags})
			forceNewCluster(t, c, v.follower, v.atOnce)
		})
	}
}

// forceNewCluster runs TestForceNewCluster's steps on c, forcing its
// leader, or a follower if follower; atOnce kills the leader as soon as
// the last write is acknowledged.
func forceNewCluster(t *testing.T, c *testutil.Cluster, follower, atOnce bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cli := c.Client(t)
	// Puts over fewer keys than puts, so that keys have several versions,
	// and one delete.
	type ack struct {
		value     string
		mod, ver  int64
		create    int64
		tombstone bool
	}
	acks := map[string]ack{}
	value := strings.Repeat("v", 200) // fills log segments (log compaction)
	for i := range 400 {
		k := fmt.Sprintf("key-%03d", i%120)
		resp, err := cli.Put(ctx, k, fmt.Sprintf("%s-%d", value, i))
		if err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
		a := acks[k]
		if a.create == 0 {
			a.create = resp.Header.Revision
		}
		a.value, a.mod, a.ver = fmt.Sprintf("%s-%d", value, i), resp.Header.Revision, a.ver+1
		acks[k] = a
	}
	// A leader's commit index is written lazily (strata and etcd alike); a
	// follower's comes with the leader's next message.
	l, err := c.WaitLeader(faultTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if follower {
		l = followers(c, l)[0]
	}
	forced := c.Members[l]
	del, err := cli.Delete(ctx, "key-007")
	if err != nil || del.Deleted != 1 {
		t.Fatalf("delete key-007: %v (%v)", err, del)
	}
	if atOnce {
		// The leader acknowledged the delete once it had applied it, so
		// after its own append; the kill most likely lands before its
		// next tick writes the commit index.
		forced.Kill()
	}
	acks["key-007"] = ack{tombstone: true}
	lastRev := del.Header.Revision
	clusterID := del.Header.ClusterId
	if !atOnce {
		// Every member applies the last write before the kill, and the
		// wait lets the last commit index reach each log (a heartbeat is
		// 25 ms).
		for _, m := range c.Members {
			waitRevision(t, m.Endpoint(), lastRev)
		}
		time.Sleep(500 * time.Millisecond) // several heartbeats; see above
	}
	for _, m := range c.Members {
		m.Kill()
	}

	forced.SetEnv("ETCD_FORCE_NEW_CLUSTER=true")
	forced.Restart()
	checkForcingLine(t, forced.CurrentOutput(), clusterID, forced.ID)
	fcli := newClient(t, forced.Endpoint())
	check := func(when string) {
		t.Helper()
		for k, a := range acks {
			resp, err := fcli.Get(ctx, k)
			if err != nil {
				t.Fatalf("%s: get %s: %v", when, k, err)
			}
			switch {
			case a.tombstone && len(resp.Kvs) != 0:
				t.Errorf("%s: deleted %s is back: %q", when, k, resp.Kvs[0].Value)
			case a.tombstone:
			case len(resp.Kvs) != 1:
				t.Errorf("%s: acknowledged %s is missing", when, k)
			case string(resp.Kvs[0].Value) != a.value || resp.Kvs[0].ModRevision != a.mod ||
				resp.Kvs[0].CreateRevision != a.create || resp.Kvs[0].Version != a.ver:
				kv := resp.Kvs[0]
				t.Errorf("%s: %s: value ...%q mod %d create %d version %d, want ...%q mod %d create %d version %d", when, k,
					tail(kv.Value), kv.ModRevision, kv.CreateRevision, kv.Version, tail([]byte(a.value)), a.mod, a.create, a.ver)
			}
		}
	}
	checkMembers := func(when string, want ...uint64) {
		t.Helper()
		resp, err := fcli.MemberList(ctx)
		if err != nil {
			t.Fatalf("%s: member list: %v", when, err)
		}
		var got []string
		for _, m := range resp.Members {
			got = append(got, fmt.Sprintf("%x learner=%v", m.ID, m.IsLearner))
		}
		var wantS []string
		for _, id := range want {
			wantS = append(wantS, fmt.Sprintf("%x learner=false", id))
		}
		if strings.Join(got, ",") != strings.Join(wantS, ",") {
			t.Errorf("%s: member list %v, want %v", when, got, wantS)
		}
		if resp.Header.MemberId != forced.ID {
			t.Errorf("%s: member ID %x, want %x (kept)", when, resp.Header.MemberId, forced.ID)
		}
	}
	check("forced")
	checkMembers("forced", forced.ID)

	// Writes go on from the last acknowledged revision: forcing changes
	// the membership, not the key space.
	resp, err := fcli.Put(ctx, "after-force", "1")
	if err != nil {
		t.Fatalf("put on the forced member: %v", err)
	}
	if resp.Header.Revision != lastRev+1 {
		t.Errorf("first write after forcing at revision %d, want %d", resp.Header.Revision, lastRev+1)
	}
	if resp.Header.ClusterId != clusterID {
		t.Errorf("cluster ID %x after forcing, %x before (kept, as in etcd)", resp.Header.ClusterId, clusterID)
	}
	acks["after-force"] = ack{value: "1", mod: resp.Header.Revision, create: resp.Header.Revision, ver: 1}
	lastRev = resp.Header.Revision

	// Restarted without the flag, it is still a cluster of one.
	forced.Kill()
	forced.SetEnv()
	forced.Restart()
	if out := forced.CurrentOutput(); strings.Contains(out, "forcing restart member") {
		t.Errorf("%s forced again when restarted without the flag", forced.Name())
	}
	check("restarted without the flag")
	checkMembers("restarted without the flag", forced.ID)
	if _, err := fcli.Put(ctx, "after-restart", "2"); err != nil {
		t.Fatalf("put after a restart without the flag: %v", err)
	}
	acks["after-restart"] = ack{value: "2", mod: lastRev + 1, create: lastRev + 1, ver: 1}
	lastRev++

	// A removed member started again on its old data directory learns
	// from the forced member that it was removed, and stops by itself;
	// the forced member goes on alone.
	var old *testutil.Member
	for _, m := range c.Members {
		if m != forced {
			old = m
			break
		}
	}
	old.Launch()
	if _, exited := old.WaitExit(faultTimeout); !exited {
		t.Errorf("removed member %s restarted on its old data did not stop by itself within %v", old.Name(), faultTimeout)
		old.Kill()
	}
	check("after a removed member came back")
	checkMembers("after a removed member came back", forced.ID)

	// A new member added the etcd way catches up.
	nm := c.PrepareMember()
	var add *clientv3.MemberAddResponse
	for {
		add, err = fcli.MemberAdd(ctx, []string{nm.PeerURL()})
		if err == nil || !strings.Contains(err.Error(), "unhealthy cluster") || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // etcd's strict reconfiguration check; retry interval
	}
	if err != nil {
		t.Fatalf("member add after forcing: %v", err)
	}
	c.JoinMember(nm, add.Member.ID, forced.Name()+"="+forced.PeerURL()+","+nm.Name()+"="+nm.PeerURL())
	if err := nm.WaitReady(faultTimeout); err != nil {
		t.Fatalf("added member: %v", err)
	}
	waitRevision(t, nm.Endpoint(), lastRev)
	ncli := newClient(t, nm.Endpoint())
	for k, a := range acks {
		resp, err := ncli.Get(ctx, k, clientv3.WithSerializable())
		if err != nil {
			t.Fatalf("get %s on the new member: %v", k, err)
		}
		if a.tombstone != (len(resp.Kvs) == 0) || (!a.tombstone && (string(resp.Kvs[0].Value) != a.value || resp.Kvs[0].ModRevision != a.mod)) {
			t.Errorf("new member: %s: %v, want %+v", k, resp.Kvs, a)
		}
	}
	checkMembers("with a new member", sortedIDs(forced.ID, add.Member.ID)...)
	if _, err := ncli.Put(ctx, "two-members", "3"); err != nil {
		t.Fatalf("put through the new member: %v", err)
	}
}

// waitRevision waits until the member at endpoint serves revision rev
// from its own state (a serializable read).
func waitRevision(t *testing.T, endpoint string, rev int64) {
	t.Helper()
	cli := newClient(t, endpoint)
	deadline := time.Now().Add(faultTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := cli.Get(ctx, "any", clientv3.WithSerializable())
		cancel()
		if err == nil && resp.Header.Revision >= rev {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not reach revision %d in %v (%v, %v)", endpoint, rev, faultTimeout, resp, err)
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
}

// tail is the end of a long value, for messages.
func tail(v []byte) []byte { return v[max(0, len(v)-8):] }

// sortedIDs are ids in the order member list answers them.
func sortedIDs(ids ...uint64) []uint64 {
	slices.Sort(ids)
	return ids
}

// TestForceNewClusterSingleMember: as etcd, a member started with
// --force-new-cluster on an empty data directory starts as its other flags
// say (here a new cluster of one) without forcing anything. Killed right
// after an acknowledged write and restarted with the flag on its data, it
// forces a cluster it is alone in. strata keeps the write: it takes every
// entry of its log as committed (node/force.go). etcd keeps only entries up
// to its WAL's commit index or its applied index, both written lazily, and
// may lose it: the test logs what etcd did rather than failing on it.
func TestForceNewClusterSingleMember(t *testing.T) {
	t.Parallel()
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			p := start(t, f, "--force-new-cluster")
			if strings.Contains(p.CurrentOutput(), "forcing restart member") {
				t.Errorf("forced on an empty data directory")
			}
			cli := newClient(t, p.Endpoint())
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			put, err := cli.Put(ctx, "k", "v")
			if err != nil {
				t.Fatal(err)
			}
			p.Kill()
			p.Restart()
			if !strings.Contains(p.CurrentOutput(), "forcing restart member") {
				t.Errorf("restarted with the flag on its data: no \"forcing restart member\"")
			}
			get, err := cli.Get(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			switch kept := len(get.Kvs) == 1 && get.Kvs[0].ModRevision == put.Header.Revision; {
			case !kept && f == strata:
				t.Errorf("after the forced restart: %v; want k at revision %d, acknowledged before the kill", get.Kvs, put.Header.Revision)
			case !kept:
				t.Logf("%s lost the write acknowledged at revision %d right before the kill (now at revision %d)", f, put.Header.Revision, get.Header.Revision)
			}
			members, err := cli.MemberList(ctx)
			if err != nil || len(members.Members) != 1 {
				t.Fatalf("member list: %v, %v; want one member", members, err)
			}
			if put2, err := cli.Put(ctx, "k", "v2"); err != nil || put2.Header.Revision != get.Header.Revision+1 {
				t.Fatalf("put after the forced restart: %v, %v; want revision %d", put2, err, get.Header.Revision+1)
			}
		})
	}
}

// checkForcingLine finds etcd's "forcing restart member" line in out and
// checks its fields, as etcd prints them: the cluster and member IDs in
// hex, and the commit indexes.
func checkForcingLine(t *testing.T, out string, clusterID, memberID uint64) {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		var l struct {
			Msg            string  `json:"msg"`
			Logger         *string `json:"logger"`
			ClusterID      string  `json:"cluster-id"`
			LocalMemberID  string  `json:"local-member-id"`
			WALCommitIndex *uint64 `json:"wal-commit-index"`
			CommitIndex    *uint64 `json:"commit-index"`
		}
		if json.Unmarshal([]byte(line), &l) != nil || l.Msg != "forcing restart member" {
			continue
		}
		if l.ClusterID != fmt.Sprintf("%x", clusterID) || l.LocalMemberID != fmt.Sprintf("%x", memberID) ||
			l.WALCommitIndex == nil || l.CommitIndex == nil || *l.CommitIndex < *l.WALCommitIndex || l.Logger != nil {
			t.Errorf("forcing restart member line, unlike etcd's: %s", line)
		}
		return
	}
	t.Errorf("no \"forcing restart member\" line logged")
}
