package testutil

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// ClusterOptions describe a cluster of server processes.
type ClusterOptions struct {
	// Binary is the path of the strata or etcd executable.
	Binary string
	// Size is the number of members to bootstrap (3 or 5, usually).
	Size int
	// Flags are appended to every member's flags.
	Flags []string
	// ReadyTimeout bounds each member's and the leader's wait; 30 s if 0.
	ReadyTimeout time.Duration
	// AdvertiseClientURLsFirst are advertised by every member before its
	// own client URL (Options.AdvertiseClientURLsFirst).
	AdvertiseClientURLsFirst []string
}

// Member is one process of a Cluster and the proxy in front of its peer
// port.
type Member struct {
	*Process
	// Proxy forwards the member's advertised peer URL to its listening
	// peer port; Blackhole it to partition the member.
	Proxy *Proxy
	// ID is the raft member ID, known once the member has served a Status.
	ID uint64
}

// Cluster is N members of the real binary on loopback, bootstrapped with
// etcd's flags, each behind its own peer Proxy.
//
// Concurrency: the Cluster's methods and Members are for the test
// goroutine (AddMember appends to Members); the Processes, Proxies and
// clients obtained from them may be used from any goroutine.
type Cluster struct {
	t     testing.TB
	opts  ClusterOptions
	token string
	// initial is the --initial-cluster the members bootstrapped with.
	initial string
	// members is Members for the proxies' goroutines (sourceOf).
	members struct {
		sync.Mutex
		list []*Member
	}
	// Members are in bootstrap order, then in the order AddMember added them;
	// a removed member stays in the slice (stopped) so indexes are stable.
	Members []*Member
}

// StartCluster starts opts.Size members in parallel with
// --initial-cluster-state=new and waits until every one serves a Get and
// a leader is elected. Cleanup kills every member and closes every proxy.
func StartCluster(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 30 * time.Second
	}
	c := &Cluster{t: t, opts: opts, token: fmt.Sprintf("e2e-cluster-%d", time.Now().UnixNano())}
	var initial []string
	for i := range opts.Size {
		m := c.newMember(fmt.Sprintf("m%d", i+1))
		c.addMember(m)
		initial = append(initial, m.Name()+"="+m.PeerURL())
	}
	c.initial = strings.Join(initial, ",")
	for _, m := range c.Members {
		m.opts.InitialCluster = c.initial
		m.opts.ClusterState = "new"
		m.Launch()
	}
	// The first member cannot answer before a quorum has started, so launch
	// all, then wait for each.
	for _, m := range c.Members {
		if err := m.WaitReady(opts.ReadyTimeout); err != nil {
			t.Fatalf("start cluster: member %s: %v", m.Name(), err)
		}
	}
	if _, err := c.WaitLeader(opts.ReadyTimeout); err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	for _, m := range c.Members {
		c.fillID(m)
	}
	return c
}

// Token is the cluster's --initial-cluster-token.
func (c *Cluster) Token() string { return c.token }

// InitialCluster is the --initial-cluster the members bootstrapped with.
func (c *Cluster) InitialCluster() string { return c.initial }

// newMember prepares a process and its proxy without starting either
// process; the proxy runs from now on.
func (c *Cluster) newMember(name string) *Member {
	p := NewProcess(c.t, Options{
		Binary:       c.opts.Binary,
		Name:         name,
		Flags:        c.opts.Flags,
		ReadyTimeout: c.opts.ReadyTimeout,
		Token:        c.token,

		AdvertiseClientURLsFirst: c.opts.AdvertiseClientURLsFirst,
	})
	u, err := url.Parse(p.ListenPeerURL())
	if err != nil {
		c.t.Fatalf("member %s: peer URL %q: %v", name, p.ListenPeerURL(), err)
	}
	px, err := NewProxy(u.Host)
	if err != nil {
		c.t.Fatalf("member %s: %v", name, err)
	}
	px.SetSourceOf(c.sourceOf)
	px.Start()
	// Registered after NewProcess's cleanup, so it runs before it: the
	// proxy closes first, then the process is killed; both orders are safe.
	c.t.Cleanup(px.Close)
	p.opts.AdvertisePeerURL = px.URL()
	return &Member{Process: p, Proxy: px}
}

// fillID learns a member's raft ID from its Status answer.
func (c *Cluster) fillID(m *Member) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := status(ctx, m.Endpoint())
	if err != nil {
		c.t.Fatalf("status of %s: %v", m.Name(), err)
	}
	m.ID = st.Header.MemberId
}

// Endpoints are the client URLs of every member ever started, including
// ones that are down: clientv3 fails over among them.
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, m := range c.Members {
		eps = append(eps, m.Endpoint())
	}
	return eps
}

// Client returns a clientv3 client on the given endpoints (every member's
// if none), closed at cleanup.
func (c *Cluster) Client(t testing.TB, endpoints ...string) *clientv3.Client {
	t.Helper()
	if len(endpoints) == 0 {
		endpoints = c.Endpoints()
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("client for %v: %v", endpoints, err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// running reports whether m's current incarnation is alive.
func running(m *Member) bool {
	select {
	case <-m.Exited():
		return false
	default:
		return true
	}
}

// Leader asks every running member that is not excluded for its status
// and returns the index of the member a majority of those answering name
// as leader, provided that member itself answers and agrees. Members that
// are partitioned or paused should be excluded: an isolated old leader
// believes it leads until CheckQuorum demotes it.
func (c *Cluster) Leader(ctx context.Context, exclude ...int) (int, error) {
	votes := map[uint64]int{}
	ids := map[uint64]int{}
	answered := 0
	var lastErr error
	for i, m := range c.Members {
		if slices.Contains(exclude, i) || !running(m) {
			continue
		}
		st, err := status(ctx, m.Endpoint())
		if err != nil {
			lastErr = fmt.Errorf("status of %s: %w", m.Name(), err)
			continue
		}
		answered++
		ids[st.Header.MemberId] = i
		if st.Leader != 0 {
			votes[st.Leader]++
		}
	}
	for id, n := range votes {
		if i, ok := ids[id]; ok && 2*n > answered {
			return i, nil
		}
	}
	if lastErr == nil {
		lastErr = fmt.Errorf("no leader agreed on by a majority of %d answering members (votes %v)", answered, votes)
	}
	return -1, lastErr
}

// WaitLeader polls Leader until it finds one or timeout passes.
func (c *Cluster) WaitLeader(timeout time.Duration, exclude ...int) (int, error) {
	deadline := time.Now().Add(timeout)
	var lastErr error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		i, err := c.Leader(ctx, exclude...)
		cancel()
		if err == nil {
			return i, nil
		}
		lastErr = err
		time.Sleep(20 * time.Millisecond) // poll interval, not synchronisation
	}
	return -1, fmt.Errorf("no leader after %v: %v", timeout, lastErr)
}

// AddMember asks the cluster to add a member (as a learner if learner),
// then starts it with --initial-cluster-state=existing and waits until it
// serves a serializable Get. The new member gets the next free name.
func (c *Cluster) AddMember(learner bool) *Member {
	c.t.Helper()
	m := c.PrepareMember()
	cli := c.Client(c.t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var (
		resp *clientv3.MemberAddResponse
		err  error
	)
	for {
		if learner {
			resp, err = cli.MemberAddAsLearner(ctx, []string{m.PeerURL()})
		} else {
			resp, err = cli.MemberAdd(ctx, []string{m.PeerURL()})
		}
		// etcd refuses changes until every member has been connected for
		// 5 s (strict reconfiguration check); retry that refusal only.
		if err == nil || !strings.Contains(err.Error(), "unhealthy cluster") || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // retry interval
	}
	if err != nil {
		c.t.Fatalf("member add %s (learner %v): %v", m.PeerURL(), learner, err)
	}
	var initial []string
	for _, mm := range resp.Members {
		name := mm.Name
		if mm.ID == resp.Member.ID {
			name = m.Name()
		}
		for _, u := range mm.PeerURLs {
			initial = append(initial, name+"="+u)
		}
	}
	c.JoinMember(m, resp.Member.ID, strings.Join(initial, ","))
	if !learner {
		// A voter that serves a linearizable read has applied the log up
		// to a recent commit, membership included. Before that, strata
		// answers from a stale view (MemberRemove of a member it has not
		// learned of: "member not found"); tests of something else must
		// not trip on it.
		if err := m.WaitReady(c.opts.ReadyTimeout); err != nil {
			c.t.Fatalf("added member %s: %v", m.Name(), err)
		}
	}
	return m
}

// PrepareMember makes the next member (name m<N+1>, ports, proxy) without
// adding it to the cluster or starting it: the test adds it, e.g. with
// etcdctl member add --peer-urls=<m.PeerURL()>, then calls JoinMember.
func (c *Cluster) PrepareMember() *Member {
	c.t.Helper()
	return c.newMember(fmt.Sprintf("m%d", len(c.Members)+1))
}

// JoinMember starts a prepared member that the cluster has accepted with
// ID id, with --initial-cluster-state=existing and the given
// --initial-cluster, appends it to Members and waits until it serves a
// serializable Get (a learner serves no linearizable reads).
func (c *Cluster) JoinMember(m *Member, id uint64, initialCluster string) {
	c.t.Helper()
	m.ID = id
	m.opts.InitialCluster = initialCluster
	m.opts.ClusterState = "existing"
	c.addMember(m)
	m.Launch()
	if err := m.waitServing(c.opts.ReadyTimeout); err != nil {
		c.t.Fatalf("start added member %s: %v", m.Name(), err)
	}
}

// RemoveMember asks the cluster to remove member i, then waits (bounded)
// for its process to exit and kills it if it does not: a removed member
// stops by itself in etcd, and a test must not hang on that. It reports
// whether the member exited by itself.
func (c *Cluster) RemoveMember(i int) (exitedByItself bool) {
	c.t.Helper()
	m := c.Members[i]
	// Asked of the other members: the answer of a member removing itself
	// may be lost as it stops (a strata bug that
	// e2e.TestClusterRemoveSelfAnswers shows), and this helper is for
	// tests of something else.
	var others []string
	for j, o := range c.Members {
		if j != i && running(o) {
			others = append(others, o.Endpoint())
		}
	}
	cli := c.Client(c.t, others...)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for {
		_, err := cli.MemberRemove(ctx, m.ID)
		if err == nil {
			break
		}
		// etcd's strict reconfiguration check refuses while a member has
		// been connected for less than 5 s; that refusal changed nothing.
		if !strings.Contains(err.Error(), "unhealthy cluster") || ctx.Err() != nil {
			c.t.Fatalf("member remove %s (%x): %v", m.Name(), m.ID, err)
		}
		time.Sleep(100 * time.Millisecond) // retry interval
	}
	if _, ok := m.WaitExit(3 * time.Second); ok {
		return true
	}
	m.Kill()
	return false
}

// waitServing waits until the member answers a serializable Get: a learner
// serves no linearizable reads, so WaitReady's Get would never succeed.
func (p *Process) waitServing(timeout time.Duration) error {
	return p.waitGet(timeout, clientv3.WithSerializable())
}

// status asks one endpoint for its Maintenance.Status.
func status(ctx context.Context, endpoint string) (*clientv3.StatusResponse, error) {
	cli, err := probeClient(endpoint)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	return cli.Status(ctx, endpoint)
}

// RestartMembers launches the stopped members at the given indexes
// together (a member of a cluster without quorum cannot become ready
// alone) and waits until each serves a serializable Get.
func (c *Cluster) RestartMembers(idx ...int) {
	c.t.Helper()
	for _, i := range idx {
		m := c.Members[i]
		if running(m) {
			c.t.Fatalf("restart %s: the previous incarnation is still running", m.Name())
		}
		m.Launch()
	}
	for _, i := range idx {
		if err := c.Members[i].waitServing(c.opts.ReadyTimeout); err != nil {
			c.t.Fatalf("restart %s: %v", c.Members[i].Name(), err)
		}
	}
}

// sourceOf names the member whose process dialed a proxied connection, ""
// if none of the running members did. Proxies call it on their goroutines.
func (c *Cluster) sourceOf(accepted net.Conn) string {
	c.members.Lock()
	list := c.members.list
	c.members.Unlock()
	byPid := map[int]string{}
	var pids []int
	for _, m := range list {
		if pid := m.Pid(); pid != 0 {
			byPid[pid] = m.Name()
			pids = append(pids, pid)
		}
	}
	// One read of /proc/net/tcp can miss a socket while other sockets come
	// and go; a dial let through unnamed would slip past BlockSource, so
	// look again before giving up (a dialer that is no member, such as a
	// test's client, is never found).
	for range 3 {
		if pid, ok := socketOwner(accepted, pids); ok {
			return byPid[pid]
		}
	}
	return ""
}

// addMember appends m to Members and to the proxies' copy.
func (c *Cluster) addMember(m *Member) {
	c.Members = append(c.Members, m)
	c.members.Lock()
	c.members.list = append([]*Member(nil), c.Members...)
	c.members.Unlock()
}

// Isolate partitions member i from every other member in both
// directions: its proxy refuses everyone (Blackhole), and every other
// member's proxy refuses connections member i dials. Clients still reach
// it.
func (c *Cluster) Isolate(i int) {
	c.Members[i].Proxy.Blackhole()
	for j, m := range c.Members {
		if j != i {
			m.Proxy.BlockSource(c.Members[i].Name())
		}
	}
}

// Heal undoes Isolate(i).
func (c *Cluster) Heal(i int) {
	c.Members[i].Proxy.Heal()
	for j, m := range c.Members {
		if j != i {
			m.Proxy.UnblockSource(c.Members[i].Name())
		}
	}
}
