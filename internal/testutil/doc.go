// Package testutil holds helpers shared by strata's tests. Its main piece is
// a process harness for end-to-end tests: it runs a real server binary
// (strata, or the real etcd built from the tools module) as a subprocess,
// the way a user would, and gives the test handles to kill, stop and
// restart it.
//
// # Binaries
//
// BuildBinaries compiles strata from the repository root and etcd plus
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
// Processes are tracked by PID only and signalled through their os.Process;
// the harness never kills by name, and KillAll ends only what it started.
//
// Concurrency: a Process may be used from several goroutines (writers in a
// crash test read Endpoint while the test kills it); Kill, Stop and Restart
// are serialised by the test's own control flow.
package testutil
