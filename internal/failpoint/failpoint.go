// Package failpoint kills the process at named points, so that tests can
// crash a real strata binary at instants that kill -9 from outside rarely
// hits: between a log write and its sync, between apply and flush, during a
// flush.
//
// Failpoints are armed only through the STRATA_FAILPOINTS environment
// variable, read once at start-up:
//
//	STRATA_FAILPOINTS="raftlog/before-sync=50,engine/before-flush=1"
//
// arms two points: the process sends itself SIGKILL the 50th time it passes
// raftlog/before-sync, or the first time it passes engine/before-flush.
// "name=p0.01" kills with probability 1% on each pass. With the variable
// unset, Hit costs one map lookup on an empty map.
//
// Concurrency: Hit is safe from any goroutine.
package failpoint

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// EnvVar is the environment variable that arms failpoints.
const EnvVar = "STRATA_FAILPOINTS"

type point struct {
	countdown   atomic.Int64 // kill when it reaches zero; unused if probability > 0
	probability float64
}

var (
	loadOnce sync.Once
	points   map[string]*point
)

func load() {
	points = map[string]*point{}
	spec := os.Getenv(EnvVar)
	if spec == "" {
		return
	}
	for _, item := range strings.Split(spec, ",") {
		name, arg, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			arg = "1"
		}
		p := &point{}
		if strings.HasPrefix(arg, "p") {
			prob, err := strconv.ParseFloat(arg[1:], 64)
			if err != nil {
				fmt.Fprintf(os.Stderr, "failpoint %q: bad probability %q\n", name, arg)
				continue
			}
			p.probability = prob
		} else {
			n, err := strconv.ParseInt(arg, 10, 64)
			if err != nil || n < 1 {
				fmt.Fprintf(os.Stderr, "failpoint %q: bad count %q\n", name, arg)
				continue
			}
			p.countdown.Store(n)
		}
		points[name] = p
	}
}

// Hit marks a pass through the named failpoint and kills the process if the
// point is armed and due.
func Hit(name string) {
	loadOnce.Do(load)
	if len(points) == 0 {
		return
	}
	p, ok := points[name]
	if !ok {
		return
	}
	due := false
	if p.probability > 0 {
		due = rand.Float64() < p.probability
	} else {
		due = p.countdown.Add(-1) == 0
	}
	if due {
		fmt.Fprintf(os.Stderr, "failpoint %s: killing process\n", name)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL is not deliverable late; never return
	}
}
