// Package cluster starts, watches and stops the servers that the benchmark
// drives: real etcd and strata, each as a child process on free loopback
// ports with its own temporary data directory.
//
// Both servers take etcd's flag names, so one argument builder serves both;
// a Spec adds what differs (the binary, strata's --log-dir and --engine-wal).
// Durability is the same on both sides: etcd fsyncs every commit by default
// and strata does so by design; nothing here turns that off.
//
// Processes are tracked by PID and only ever signalled by PID: the benchmark
// runs on machines shared with other people's etcd processes, so it never
// kills by name.
//
// Usage:
//
//	c, err := cluster.Start(ctx, spec, dir, log)
//	defer c.Stop()
//	cli, err := c.Client()
//	before, _ := c.Sample()
//	... drive load ...
//	after, _ := c.Sample()
//	delta := after.Sub(before)
//
// Concurrency: a Cluster is used by one goroutine (the benchmark driver);
// Endpoints may be read from any goroutine.
//
// Members: Spec.Members starts that many members on one machine, bootstrapped
// together with one --initial-cluster; the load goes to all their client URLs
// (clientv3 balances round-robin), resource counters are summed over members
// (peak RSS: the largest), and Kill/Restart act on member 0. Single-member
// clusters are the default until strata's replication is measured.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Kind names a server implementation; it decides which flags are passed.
type Kind string

const (
	// KindEtcd is the real etcd server built from the tools module.
	KindEtcd Kind = "etcd"
	// KindStrata is strata's server binary (cmd/strata).
	KindStrata Kind = "strata"
)

// Spec describes one server flavour to benchmark.
type Spec struct {
	// Name labels results, e.g. "etcd", "strata", "strata-wal".
	Name string
	// Kind selects the flag dialect.
	Kind Kind
	// Binary is the path of the executable.
	Binary string
	// ExtraArgs are appended after the generated flags (e.g. "--engine-wal").
	ExtraArgs []string
	// Members is the cluster size, 1 to MaxMembers; 0 means 1.
	Members int
	// FsyncMetrics names Prometheus counters, served on the client URL's
	// /metrics, whose sum is the server's fsync count. Empty means the count
	// is not obtainable for this server, unless Strace is set.
	FsyncMetrics []string
	// Strace, if set, is the path of strace(1): the server then runs under
	// it, tracing only its sync system calls, and those are counted instead
	// of FsyncMetrics. See strace.go for the cost.
	Strace string
	// QuotaBackendBytes is --quota-backend-bytes for every server; 0 means
	// DefaultQuotaBackendBytes.
	QuotaBackendBytes int64
}

// DefaultQuotaBackendBytes is the quota every server gets unless
// Spec.QuotaBackendBytes says otherwise: 8 GiB, so the 10^6-key YCSB load
// fits (etcd's own default is 2 GiB; 8 GiB is its suggested maximum).
const DefaultQuotaBackendBytes = 8 << 30

// MaxMembers bounds Spec.Members: every member runs on this machine.
const MaxMembers = 7

// ErrUnsupportedMembers is returned by Start for a member count outside
// [1, MaxMembers].
var ErrUnsupportedMembers = errors.New("cluster: unsupported member count")

// Timeouts bound every wait: a server that does not answer within them is
// reported as failed instead of hanging the run.
const (
	readyTimeout = 120 * time.Second
	stopTimeout  = 20 * time.Second
	pollInterval = 5 * time.Millisecond
)

// Cluster is a running set of members of one Spec.
//
// Invariants:
//  1. Every started process is either running and in members, or has been
//     waited for (no zombies, no orphan left behind by Stop).
type Cluster struct {
	spec    Spec
	dir     string
	log     *zap.Logger
	members []*member
	// dev is the block device holding dir; nil if it has none (device.go).
	dev *device
}

// member is one server process and the directories and ports it owns.
type member struct {
	name      string
	dataDir   string
	logDir    string // strata only: its raft log directory
	clientURL string
	peerURL   string
	logPath   string // the child's stdout and stderr

	cmd  *exec.Cmd     // the server, or strace running it
	proc *os.Process   // the server process: signals and /proc go here
	done chan struct{} // closed when cmd.Wait returns
	err  error         // cmd.Wait's result, valid after done is closed

	trace *syncCounter // non-nil when running under strace
}

// Start launches spec's members under dir (created if needed; each member gets
// a subdirectory) and waits until a linearizable read succeeds. log may be nil.
func Start(ctx context.Context, spec Spec, dir string, log *zap.Logger) (*Cluster, error) {
	if log == nil {
		log = zap.NewNop()
	}
	n := spec.Members
	if n == 0 {
		n = 1
	}
	if n < 1 || n > MaxMembers {
		return nil, fmt.Errorf("start %s with %d members (want 1 to %d): %w", spec.Name, n, MaxMembers, ErrUnsupportedMembers)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create cluster dir %s: %w", dir, err)
	}
	dev, err := findDevice(dir)
	if err != nil {
		log.Warn("device writes not measured", zap.Error(err))
	}
	c := &Cluster{spec: spec, dir: dir, log: log, dev: dev}
	// All ports in one call: the listeners stay open until every port is
	// chosen, so no two members can be given the same one.
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("m%d", i)
		mdir := filepath.Join(dir, name)
		m := &member{
			name:      name,
			dataDir:   filepath.Join(mdir, "data"),
			clientURL: fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]),
			peerURL:   fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]),
			logPath:   filepath.Join(mdir, "server.log"),
		}
		if spec.Kind == KindStrata {
			m.logDir = filepath.Join(mdir, "raftlog")
		}
		if err := os.MkdirAll(mdir, 0o755); err != nil {
			return nil, fmt.Errorf("create member dir %s: %w", mdir, err)
		}
		c.members = append(c.members, m)
	}
	for _, m := range c.members {
		if err := c.launch(m); err != nil {
			c.Stop()
			return nil, err
		}
	}
	if _, err := c.WaitReady(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// args builds the command line of m: etcd's flag names, understood by both.
func (c *Cluster) args(m *member) []string {
	var initial []string
	for _, o := range c.members {
		initial = append(initial, o.name+"="+o.peerURL)
	}
	a := []string{
		"--name=" + m.name,
		"--data-dir=" + m.dataDir,
		"--listen-client-urls=" + m.clientURL,
		"--advertise-client-urls=" + m.clientURL,
		"--listen-peer-urls=" + m.peerURL,
		"--initial-advertise-peer-urls=" + m.peerURL,
		"--initial-cluster=" + strings.Join(initial, ","),
		"--initial-cluster-state=new",
		"--initial-cluster-token=strata-bench",
	}
	// Quiet logs; the same larger quota on both, so the 10^6-key YCSB load
	// fits. Neither changes durability.
	quota := c.spec.QuotaBackendBytes
	if quota <= 0 {
		quota = DefaultQuotaBackendBytes
	}
	a = append(a, "--log-level=warn", "--quota-backend-bytes="+strconv.FormatInt(quota, 10))
	if c.spec.Kind == KindStrata {
		a = append(a, "--log-dir="+m.logDir)
	}
	return append(a, c.spec.ExtraArgs...)
}

// launch starts m's process and a goroutine that waits for it.
func (c *Cluster) launch(m *member) error {
	out, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open server log %s: %w", m.logPath, err)
	}
	cmd := exec.Command(c.spec.Binary, c.args(m)...)
	var trace *syncCounter
	if c.spec.Strace != "" {
		trace = &syncCounter{path: filepath.Join(filepath.Dir(m.logPath), fmt.Sprintf("sync-trace.%d", time.Now().UnixNano()))}
		cmd = exec.Command(c.spec.Strace, append(straceArgs(trace.path, c.spec.Binary), c.args(m)...)...)
	}
	cmd.Stdout = out
	cmd.Stderr = out
	// Own process group, so a Ctrl-C aimed at the benchmark reaches the
	// benchmark first and it can stop the servers in order. Killed with
	// the benchmark if it dies without stopping them (seen: servers of a
	// run whose benchmark was killed kept running, loading later runs).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("start %s member %s (%s): %w", c.spec.Name, m.name, c.spec.Binary, err)
	}
	m.cmd = cmd
	m.proc = cmd.Process
	m.trace = trace
	m.done = make(chan struct{})
	go func() {
		m.err = cmd.Wait()
		out.Close()
		close(m.done)
	}()
	if trace != nil {
		pid, err := tracedChild(cmd.Process.Pid, c.spec.Binary, m.done)
		if err != nil {
			_ = cmd.Process.Kill()
			<-m.done
			return fmt.Errorf("start %s member %s under strace: %w; see %s", c.spec.Name, m.name, err, m.logPath)
		}
		if m.proc, err = os.FindProcess(pid); err != nil {
			return fmt.Errorf("find traced %s member %s: %w", c.spec.Name, m.name, err)
		}
	}
	c.log.Info("started server", zap.String("server", c.spec.Name), zap.String("member", m.name),
		zap.Int("pid", m.proc.Pid), zap.String("client", m.clientURL), zap.Bool("strace", trace != nil))
	return nil
}

// Args returns the command line member 0 runs with (after strace's, if
// any), for the report.
func (c *Cluster) Args() []string {
	return append([]string{c.spec.Binary}, c.args(c.members[0])...)
}

// Spec returns the spec the cluster was started with.
func (c *Cluster) Spec() Spec { return c.spec }

// Endpoints returns the client URLs of all members.
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.clientURL)
	}
	return eps
}

// PID returns the process id of member 0, or 0 if it is not running.
func (c *Cluster) PID() int {
	m := c.members[0]
	if m.cmd == nil || m.exited() {
		return 0
	}
	return m.proc.Pid
}

// Client returns a new client for the cluster; the caller closes it.
func (c *Cluster) Client() (*clientv3.Client, error) {
	return NewClient(c.Endpoints())
}

// NewClient returns a quiet clientv3 client for endpoints.
func NewClient(endpoints []string) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("connect to %v: %w", endpoints, err)
	}
	return cli, nil
}

// exited reports whether m's process has been reaped.
func (m *member) exited() bool {
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}

// WaitReady polls until a linearizable read succeeds on every member and
// returns how long that took. It fails early if a member exits, and after
// readyTimeout.
func (c *Cluster) WaitReady(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for _, m := range c.members {
		if err := c.waitMember(ctx, m); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

// waitMember polls one member with short linearizable reads.
func (c *Cluster) waitMember(ctx context.Context, m *member) error {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	// Wait for the port first: gRPC backs off for a second after a refused
	// dial, which would put a one-second floor under every restart time.
	host := strings.TrimPrefix(m.clientURL, "http://")
	for {
		if m.exited() {
			return fmt.Errorf("%s member %s exited before it was ready (%v); see %s", c.spec.Name, m.name, m.err, m.logPath)
		}
		conn, err := net.DialTimeout("tcp", host, time.Second)
		if err == nil {
			conn.Close()
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s member %s not listening on %s: %w (last error: %v); see %s", c.spec.Name, m.name, host, ctx.Err(), err, m.logPath)
		case <-tick.C:
		}
	}
	cli, err := NewClient([]string{m.clientURL})
	if err != nil {
		return err
	}
	defer cli.Close()
	var lastErr error
	for {
		if m.exited() {
			return fmt.Errorf("%s member %s exited before it was ready (%v); see %s", c.spec.Name, m.name, m.err, m.logPath)
		}
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		_, lastErr = cli.Get(rctx, "strata-bench-ready")
		rcancel()
		if lastErr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s member %s not ready: %w (last error: %v); see %s", c.spec.Name, m.name, ctx.Err(), lastErr, m.logPath)
		case <-tick.C:
		}
	}
}

// Stop terminates every member: SIGTERM to all, a bounded wait, then
// SIGKILL to those still running, always by PID. It is safe to call more
// than once.
func (c *Cluster) Stop() error {
	var errs []error
	var running []*member
	for _, m := range c.members {
		if m.cmd == nil || m.exited() {
			continue
		}
		if err := m.proc.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			errs = append(errs, fmt.Errorf("signal %s member %s: %w", c.spec.Name, m.name, err))
		}
		running = append(running, m)
	}
	deadline := time.NewTimer(stopTimeout)
	defer deadline.Stop()
	for _, m := range running {
		select {
		case <-m.done:
			continue
		case <-deadline.C:
		}
		// The deadline passed: kill this member and every one after it.
		for _, k := range running {
			if k.exited() {
				continue
			}
			c.log.Warn("server ignored SIGTERM; killing", zap.String("server", c.spec.Name), zap.Int("pid", k.proc.Pid))
			_ = k.proc.Kill()
			if k.proc != k.cmd.Process {
				_ = k.cmd.Process.Kill() // strace itself
			}
			<-k.done
		}
		break
	}
	return errors.Join(errs...)
}

// Kill sends SIGKILL to member 0 and waits until it is reaped: the crash half
// of the restart measurement.
func (c *Cluster) Kill() error {
	m := c.members[0]
	if m.cmd == nil || m.exited() {
		return fmt.Errorf("kill %s member %s: not running", c.spec.Name, m.name)
	}
	// Under strace, killing the server ends strace too: it exits when its
	// last tracee does.
	if err := m.proc.Kill(); err != nil {
		return fmt.Errorf("kill %s member %s: %w", c.spec.Name, m.name, err)
	}
	<-m.done
	return nil
}

// Restart relaunches member 0 on its old directories and ports and returns
// the time from exec until its first successful linearizable read.
func (c *Cluster) Restart(ctx context.Context) (time.Duration, error) {
	m := c.members[0]
	if m.cmd != nil && !m.exited() {
		return 0, fmt.Errorf("restart %s member %s: still running", c.spec.Name, m.name)
	}
	start := time.Now()
	if err := c.launch(m); err != nil {
		return 0, err
	}
	rctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := c.waitMember(rctx, m); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// DataSize returns the size of every member's data (and log) directories:
// allocated is what the files occupy on disk (as du counts, so preallocated
// segments count in full), apparent is the sum of their lengths.
func (c *Cluster) DataSize() (allocated, apparent int64, err error) {
	for _, m := range c.members {
		for _, d := range []string{m.dataDir, m.logDir} {
			if d == "" {
				continue
			}
			al, ap, err := dirSize(d)
			if err != nil {
				return 0, 0, err
			}
			allocated += al
			apparent += ap
		}
	}
	return allocated, apparent, nil
}

// dirSize sums the allocated and apparent sizes of the regular files under
// dir; a missing dir counts as empty.
func dirSize(dir string) (allocated, apparent int64, err error) {
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while walking (a live server)
			}
			return err
		}
		apparent += info.Size()
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			allocated += st.Blocks * 512
		} else {
			allocated += info.Size()
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("size of %s: %w", dir, err)
	}
	return allocated, apparent, nil
}

// freePorts asks the kernel for n distinct free loopback ports. The listeners
// are closed before returning, so another process could take a port in
// between; on a benchmark machine that risk is accepted.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// scrapeCounters fetches url (a Prometheus text endpoint) and returns the sum
// of the samples of each named metric, and whether any was present.
func scrapeCounters(url string, names []string) (float64, bool, error) {
	text, err := scrapeText(url)
	if err != nil {
		return 0, false, err
	}
	sum, found := sumMetrics(text, names)
	return sum, found, nil
}

// scrapeText fetches url, a Prometheus text endpoint.
func scrapeText(url string) (string, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return "", fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("scrape %s: status %s", url, resp.Status)
	}
	var b strings.Builder
	if _, err := io.Copy(&b, io.LimitReader(resp.Body, 64<<20)); err != nil {
		return "", fmt.Errorf("read %s: %w", url, err)
	}
	return b.String(), nil
}

// sumMetrics sums, over the Prometheus text exposition text, every sample
// whose metric name is in names: a bare name matches whatever its labels, a
// name written with its labels (`x_bucket{le="0.128"}`) only those.
func sumMetrics(text string, names []string) (float64, bool) {
	want := make(map[string]bool, len(names))
	for _, n := range names {
		want[n] = true
	}
	var sum float64
	found := false
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		end := strings.IndexAny(line, "{ ")
		if end < 0 {
			continue
		}
		if !want[line[:end]] {
			// A name may carry its labels, as the exposition writes
			// them: one bucket of a histogram, say.
			closing := strings.IndexByte(line, '}')
			if line[end] != '{' || closing < 0 || !want[line[:closing+1]] {
				continue
			}
		}
		// The value follows the last label brace, separated by a space;
		// an optional timestamp may follow it.
		rest := line[end:]
		if i := strings.LastIndexByte(rest, '}'); i >= 0 {
			rest = rest[i+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		sum += v
		found = true
	}
	return sum, found
}
