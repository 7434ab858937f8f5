package main

import (
	"errors"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// etcd's flags that strata accepts without acting on them, and those it
// accepts only at their defaults. docs/flags.md lists every etcd flag and
// what strata does with it; this file holds the ones strata does not
// implement, so that an etcd command line (kubeadm's, a systemd unit's, an
// operator's) starts strata unchanged, while a value that would mislead an
// operator about data safety or topology is refused, naming the flag.

// noEffect is an etcd flag strata accepts and ignores.
type noEffect struct {
	name string
	// def is etcd's default, in the flag's syntax; kind is its type:
	// "string", "bool", "duration", "int" or "uint".
	def, kind string
	// help is etcd's help; why says why it has no effect in strata.
	help, why string
	// aliases are etcd 3.6's --experimental-* names of the same flag.
	aliases []string
}

// Reasons shared by several flags.
const (
	whyBbolt   = "etcd's bbolt backend setting; strata commits one engine batch per applied run of raft entries, and its own bbolt engine (--engine bbolt) writes them to bbolt in its flushes"
	whyTracing = "strata exports no OpenTelemetry traces"
)

// etcdNoEffect are etcd 3.7's flags (and 3.6's --experimental-* names)
// that strata accepts without effect.
var etcdNoEffect = []noEffect{
	{name: "initial-election-tick-advance", def: "true", kind: "bool", help: "Whether to fast-forward initial election ticks on boot for faster election.",
		why: "a strata member waits one randomized election timeout before its first campaign"},
	{name: "max-snapshots", def: "5", kind: "uint", help: "Maximum number of snapshot files to retain (0 is unlimited).",
		why: "strata keeps no snapshot files: the engine holds the state, and raft snapshots are streamed from it"},
	{name: "max-wals", def: "5", kind: "uint", help: "Maximum number of wal files to retain (0 is unlimited).",
		why: "strata's raft log is truncated below the engine's durable index (--snapshot-count, --snapshot-catchup-entries), not by file count"},
	{name: "memory-mlock", def: "false", kind: "bool", help: "Enable to enforce etcd pages (in particular bbolt) to stay in RAM.",
		why: "etcd's bbolt pages; strata's engines keep their own memory", aliases: []string{"experimental-memory-mlock"}},
	{name: "backend-bbolt-freelist-type", def: "map", kind: "string", help: "BackendFreelistType specifies the type of freelist that boltdb backend uses(array and map are supported types).",
		why: whyBbolt, aliases: []string{"experimental-backend-bbolt-freelist-type"}},
	{name: "backend-batch-interval", def: "0s", kind: "duration", help: "BackendBatchInterval is the maximum time before commit the backend transaction.", why: whyBbolt},
	{name: "backend-batch-limit", def: "0", kind: "int", help: "BackendBatchLimit is the maximum operations before commit the backend transaction.", why: whyBbolt},
	{name: "raft-read-timeout", def: "5s", kind: "duration", help: "Read timeout set on each rafthttp connection",
		why: "strata's peers talk over gRPC streams with keepalives, not rafthttp connections"},
	{name: "raft-write-timeout", def: "5s", kind: "duration", help: "Write timeout set on each rafthttp connection",
		why: "strata's peers talk over gRPC streams with keepalives, not rafthttp connections"},
	{name: "compact-hash-check-time", def: "1m0s", kind: "duration", help: "Duration of time between leader checks followers compaction hashes.",
		why:     "the CompactHashCheck gate has no effect in strata (its hashes are checked with --corrupt-check-time); etcd's rule that it be positive still holds",
		aliases: []string{"experimental-compact-hash-check-time"}},
	{name: "downgrade-check-time", def: "5s", kind: "duration", help: "Duration of time between two downgrade status checks.",
		why: "strata has no cluster downgrade", aliases: []string{"experimental-downgrade-check-time"}},
	{name: "bootstrap-defrag-threshold-megabytes", def: "0", kind: "uint", help: "Enable the defrag during etcd server bootstrap on condition that it will free at least the provided threshold of disk space.",
		why: "an LSM engine needs no defragmentation", aliases: []string{"experimental-bootstrap-defrag-threshold-megabytes"}},
	{name: "enable-distributed-tracing", def: "false", kind: "bool", help: "Enable distributed tracing.", why: whyTracing, aliases: []string{"experimental-enable-distributed-tracing"}},
	{name: "distributed-tracing-address", def: "localhost:4317", kind: "string", help: "Distributed tracing collector address.", why: whyTracing, aliases: []string{"experimental-distributed-tracing-address"}},
	{name: "distributed-tracing-service-name", def: "etcd", kind: "string", help: "Distributed tracing service name, must be same across all etcd instances.", why: whyTracing, aliases: []string{"experimental-distributed-tracing-service-name"}},
	{name: "distributed-tracing-instance-id", def: "", kind: "string", help: "Distributed tracing instance ID, must be unique per each etcd instance.", why: whyTracing, aliases: []string{"experimental-distributed-tracing-instance-id"}},
	{name: "distributed-tracing-sampling-rate", def: "0", kind: "int", help: "Number of samples to collect per million spans for distributed tracing.", why: whyTracing, aliases: []string{"experimental-distributed-tracing-sampling-rate"}},
	// etcd 3.6's flags for its feature gates (etcd 3.7 has only the gates).
	{name: "experimental-compact-hash-check-enabled", def: "false", kind: "bool", help: "Enable leader to periodically check followers compaction hashes (3.6's --feature-gates=CompactHashCheck=true).",
		why: "as the CompactHashCheck gate"},
	{name: "experimental-enable-lease-checkpoint", def: "false", kind: "bool", help: "Enable leader to send regular checkpoints to other members to prevent reset of remaining TTL on leader change (3.6's --feature-gates=LeaseCheckpoint=true).",
		why: "strata always checkpoints leases' remaining TTLs through raft"},
	{name: "experimental-enable-lease-checkpoint-persist", def: "false", kind: "bool", help: "Enable persisting remainingTTL to prevent indefinite auto-renewal of long lived leases (3.6's --feature-gates=LeaseCheckpointPersist=true).",
		why: "strata always persists checkpointed TTLs"},
	{name: "experimental-txn-mode-write-with-shared-buffer", def: "true", kind: "bool", help: "Enable the write transaction to use a shared buffer in its readonly check operations (3.6's --feature-gates=TxnModeWriteWithSharedBuffer).",
		why: "an etcd bbolt buffer setting, not strata's"},
	{name: "experimental-stop-grpc-service-on-defrag", def: "false", kind: "bool", help: "Enable etcd gRPC service to stop serving client requests on defragmentation (3.6's --feature-gates=StopGRPCServiceOnDefrag=true).",
		why: "Defragment in strata (an LSM engine) does not stop serving"},
}

// registerNoEffect registers every flag of etcdNoEffect under its names;
// the values are kept only to be validated.
func registerNoEffect(fs *flag.FlagSet) *noEffectValues {
	v := &noEffectValues{values: map[string]flag.Value{}}
	for _, ne := range etcdNoEffect {
		usage := ne.help + " strata: no effect: " + ne.why + "."
		var val flag.Value
		switch ne.kind {
		case "string":
			val = new(stringValue)
		case "bool":
			val = new(boolValue)
		case "duration":
			val = new(durationValue)
		case "int":
			val = &numValue{signed: true}
		case "uint":
			val = &numValue{}
		default:
			panic("etcdNoEffect: unknown kind " + ne.kind)
		}
		if err := val.Set(ne.def); err != nil {
			panic(fmt.Sprintf("etcdNoEffect: default of --%s: %v", ne.name, err))
		}
		fs.Var(val, ne.name, usage)
		for _, a := range ne.aliases {
			fs.Var(val, a, "etcd 3.6's name of --"+ne.name+". strata: no effect: "+ne.why+".")
		}
		v.values[ne.name] = val
	}
	return v
}

// noEffectValues are the values given to etcdNoEffect's flags.
type noEffectValues struct {
	values map[string]flag.Value
}

// check applies the rules etcd applies to these flags' values.
func (v *noEffectValues) check() error {
	if d := time.Duration(*v.values["compact-hash-check-time"].(*durationValue)); d <= 0 {
		return fmt.Errorf("--compact-hash-check-time must be >0 (set to %v)", d)
	}
	return nil
}

type stringValue string

func (s *stringValue) String() string     { return string(*s) }
func (s *stringValue) Set(v string) error { *s = stringValue(v); return nil }

type boolValue bool

func (b *boolValue) String() string { return strconv.FormatBool(bool(*b)) }
func (b *boolValue) Set(v string) error {
	x, err := strconv.ParseBool(v)
	if err != nil {
		return errors.New("parse error")
	}
	*b = boolValue(x)
	return nil
}

// IsBoolFlag lets the flag be given without a value, as etcd's bools are.
func (b *boolValue) IsBoolFlag() bool { return true }

type durationValue time.Duration

func (d *durationValue) String() string { return time.Duration(*d).String() }
func (d *durationValue) Set(v string) error {
	x, err := time.ParseDuration(v)
	if err != nil {
		return errors.New("parse error")
	}
	*d = durationValue(x)
	return nil
}

type numValue struct {
	signed bool
	s      string
}

func (n *numValue) String() string { return n.s }
func (n *numValue) Set(v string) error {
	var err error
	if n.signed {
		_, err = strconv.ParseInt(v, 0, 64)
	} else {
		_, err = strconv.ParseUint(v, 0, 64)
	}
	if err != nil {
		return errors.New("parse error")
	}
	n.s = v
	return nil
}

// refusedFlags are etcd flags strata accepts only at their defaults: a
// value that turns them on would mislead about the cluster's topology or
// its data's safety, so strata refuses it and says why.
//
// v3 discovery (--discovery-token, --discovery-endpoints) is implemented
// (discoveryFlags); v2 discovery, its proxy and DNS discovery are not.
type refusedFlags struct {
	discovery, discoverySRV, discoverySRVName string
	discoveryProxy, discoveryFallback         string
	unsafeNoFsync                             bool
	v2Deprecation                             string
}

func (r *refusedFlags) register(fs *flag.FlagSet) {
	const refused = " strata: refused unless empty: "
	const noDiscovery = "strata implements only v3 discovery (--discovery-token, --discovery-endpoints); otherwise bootstrap with --initial-cluster."
	fs.StringVar(&r.discovery, "discovery", "", "Discovery URL used to bootstrap the cluster for v2 discovery (etcd 3.7 no longer accepts it)."+refused+noDiscovery)
	fs.StringVar(&r.discoverySRV, "discovery-srv", "", "DNS srv domain used to bootstrap the cluster."+refused+noDiscovery)
	fs.StringVar(&r.discoverySRVName, "discovery-srv-name", "", "Suffix to the dns srv name queried when bootstrapping."+refused+noDiscovery)
	fs.StringVar(&r.discoveryProxy, "discovery-proxy", "", "HTTP proxy to use for traffic to discovery service (etcd 3.7 no longer accepts it)."+refused+noDiscovery)
	fs.StringVar(&r.discoveryFallback, "discovery-fallback", "exit", "Expected behavior ('exit') when discovery services fails. Note that v2 proxy is removed. strata: implemented: a member whose v3 discovery fails exits, as etcd's does; 'proxy' is refused with etcd's error.")
	fs.BoolVar(&r.unsafeNoFsync, "unsafe-no-fsync", false, "Disables fsync, unsafe, will cause data loss. strata: refused if true: the raft log is strata's only write-ahead log, and strata always syncs it.")
	fs.StringVar(&r.v2Deprecation, "v2-deprecation", "write-only", "Phase of v2store deprecation: not-yet, write-only, write-only-skip-check, write-only-drop-data or gone. strata: no effect: strata has no v2 store (etcd too enforces its default, ignoring the value).")
}

// check refuses the values strata does not implement, naming the flag.
func (r *refusedFlags) check() error {
	for _, f := range []struct{ name, value string }{
		{"discovery", r.discovery}, {"discovery-srv", r.discoverySRV}, {"discovery-srv-name", r.discoverySRVName},
		{"discovery-proxy", r.discoveryProxy},
	} {
		if f.value != "" {
			return fmt.Errorf("--%s=%s: strata does not implement v2 or DNS discovery; use v3 discovery (--discovery-token, --discovery-endpoints) or bootstrap with --initial-cluster", f.name, f.value)
		}
	}
	switch r.discoveryFallback {
	case "exit":
	case "proxy":
		return errors.New(`v2 proxy is deprecated, and --discovery-fallback can't be configured as "proxy"`)
	default:
		return fmt.Errorf("invalid value %q for flag -discovery-fallback: invalid value", r.discoveryFallback)
	}
	for _, v := range strings.Split(r.v2Deprecation, ",") {
		switch v {
		case "not-yet", "write-only", "write-only-skip-check", "write-only-drop-data", "gone":
		default:
			return fmt.Errorf("invalid value %q for flag -v2-deprecation: invalid value %q", r.v2Deprecation, v)
		}
	}
	if r.unsafeNoFsync {
		return errors.New("--unsafe-no-fsync: strata refuses to run without syncing its raft log, its only write-ahead log")
	}
	return nil
}

// etcdFlagNames are the names etcd 3.7's `etcd --help` lists, for tests and
// docs/flags.md.
func etcdFlagNames() []string {
	names := []string{
		"name", "data-dir", "wal-dir", "snapshot-count", "heartbeat-interval", "election-timeout",
		"initial-election-tick-advance", "listen-peer-urls", "listen-client-urls", "listen-client-http-urls",
		"max-snapshots", "max-wals", "memory-mlock", "quota-backend-bytes", "backend-bbolt-freelist-type",
		"backend-batch-interval", "backend-batch-limit", "max-txn-ops", "max-request-bytes", "max-concurrent-streams",
		"grpc-keepalive-min-time", "grpc-keepalive-interval", "grpc-keepalive-timeout", "socket-reuse-port",
		"socket-reuse-address", "enable-grpc-gateway", "raft-read-timeout", "raft-write-timeout", "feature-gates",
		"initial-advertise-peer-urls", "initial-cluster", "initial-cluster-state", "initial-cluster-token",
		"advertise-client-urls", "discovery", "discovery-token", "discovery-endpoints", "discovery-dial-timeout",
		"discovery-request-timeout", "discovery-keepalive-time", "discovery-keepalive-timeout",
		"discovery-insecure-transport", "discovery-insecure-skip-tls-verify", "discovery-cert", "discovery-key",
		"discovery-cacert", "discovery-user", "discovery-password", "discovery-fallback", "discovery-proxy",
		"discovery-srv", "discovery-srv-name", "strict-reconfig-check", "pre-vote", "auto-compaction-retention",
		"auto-compaction-mode", "v2-deprecation", "cert-file", "key-file", "client-cert-auth", "client-cert-file",
		"client-key-file", "client-crl-file", "client-cert-allowed-hostname", "trusted-ca-file", "auto-tls",
		"peer-cert-file", "peer-key-file", "peer-client-cert-auth", "peer-client-cert-file", "peer-client-key-file",
		"peer-trusted-ca-file", "peer-cert-allowed-cn", "peer-cert-allowed-hostname", "peer-auto-tls",
		"self-signed-cert-validity", "peer-crl-file", "cipher-suites", "cors", "host-whitelist", "tls-min-version",
		"tls-max-version", "auth-token", "bcrypt-cost", "auth-token-ttl", "enable-pprof", "metrics",
		"listen-metrics-urls", "logger", "log-outputs", "log-level", "log-format", "enable-log-rotation",
		"log-rotation-config-json", "warning-unary-request-duration", "enable-distributed-tracing",
		"distributed-tracing-address", "distributed-tracing-service-name", "distributed-tracing-instance-id",
		"distributed-tracing-sampling-rate", "corrupt-check-time", "compact-hash-check-time", "compaction-batch-limit",
		"peer-skip-client-san-verification", "watch-progress-notify-interval", "warning-apply-duration",
		"bootstrap-defrag-threshold-megabytes", "max-learners", "compaction-sleep-interval", "downgrade-check-time",
		"snapshot-catchup-entries", "force-new-cluster", "unsafe-no-fsync",
	}
	sort.Strings(names)
	return names
}
