// Package testutil holds helpers shared by strata's tests. Its main piece is
// a process harness for end-to-end tests: it runs a real server binary
// (strata, or the real etcd built from the tools module) as a subprocess,
// the way a user would, and gives the test handles to kill, stop and
// restart it.
//
// # Binaries
//
// BuildBinaries compiles strata from the repository root and etcd, etcdutl plus
// etcdctl from the tools module, once per test binary, into a directory the
// caller owns (usually a temp dir made in TestMain). It reuses the Go build
// cache, so only the first build on a machine is slow.
//
// # Processes
//
// StartProcess starts one single-member cluster on free loopback ports with a
// temp data dir, waits (bounded) until a clientv3 Get succeeds, and registers
// a t.Cleanup that kills it. The same Options work for both binaries because
// strata accepts etcd's flags with etcd's meanings. Every incarnation's
// stdout and stderr go to one buffer that the harness prints when the test
// fails.
//
//	p := testutil.StartProcess(t, testutil.Options{Binary: bins.Strata})
//	cli := p.Client(t)
//	...
//	p.Kill()    // SIGKILL, then wait for the exit
//	p.Restart() // same data dir, same ports; waits until ready
//
// # Clusters
//
// StartCluster starts N members of one binary with etcd's bootstrap flags
// (--initial-cluster, --initial-cluster-token, --initial-cluster-state) and
// waits for every member and a leader. Each member's advertised peer URL
// is a Proxy, a TCP forwarder in the test process in front of its real
// peer port, so a test can partition a member (Proxy.Blackhole drops its
// links and refuses new ones; Heal lets them through). Members can be
// killed (Kill), frozen (Pause/Resume: SIGSTOP/SIGCONT), restarted
// together (Cluster.RestartMembers: a member without quorum serves only
// serializable reads), added (AddMember, or PrepareMember + etcdctl member
// add + JoinMember) and removed (RemoveMember). Cluster.Leader and
// WaitLeader find the leader a majority of the reachable members agree on.
//
//	c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: bins.Strata, Size: 3})
//	l, _ := c.WaitLeader(10 * time.Second)
//	c.Members[l].Proxy.Blackhole() // partition the leader
//	l2, _ := c.WaitLeader(10*time.Second, l)
//
// Processes are tracked by PID only and signalled through their os.Process;
// the harness never kills by name, and KillAll ends only what it started.
//
// Concurrency: a Process may be used from several goroutines (writers in a
// crash test read Endpoint while the test kills it); Kill, Stop and Restart
// are serialised by the test's own control flow.
package testutil
