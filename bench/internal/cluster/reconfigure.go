package cluster

import (
	"fmt"
	"path/filepath"
	"slices"
)

// Hooks for experiments that restart one cluster many times on prepared
// directories (the log compaction experiment, bench/logcompact.go): the
// ports and directories stay, the flags and the files change between
// launches.

// SetExtraArgs replaces the arguments appended after the generated flags at
// the next launch (Restart). A flag given twice takes its last value, so
// args may override a generated one (e.g. --log-level). Call it only while
// member 0 is stopped.
func (c *Cluster) SetExtraArgs(args []string) {
	c.spec.ExtraArgs = slices.Clone(args)
}

// MemberDir returns member 0's directory: its data directory, its raft log
// directory (strata) and its server log all live under it.
func (c *Cluster) MemberDir() string {
	return filepath.Join(c.dir, c.members[0].name)
}

// DataDir returns member 0's --data-dir.
func (c *Cluster) DataDir() string { return c.members[0].dataDir }

// LogDir returns member 0's --log-dir (strata; "" for etcd).
func (c *Cluster) LogDir() string { return c.members[0].logDir }

// ServerLogPath returns the file that receives member 0's stdout and
// stderr, across restarts (appended to).
func (c *Cluster) ServerLogPath() string { return c.members[0].logPath }

// Gauge returns the sum of the samples of the Prometheus metric name on
// member 0's /metrics, and whether it was present.
func (c *Cluster) Gauge(name string) (float64, bool, error) {
	m := c.members[0]
	if m.cmd == nil || m.exited() {
		return 0, false, fmt.Errorf("read %s of %s member %s: not running", name, c.spec.Name, m.name)
	}
	return scrapeCounters(m.clientURL+"/metrics", []string{name})
}
