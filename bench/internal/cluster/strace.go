package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Counting fsyncs with strace
//
// etcd exports its WAL fsyncs and backend commits as Prometheus counters;
// strata exports none yet. To count both the same way, a server can run
// under `strace -f --seccomp-bpf -e trace=<sync calls>`: the seccomp filter
// stops the server only on those calls (and on signals, which ptrace always
// sees), so each fsync pays one extra ptrace stop, tens of microseconds
// beside a sync that costs hundreds. strace writes one line per call to a
// trace file; syncCounter counts the lines that start a call.
//
// The cost is paid by both servers per sync, so a server that syncs more
// is slowed more: use strace runs for the counts and plain runs for timing.

// syncCalls are the system calls counted as fsyncs: the ones that make
// written data durable. sync_file_range (Pebble's background writeback)
// makes nothing durable and is not counted.
var syncCalls = []string{"fsync", "fdatasync", "syncfs", "msync"}

// straceArgs returns strace's arguments to run bin, tracing syncCalls into
// path; the server's own arguments follow.
func straceArgs(path, bin string) []string {
	return []string{"-f", "--seccomp-bpf", "-qq", "-e", "trace=" + strings.Join(syncCalls, ","),
		"-e", "signal=none", "-o", path, "--", bin}
}

// StraceUsable checks that strace at path can trace a child here (ptrace
// may be forbidden in containers).
func StraceUsable(ctx context.Context, path string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "-f", "--seccomp-bpf", "-qq", "-e", "trace=fsync", "-o", os.DevNull, "--", "true").CombinedOutput()
	if err != nil {
		return fmt.Errorf("strace %s cannot trace here: %w: %s", path, err, bytes.TrimSpace(out))
	}
	return nil
}

// tracedChildTimeout bounds the wait for strace to start the server.
const tracedChildTimeout = 10 * time.Second

// tracedChild returns the pid of the server strace (pid stracePID) started:
// the child, listed in /proc/PID/task/PID/children, whose executable is bin.
// Matching on the executable matters: strace first forks short-lived probes
// (to test seccomp support), and before exec the server's child still runs
// strace's image. done is closed if strace exits first.
func tracedChild(stracePID int, bin string, done <-chan struct{}) (int, error) {
	want, err := filepath.EvalSymlinks(bin)
	if err != nil {
		return 0, fmt.Errorf("resolve %s: %w", bin, err)
	}
	if want, err = filepath.Abs(want); err != nil {
		return 0, fmt.Errorf("resolve %s: %w", bin, err)
	}
	path := fmt.Sprintf("/proc/%d/task/%d/children", stracePID, stracePID)
	deadline := time.NewTimer(tracedChildTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		if b, err := os.ReadFile(path); err == nil {
			for _, f := range strings.Fields(string(b)) {
				pid, err := strconv.Atoi(f)
				if err != nil {
					return 0, fmt.Errorf("parse %s: %w", path, err)
				}
				if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && exe == want {
					return pid, nil
				}
			}
		}
		select {
		case <-done:
			return 0, errors.New("strace exited before starting the server")
		case <-deadline.C:
			return 0, fmt.Errorf("no child of strace (pid %d) running %s after %v", stracePID, want, tracedChildTimeout)
		case <-tick.C:
		}
	}
}

// syncCounter counts sync calls in a growing strace output file, reading
// only what was appended since the last count.
//
// Concurrency: used by the benchmark goroutine only.
type syncCounter struct {
	path    string
	offset  int64  // bytes consumed
	partial []byte // an unterminated last line, kept for the next read
	n       int64  // calls counted so far
}

// count returns the number of sync calls the trace holds so far.
func (s *syncCounter) count() (int64, error) {
	f, err := os.Open(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return s.n, nil
	}
	if err != nil {
		return 0, fmt.Errorf("open sync trace: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(s.offset, io.SeekStart); err != nil {
		return 0, fmt.Errorf("seek sync trace %s: %w", s.path, err)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return 0, fmt.Errorf("read sync trace %s: %w", s.path, err)
	}
	s.offset += int64(len(b))
	data := append(s.partial, b...)
	last := bytes.LastIndexByte(data, '\n')
	if last < 0 {
		s.partial = data
		return s.n, nil
	}
	s.n += countSyncLines(data[:last+1])
	s.partial = append([]byte(nil), data[last+1:]...)
	return s.n, nil
}

// countSyncLines counts the lines of strace -f output that start a sync
// call: "PID  fdatasync(9) = 0" or "PID  fsync(9 <unfinished ...>". Lines
// that resume a call ("PID  <... fsync resumed>") are not counted again.
func countSyncLines(b []byte) int64 {
	var n int64
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		rest := strings.TrimSpace(sc.Text())
		// Skip the pid column, present when strace follows threads (-f).
		if len(rest) > 0 && rest[0] >= '0' && rest[0] <= '9' {
			if _, after, ok := strings.Cut(rest, " "); ok {
				rest = strings.TrimSpace(after)
			}
		}
		name, _, ok := strings.Cut(rest, "(")
		if !ok {
			continue
		}
		for _, c := range syncCalls {
			if name == c {
				n++
				break
			}
		}
	}
	return n
}
