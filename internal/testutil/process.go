package testutil

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// Options describe one single-member server process.
type Options struct {
	// Binary is the path of the strata or etcd executable.
	Binary string
	// Name is the member name; "m1" if empty.
	Name string
	// DataDir is the data directory; a fresh temp dir if empty.
	DataDir string
	// Flags are appended after the standard flags, so they can override
	// them (both etcd and strata take the last value of a repeated flag).
	Flags []string
	// Env is added to the inherited environment, e.g.
	// "STRATA_FAILPOINTS=raftlog/before-sync=20".
	Env []string
	// ReadyTimeout bounds the wait for the first successful Get; 30 s if 0.
	ReadyTimeout time.Duration
	// Command, if set, is the whole command line after the binary, for a
	// process that is not a member (a logger: strata logger ...); the
	// member flags below are then not used, nor are the ports picked, and
	// WaitReady does not apply.
	Command []string

	// The fields below are set by the cluster harness (StartCluster,
	// Cluster.AddMember); a single-member test leaves them empty.

	// AdvertisePeerURL is the peer URL the member advertises, e.g. the
	// address of a Proxy in front of its listening peer port; the listening
	// URL if empty.
	AdvertisePeerURL string
	// InitialCluster is --initial-cluster; "<name>=<advertised peer URL>"
	// if empty.
	InitialCluster string
	// ClusterState is --initial-cluster-state; "new" if empty.
	ClusterState string
	// Token is --initial-cluster-token; "e2e-<name>" if empty.
	Token string
	// AdvertiseClientURLsFirst are advertised before the member's own
	// client URL (--advertise-client-urls), e.g. an address its peers
	// cannot reach.
	AdvertiseClientURLsFirst []string
	// NoInitialCluster leaves out --initial-cluster and
	// --initial-cluster-token, for a member that finds its cluster through
	// discovery (--discovery-token in Flags): etcd refuses --initial-cluster
	// beside it.
	NoInitialCluster bool
}

// Process is one server subprocess and its data dir, kept across restarts.
//
// Concurrency: Endpoint, Output and Exited are safe from any goroutine;
// Start, Kill, Stop and Restart are called by the test goroutine.
type Process struct {
	t    testing.TB
	opts Options

	clientURL, peerURL string
	out                *SyncBuffer
	// ownDataDir is set when NewProcess chose the data directory (a fresh
	// temporary one), so a first start that failed may start over in it.
	ownDataDir bool

	mu struct {
		sync.Mutex
		cmd      *exec.Cmd
		done     chan struct{} // closed when the current incarnation has exited
		waitErr  error         // cmd.Wait's result, valid once done is closed
		startOff int           // offset in out where the current incarnation began
		starts   int           // incarnations launched so far
	}
}

// StartProcess starts a server, waits until it serves a Get, and registers
// a cleanup that kills it and, if the test failed, prints its output.
func StartProcess(t testing.TB, opts Options) *Process {
	t.Helper()
	p := NewProcess(t, opts)
	p.Start()
	return p
}

// NewProcess prepares a server (ports, data dir, cleanup) without starting
// it; call Start or Launch.
func NewProcess(t testing.TB, opts Options) *Process {
	t.Helper()
	if opts.Name == "" {
		opts.Name = "m1"
	}
	ownDataDir := opts.DataDir == ""
	if ownDataDir {
		opts.DataDir = filepath.Join(t.TempDir(), opts.Name+".data")
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 30 * time.Second
	}
	p := &Process{t: t, opts: opts, out: &SyncBuffer{}, ownDataDir: ownDataDir}
	p.pickPorts()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("output of %s (%s):\n%s", opts.Name, filepath.Base(opts.Binary), p.Output())
		}
	})
	return p
}

// pickPorts gives the process fresh client and peer ports.
func (p *Process) pickPorts() {
	ports := FreePorts(p.t, 2)
	p.clientURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	p.peerURL = fmt.Sprintf("http://127.0.0.1:%d", ports[1])
}

// Args are the command-line flags the process is started with.
func (p *Process) Args() []string {
	if p.opts.Command != nil {
		return p.opts.Command
	}
	advertise := cmp.Or(p.opts.AdvertisePeerURL, p.peerURL)
	args := []string{
		"--name=" + p.opts.Name,
		"--data-dir=" + p.opts.DataDir,
		"--listen-client-urls=" + p.clientURL,
		"--advertise-client-urls=" + strings.Join(append(slices.Clone(p.opts.AdvertiseClientURLsFirst), p.clientURL), ","),
		"--listen-peer-urls=" + p.peerURL,
		"--initial-advertise-peer-urls=" + advertise,
		"--initial-cluster-state=" + cmp.Or(p.opts.ClusterState, "new"),
		// Short timeouts make the single member elect itself quickly;
		// loopback has no latency worth a longer heartbeat.
		"--heartbeat-interval=25",
		"--election-timeout=250",
	}
	if !p.opts.NoInitialCluster {
		args = append(args,
			"--initial-cluster="+cmp.Or(p.opts.InitialCluster, p.opts.Name+"="+advertise),
			"--initial-cluster-token="+cmp.Or(p.opts.Token, "e2e-"+p.opts.Name))
	}
	args = withEngine(p.opts.Binary, "", args) // STRATA_E2E_ENGINE; before the test's own flags
	return append(args, p.opts.Flags...)
}

// Start launches the process and waits until it is ready; it fails the
// test if the process exits or does not become ready in time.
//
// A port FreePorts found free can be taken before the server binds it: by
// another test binary that go test runs beside this one, or as the local
// port of some connection. The first start of a standalone process whose
// data directory is its own then starts over, twice at most, on new ports
// in an emptied directory; a restart, or a cluster member (whose ports its
// peers know), cannot, and fails.
func (p *Process) Start() {
	p.t.Helper()
	for attempt := 1; ; attempt++ {
		p.Launch()
		err := p.WaitReady(p.opts.ReadyTimeout)
		if err == nil {
			return
		}
		p.mu.Lock()
		first := p.mu.starts == 1
		p.mu.Unlock()
		standalone := p.ownDataDir && p.opts.AdvertisePeerURL == "" && p.opts.InitialCluster == ""
		if attempt < 3 && first && standalone && strings.Contains(p.CurrentOutput(), "address already in use") {
			p.t.Logf("start %s: a port was taken before the server bound it; again on new ports", p.opts.Name)
			if rmErr := os.RemoveAll(p.opts.DataDir); rmErr != nil {
				p.t.Fatalf("start %s: %v; empty the data dir: %v", p.opts.Name, err, rmErr)
			}
			p.mu.Lock()
			p.mu.starts = 0
			p.mu.Unlock()
			p.pickPorts()
			continue
		}
		p.t.Fatalf("start %s: %v", p.opts.Name, err)
	}
}

// Restart starts the process again on the same data dir and ports after it
// has exited (Kill, Stop, or a failpoint) and waits until it is ready.
func (p *Process) Restart() {
	p.t.Helper()
	select {
	case <-p.Exited():
	default:
		p.t.Fatalf("restart %s: the previous incarnation is still running", p.opts.Name)
	}
	p.Start()
}

// SetEnv replaces the extra environment used by the next Start or Restart,
// e.g. to restart without the failpoints a crash test armed.
func (p *Process) SetEnv(env ...string) { p.opts.Env = env }

// Launch starts the process without waiting for it to become ready.
func (p *Process) Launch() {
	p.t.Helper()
	cmd := exec.Command(p.opts.Binary, p.Args()...)
	cmd.Env = append(os.Environ(), p.opts.Env...)
	cmd.Stdout = p.out
	cmd.Stderr = p.out
	// If the test binary dies, the kernel kills the server too: no orphans
	// holding ports and data dirs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	fmt.Fprintf(p.out, "==== start %s %s\n", p.opts.Binary, strings.Join(p.Args(), " "))
	start := p.out.Len()
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("start %s: %v", p.opts.Binary, err)
	}
	track(cmd.Process)
	done := make(chan struct{})
	p.mu.Lock()
	p.mu.cmd, p.mu.done, p.mu.waitErr, p.mu.startOff = cmd, done, nil, start
	p.mu.starts++
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		untrack(cmd.Process)
		p.mu.Lock()
		p.mu.waitErr = err
		p.mu.Unlock()
		fmt.Fprintf(p.out, "==== exit: %v\n", err)
		close(done)
	}()
}

// WaitReady polls with a clientv3 Get until it succeeds, the process exits,
// or timeout passes.
func (p *Process) WaitReady(timeout time.Duration) error {
	return p.waitGet(timeout)
}

// waitGet polls a Get with opts until it succeeds, the process exits, or
// timeout passes.
func (p *Process) waitGet(timeout time.Duration, opts ...clientv3.OpOption) error {
	deadline := time.Now().Add(timeout)
	cli, err := probeClient(p.clientURL)
	if err != nil {
		return err
	}
	defer cli.Close()
	var lastErr error
	for time.Now().Before(deadline) {
		select {
		case <-p.Exited():
			return fmt.Errorf("process exited before ready: %v", p.ExitErr())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, lastErr = cli.Get(ctx, "e2e-ready-probe", opts...)
		cancel()
		if lastErr == nil {
			return nil
		}
		select {
		case <-p.Exited():
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("not ready after %v: last Get error: %v", timeout, lastErr)
}

// Kill sends SIGKILL and waits for the exit. It is a no-op if the process
// has already exited.
func (p *Process) Kill() {
	p.t.Helper()
	if err := p.signalAndWait(syscall.SIGKILL, 10*time.Second); err != nil {
		p.t.Fatalf("kill %s: %v", p.opts.Name, err)
	}
}

// Stop sends SIGTERM and waits up to 10 s for a clean exit, then fails the
// test (after a SIGKILL, so nothing is left running).
func (p *Process) Stop() {
	p.t.Helper()
	if err := p.signalAndWait(syscall.SIGTERM, 10*time.Second); err != nil {
		p.kill()
		p.t.Fatalf("stop %s: %v", p.opts.Name, err)
	}
}

// WaitExit waits up to timeout for the process to exit on its own (a
// failpoint, a fatal start-up error) and returns Wait's error.
func (p *Process) WaitExit(timeout time.Duration) (exitErr error, ok bool) {
	select {
	case <-p.Exited():
		return p.ExitErr(), true
	case <-time.After(timeout):
		return nil, false
	}
}

// kill is Kill without a test failure, for cleanups.
func (p *Process) kill() { _ = p.signalAndWait(syscall.SIGKILL, 10*time.Second) }

func (p *Process) signalAndWait(sig syscall.Signal, timeout time.Duration) error {
	p.mu.Lock()
	cmd, done := p.mu.cmd, p.mu.done
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal %v to pid %d: %w", sig, cmd.Process.Pid, err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("pid %d still running %v after %v", cmd.Process.Pid, sig, timeout)
	}
}

// Exited returns a channel closed when the current incarnation exits; for
// a process never started it is already closed.
func (p *Process) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.done == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return p.mu.done
}

// Pid is the current incarnation's process ID, 0 if it has exited or
// never started.
func (p *Process) Pid() int {
	p.mu.Lock()
	cmd, done := p.mu.cmd, p.mu.done
	p.mu.Unlock()
	if cmd == nil {
		return 0
	}
	select {
	case <-done:
		return 0
	default:
		return cmd.Process.Pid
	}
}

// Starts is the number of incarnations launched so far: a test that must
// tell answers of one incarnation from the next reads it around a request.
func (p *Process) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mu.starts
}

// ExitErr is the current incarnation's exit status (nil for exit code 0);
// meaningful once Exited is closed.
func (p *Process) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mu.waitErr
}

// Endpoint is the client URL, e.g. "http://127.0.0.1:40123".
func (p *Process) Endpoint() string { return p.clientURL }

// PeerURL is the peer URL the member advertises: its own listening URL,
// or the proxy's in a cluster built by StartCluster.
func (p *Process) PeerURL() string { return cmp.Or(p.opts.AdvertisePeerURL, p.peerURL) }

// ListenPeerURL is the peer URL the member listens on.
func (p *Process) ListenPeerURL() string { return p.peerURL }

// DataDir is the member's data directory.
func (p *Process) DataDir() string { return p.opts.DataDir }

// Name is the member name.
func (p *Process) Name() string { return p.opts.Name }

// Output is everything every incarnation wrote to stdout and stderr.
func (p *Process) Output() string { return p.out.String() }

// CurrentOutput is what the current (or last) incarnation wrote.
func (p *Process) CurrentOutput() string {
	p.mu.Lock()
	off := p.mu.startOff
	p.mu.Unlock()
	s := p.out.String()
	if off > len(s) {
		return ""
	}
	return s[off:]
}

// Client returns a clientv3 client for the process, closed at cleanup.
func (p *Process) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{p.clientURL},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("client for %s: %v", p.clientURL, err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// Result is how a command that ran to its end finished.
type Result struct {
	Code           int // exit code; 0 for success
	Stdout, Stderr string
}

// RunToExit runs binary with args until it exits or timeout passes (then it
// is killed and the test fails) and returns its exit code and output. It is
// for commands expected to end by themselves: etcdctl, `strata inspect`, or
// a server that must refuse to start.
func RunToExit(t testing.TB, timeout time.Duration, stdin string, env []string, binary string, args ...string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if len(args) > 0 && args[0] == "restore" {
		args = withEngine(binary, "restore", args) // STRATA_E2E_ENGINE: the member restored onto starts on it
	}
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %v: still running after %v (killed); stdout:\n%s\nstderr:\n%s",
			filepath.Base(binary), args, timeout, stdout.String(), stderr.String())
	}
	res := Result{Stdout: stdout.String(), Stderr: stderr.String()}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		res.Code = exitErr.ExitCode()
	default:
		t.Fatalf("run %s %v: %v", binary, args, err)
	}
	return res
}

// SyncBuffer is a bytes.Buffer safe for the two copy goroutines of
// exec.Cmd and the test reading it.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Len returns the number of bytes written so far.
func (b *SyncBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Len()
}

// usedPorts remembers ports handed out in this test binary, so that two
// parallel tests never get the same one even though each listener is closed
// before the server binds it.
var usedPorts = struct {
	sync.Mutex
	m map[int]bool
}{m: map[int]bool{}}

// FreePorts returns n distinct loopback ports that were free a moment ago
// and that no other test in this binary has been given.
//
// They are drawn at random below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range, 32768-60999 by default): a port bound
// with :0 comes from that range, which every outgoing connection's local
// port also comes from, so a port found free there is often taken by some
// client's connection before the server binds it. Below the range only
// other tests' servers bind, and the random draw keeps the test binaries
// that go test runs side by side apart.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 10000 {
			t.Fatalf("free port: none found in %d-%d", minTestPort, maxTestPort)
		}
		port := minTestPort + rand.IntN(maxTestPort-minTestPort)
		usedPorts.Lock()
		taken := usedPorts.m[port]
		usedPorts.Unlock()
		if taken {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // bound by another process
		}
		l.Close()
		usedPorts.Lock()
		fresh := !usedPorts.m[port]
		usedPorts.m[port] = true
		usedPorts.Unlock()
		if fresh {
			ports = append(ports, port)
		}
	}
	return ports
}

// The range FreePorts draws from: above the well-known ports, below the
// default ephemeral range.
const (
	minTestPort = 20000
	maxTestPort = 32000
)

// live tracks every process the harness started and has not yet reaped, by
// *os.Process (so by PID), for KillAll.
var live = struct {
	sync.Mutex
	m map[*os.Process]bool
}{m: map[*os.Process]bool{}}

func track(p *os.Process) {
	live.Lock()
	live.m[p] = true
	live.Unlock()
}

func untrack(p *os.Process) {
	live.Lock()
	delete(live.m, p)
	live.Unlock()
}

// KillAll sends SIGKILL to every process this harness started that is still
// running. TestMain calls it last, as a safety net behind t.Cleanup.
func KillAll() {
	live.Lock()
	defer live.Unlock()
	for p := range live.m {
		_ = p.Kill()
	}
}

// Pause freezes the process with SIGSTOP: it keeps its sockets open but
// answers nothing, like a member stuck in a long GC pause or a hung disk.
// Resume undoes it; Kill works on a paused process.
func (p *Process) Pause() {
	p.t.Helper()
	if err := p.signal(syscall.SIGSTOP); err != nil {
		p.t.Fatalf("pause %s: %v", p.opts.Name, err)
	}
}

// Resume continues a process frozen by Pause with SIGCONT.
func (p *Process) Resume() {
	p.t.Helper()
	if err := p.signal(syscall.SIGCONT); err != nil {
		p.t.Fatalf("resume %s: %v", p.opts.Name, err)
	}
}

// signal sends sig to the current incarnation without waiting for anything.
func (p *Process) signal(sig syscall.Signal) error {
	p.mu.Lock()
	cmd, done := p.mu.cmd, p.mu.done
	p.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("signal %v: never started", sig)
	}
	select {
	case <-done:
		return fmt.Errorf("signal %v to pid %d: already exited: %v", sig, cmd.Process.Pid, p.ExitErr())
	default:
	}
	if err := cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %v to pid %d: %w", sig, cmd.Process.Pid, err)
	}
	return nil
}

// probeClient is a client for polling a server that may not listen yet.
// gRPC's default reconnect backoff starts at 1 s, so a client that dialed
// before the server listened would make every readiness wait (and every
// recovery time measured through one) at least a second long; this one
// redials every 50-200 ms.
func probeClient(endpoint string) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 200 * time.Millisecond},
			MinConnectTimeout: time.Second,
		})},
	})
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", endpoint, err)
	}
	return cli, nil
}
