package main

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// etcd's --feature-gates: key=value pairs that turn etcd 3.7's alpha and
// beta features on or off. strata accepts every gate etcd knows, with
// etcd's defaults, so that an etcd command line starts strata unchanged;
// each gate either drives the same behaviour in strata or, where strata
// has no such switch, is accepted and says in --help why it has no effect.
// A gate etcd does not know is refused with etcd's message.

// featureGate is one of etcd 3.7's gates.
type featureGate struct {
	name  string
	stage string // "ALPHA" or "BETA"
	on    bool   // etcd's default
	// inStrata says what the gate does in strata.
	inStrata string
}

// etcdFeatureGates are etcd 3.7.3's gates (server/features), with what
// each means for strata.
var etcdFeatureGates = []featureGate{
	{"CompactHashCheck", "ALPHA", false, "no effect: strata checks hashes with --corrupt-check-time, not at compaction"},
	{"FastLeaseKeepAlive", "BETA", true, "no effect: strata has one keep-alive path, which this gate does not switch"},
	{"InitialCorruptCheck", "ALPHA", false, "as --initial-corrupt-check"},
	{"LeaseCheckpoint", "ALPHA", false, "no effect: strata always checkpoints leases' remaining TTLs through raft"},
	{"LeaseCheckpointPersist", "ALPHA", false, "no effect: strata always persists checkpointed TTLs"},
	{"PriorityRequest", "ALPHA", false, "no effect: strata does not prioritise requests"},
	{"SetMemberLocalAddr", "ALPHA", false, "no effect: strata dials peers from any local address"},
	{"StopGRPCServiceOnDefrag", "ALPHA", false, "no effect: Defragment in strata (an LSM engine) does not stop serving"},
	{"TxnModeWriteWithSharedBuffer", "BETA", true, "no effect: an etcd bbolt buffer setting, not strata's"},
}

// featureGates is the --feature-gates flag's value: etcd's defaults, then
// every key=value given, later ones winning, as etcd merges them.
type featureGates struct {
	set map[string]bool
}

func (g *featureGates) String() string {
	if g == nil || len(g.set) == 0 {
		return ""
	}
	var parts []string
	for k, v := range g.set {
		parts = append(parts, k+"="+strconv.FormatBool(v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// Set parses key=value pairs separated by commas; the errors are etcd's.
func (g *featureGates) Set(value string) error {
	if g.set == nil {
		g.set = map[string]bool{}
	}
	for _, pair := range strings.Split(value, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok {
			return fmt.Errorf("missing bool value for %s", k)
		}
		on, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("invalid value of %s=%s, err: %w", k, v, err)
		}
		k = strings.TrimSpace(k)
		if k != "AllAlpha" && k != "AllBeta" && gateByName(k) == nil {
			return fmt.Errorf("unrecognized feature gate: %s", k)
		}
		g.set[k] = on
	}
	return nil
}

func gateByName(name string) *featureGate {
	for i := range etcdFeatureGates {
		if etcdFeatureGates[i].name == name {
			return &etcdFeatureGates[i]
		}
	}
	return nil
}

// Enabled is whether gate name is on: set explicitly, else by AllAlpha or
// AllBeta for its stage, else etcd's default.
func (g *featureGates) Enabled(name string) bool {
	if v, ok := g.set[name]; ok {
		return v
	}
	gate := gateByName(name)
	if gate == nil {
		return false
	}
	if v, ok := g.set["All"+strings.ToUpper(gate.stage[:1])+strings.ToLower(gate.stage[1:])]; ok {
		return v
	}
	return gate.on
}

// featureGatesUsage is --feature-gates' help: etcd's list of gates, each
// with what it does in strata.
func featureGatesUsage() string {
	var b strings.Builder
	b.WriteString("A set of key=value pairs that describe server level feature gates for alpha/experimental features (etcd's). Options are:")
	b.WriteString("\nAllAlpha=true|false (ALPHA - default=false)\nAllBeta=true|false (BETA - default=false)")
	for _, g := range etcdFeatureGates {
		fmt.Fprintf(&b, "\n%s=true|false (%s - default=%v): %s", g.name, g.stage, g.on, g.inStrata)
	}
	return b.String()
}

// check applies etcd's rule between gates: LeaseCheckpointPersist needs
// LeaseCheckpoint. The error is etcd's.
func (g *featureGates) check() error {
	if g.Enabled("LeaseCheckpointPersist") && !g.Enabled("LeaseCheckpoint") {
		return errors.New("enabling feature gate LeaseCheckpointPersist requires enabling feature gate LeaseCheckpoint")
	}
	return nil
}
