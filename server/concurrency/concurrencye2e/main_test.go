// Package concurrencye2e tests locks and elections the way users meet
// them, against the strata binary started by internal/testutil: etcdctl
// lock and etcdctl elect (which run clientv3/concurrency's recipe over
// KV, Lease and Watch), concurrency.Mutex and concurrency.Election under
// contention, and the v3lock and v3election gRPC services, whose tests
// also run against real etcd to show that strata answers as it does.
package concurrencye2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strata-kv/strata/internal/testutil"
)

// bins are built once by TestMain: strata, and etcd and etcdctl from
// tools/.
var bins testutil.Binaries

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithBinaries(m, &bins))
}

// start runs a fresh single-member server of the given flavor ("strata"
// or "etcd").
func start(t *testing.T, flavor string) (*testutil.Process, *clientv3.Client) {
	t.Helper()
	bin := bins.Strata
	if flavor == "etcd" {
		bin = bins.Etcd
	}
	p := testutil.StartProcess(t, testutil.Options{Binary: bin})
	return p, p.Client(t)
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond until it holds, failing the test after 20 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting after 20 s for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// keysUnder returns the keys under pfx in create-revision order.
func keysUnder(t *testing.T, cli *clientv3.Client, pfx string) []string {
	t.Helper()
	resp, err := cli.Get(ctxT(t, 10*time.Second), pfx, clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatalf("get %s: %v", pfx, err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	return keys
}

// ctl is an etcdctl process that runs until it exits or is signalled.
type ctl struct {
	cmd  *exec.Cmd
	out  *testutil.SyncBuffer
	errb *testutil.SyncBuffer
	done chan struct{}
	err  error // set before done closes
}

// startCtl starts etcdctl against p with args.
func startCtl(t *testing.T, p *testutil.Process, args ...string) *ctl {
	t.Helper()
	c := &ctl{out: &testutil.SyncBuffer{}, errb: &testutil.SyncBuffer{}, done: make(chan struct{})}
	c.cmd = exec.Command(bins.Etcdctl, append([]string{"--endpoints=" + p.Endpoint()}, args...)...)
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.errb
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start etcdctl %v: %v", args, err)
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.done
	})
	return c
}

func (c *ctl) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// waitOutput waits until stdout contains s.
func (c *ctl) waitOutput(t *testing.T, s string) {
	t.Helper()
	eventually(t, fmt.Sprintf("etcdctl %v to print %q (stdout %q, stderr %q)", c.cmd.Args[1:], s, c.out.String(), c.errb.String()),
		func() bool { return strings.Contains(c.out.String(), s) })
}

// signal sends sig and waits up to 20 s for the exit, returning its error.
func (c *ctl) signal(t *testing.T, sig syscall.Signal) error {
	t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal etcdctl: %v", err)
	}
	return c.wait(t)
}

// wait waits up to 20 s for the exit and returns its error.
func (c *ctl) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-c.done:
		return c.err
	case <-time.After(20 * time.Second):
		t.Fatalf("etcdctl %v still running after 20 s; stdout %q, stderr %q", c.cmd.Args[1:], c.out.String(), c.errb.String())
		return nil
	}
}
