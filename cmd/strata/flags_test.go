package main

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/strata-kv/strata/member"
)

// parse runs the command line (and the environment) through loadFlags and
// config, as runMember does before starting the member.
func parse(t *testing.T, args ...string) (member.Config, error) {
	t.Helper()
	f, err := loadFlags(args)
	if err != nil {
		return member.Config{}, err
	}
	return f.config(zap.NewNop())
}

// TestEtcdFlagsAccepted: every flag of etcd 3.7's `etcd --help` and etcd
// 3.6's --experimental-* names is registered, and a command line giving
// each its default starts (is accepted).
func TestEtcdFlagsAccepted(t *testing.T) {
	var f flags
	fs := newFlagSet(&f)
	names := etcdFlagNames()
	if len(names) != 113 {
		t.Errorf("etcdFlagNames lists %d flags, etcd 3.7.3's --help 113", len(names))
	}
	experimental := []string{
		"experimental-initial-corrupt-check", "experimental-corrupt-check-time", "experimental-watch-progress-notify-interval",
		"experimental-compact-hash-check-enabled", "experimental-compact-hash-check-time", "experimental-enable-lease-checkpoint",
		"experimental-enable-lease-checkpoint-persist", "experimental-compaction-batch-limit", "experimental-compaction-sleep-interval",
		"experimental-downgrade-check-time", "experimental-warning-apply-duration", "experimental-warning-unary-request-duration",
		"experimental-memory-mlock", "experimental-txn-mode-write-with-shared-buffer", "experimental-stop-grpc-service-on-defrag",
		"experimental-bootstrap-defrag-threshold-megabytes", "experimental-max-learners", "experimental-snapshot-catchup-entries",
		"experimental-peer-skip-client-san-verification", "experimental-enable-distributed-tracing",
		"experimental-distributed-tracing-address", "experimental-distributed-tracing-service-name",
		"experimental-distributed-tracing-instance-id", "experimental-distributed-tracing-sampling-rate",
		"experimental-backend-bbolt-freelist-type",
	}
	var args []string
	for _, n := range append(append(names, experimental...), "config-file") {
		fl := fs.Lookup(n)
		if fl == nil {
			t.Errorf("--%s is not accepted", n)
			continue
		}
		if n != "config-file" {
			args = append(args, "--"+n+"="+fl.DefValue)
		}
	}
	args = append(args, "--data-dir="+t.TempDir())
	if _, err := parse(t, args...); err != nil {
		t.Fatalf("every flag at its default: %v", err)
	}
	// A flag accepted without effect says so in --help, under each of
	// its names; a refused one says what it refuses.
	for _, ne := range etcdNoEffect {
		for _, n := range append([]string{ne.name}, ne.aliases...) {
			if fl := fs.Lookup(n); fl == nil || !strings.Contains(fl.Usage, "strata: no effect: ") {
				t.Errorf("--%s: help does not say it has no effect", n)
			}
		}
	}
	for _, n := range []string{"discovery", "discovery-srv", "discovery-srv-name", "discovery-proxy", "unsafe-no-fsync"} {
		if fl := fs.Lookup(n); fl == nil || !strings.Contains(fl.Usage, "strata: refused") {
			t.Errorf("--%s: help does not say what strata refuses", n)
		}
	}
}

// TestFlagRefusals: values strata refuses, with etcd's words where etcd
// has them; nothing is written for a refused command line.
func TestFlagRefusals(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "TLS 1.1", args: []string{"--tls-min-version=TLS1.1"}, wantErr: `unexpected TLS version "TLS1.1" (must be one of: TLS1.2, TLS1.3)`},
		{name: "unknown engine", args: []string{"--engine=rocks"}, wantErr: `--engine: unknown engine "rocks"`},
		{name: "bad max version", args: []string{"--tls-max-version=TLS1.0"}, wantErr: `unexpected TLS version "TLS1.0" (must be one of: TLS1.2, TLS1.3)`},
		{name: "min above max", args: []string{"--tls-min-version=TLS1.3", "--tls-max-version=TLS1.2"}, wantErr: "min version (TLS1.3) is greater than max version (TLS1.2)"},
		{name: "unknown cipher suite", args: []string{"--cipher-suites=FOO"}, wantErr: `unexpected TLS cipher suite "FOO"`},
		{name: "suites with TLS 1.3 only", args: []string{"--tls-min-version=TLS1.3", "--cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"}, wantErr: "cipher suites cannot be configured when only TLS1.3 is enabled"},
		{name: "v2 discovery", args: []string{"--discovery=https://discovery.etcd.io/x"}, wantErr: "--discovery=https://discovery.etcd.io/x: strata does not implement v2 or DNS discovery"},
		{name: "DNS discovery", args: []string{"--discovery-srv=example.com"}, wantErr: "--discovery-srv=example.com: strata does not implement v2 or DNS discovery"},
		{name: "v3 discovery beside initial cluster", args: []string{"--discovery-endpoints=http://d:2379", "--discovery-token=t", "--initial-cluster=m1=http://a:2380"},
			wantErr: `multiple discovery or bootstrap flags are set. Choose one of "initial-cluster", "discovery-endpoints" or "discovery-srv"`},
		{name: "v3 discovery token alone", args: []string{"--discovery-token=t"}, wantErr: "both --discovery-token and --discovery-endpoints must be set"},
		{name: "v3 discovery endpoints alone", args: []string{"--discovery-endpoints=http://d:2379"}, wantErr: "both --discovery-token and --discovery-endpoints must be set"},
		{name: "v3 discovery empty endpoint", args: []string{"--discovery-endpoints=http://d:2379,", "--discovery-token=t"}, wantErr: "--discovery-endpoints must not contain empty endpoints"},
		{name: "accepted: v3 discovery", args: []string{"--discovery-endpoints=http://d:2379", "--discovery-token=t"}},
		{name: "discovery fallback proxy", args: []string{"--discovery-fallback=proxy"}, wantErr: `v2 proxy is deprecated, and --discovery-fallback can't be configured as "proxy"`},
		{name: "no fsync", args: []string{"--unsafe-no-fsync=true"}, wantErr: "--unsafe-no-fsync: strata refuses"},
		{name: "v2 deprecation value", args: []string{"--v2-deprecation=soon"}, wantErr: `invalid value "soon"`},
		{name: "compact hash check time 0", args: []string{"--compact-hash-check-time=0"}, wantErr: "--compact-hash-check-time must be >0 (set to 0s)"},
		{name: "wal dir and log dir", args: []string{"--wal-dir=/a", "--log-dir=/b"}, wantErr: "--wal-dir /a and --log-dir [/b] both name the raft log's directory"},
		{name: "max learners 0", args: []string{"--max-learners=0"}, wantErr: "--max-learners=0: strata needs at least 1"},
		{name: "allowed CN and hostname", args: []string{"--peer-cert-allowed-cn=a", "--peer-cert-allowed-hostname=b"}, wantErr: "mutually exclusive"},
		{name: "http URLs of another scheme", args: []string{"--listen-client-http-urls=https://127.0.0.1:2381"}, wantErr: "both must be http or both https"},
		{name: "CORS origin without scheme", args: []string{"--cors=foo"}, wantErr: `invalid value "foo" for flag -cors: URL scheme must be http, https, unix, or unixs: foo`},
		{name: "CORS origin without port", args: []string{"--cors=http://ui.example"}, wantErr: `URL address does not have the form "host:port": http://ui.example`},
		{name: "accepted: CORS origins", args: []string{"--cors=http://ui.example:80,*", "--host-whitelist=etcd.example,localhost"}},
		{name: "listen without advertise", args: []string{"--listen-client-urls=http://127.0.0.1:2479"}, wantErr: "--advertise-client-urls is required when --listen-client-urls is set explicitly"},
		{name: "heartbeat 0", args: []string{"--heartbeat-interval=0"}, wantErr: "--heartbeat-interval must be >0 (set to 0ms)"},
		{name: "election below 5 heartbeats", args: []string{"--heartbeat-interval=100", "--election-timeout=400"}, wantErr: "--election-timeout[400ms] should be at least as 5 times as --heartbeat-interval[100ms]"},
		{name: "election too long", args: []string{"--election-timeout=60000"}, wantErr: "--election-timeout[60000ms] is too long, and should be set less than 50000ms"},
		{name: "auto-compaction mode", args: []string{"--auto-compaction-mode=hourly"}, wantErr: `unknown auto-compaction-mode "hourly"`},
		{name: "cluster state", args: []string{"--initial-cluster-state=old"}, wantErr: `invalid value "old" for flag -initial-cluster-state: invalid value`},
		{name: "lease checkpoint persist alone", args: []string{"--feature-gates=LeaseCheckpointPersist=true"}, wantErr: "enabling feature gate LeaseCheckpointPersist requires enabling feature gate LeaseCheckpoint"},
		{name: "accepted: lease checkpoint gates together", args: []string{"--feature-gates=LeaseCheckpoint=true,LeaseCheckpointPersist=true"}},
		{name: "not a flag", args: []string{"serve"}, wantErr: `"serve" is not a valid flag`},
		{name: "accepted: v2 deprecation gone", args: []string{"--v2-deprecation=gone"}},
		{name: "accepted: discovery flags at defaults", args: []string{"--discovery=", "--discovery-fallback=exit", "--discovery-insecure-transport=true"}},
		{name: "accepted: wal dir equal to log dir", args: []string{"--wal-dir=/a", "--log-dir=/a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			_, err := parse(t, append([]string{"--data-dir=" + dir}, tc.args...)...)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
			if _, statErr := os.Stat(dir); tc.wantErr != "" && statErr == nil {
				t.Errorf("a refused command line wrote %s", dir)
			}
		})
	}
}

// TestFlagsReachConfig: the flags strata implements reach the member's
// configuration (and from there the component that owns each).
func TestFlagsReachConfig(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		check func(t *testing.T, cfg member.Config)
	}{
		{name: "etcd's defaults", check: func(t *testing.T, c member.Config) {
			if c.DisablePreVote || c.NoStrictReconfig || c.Client.NoGateway || c.MaxLearners != 1 || c.Client.Limits.MaxConcurrentStreams != 1<<32-1 ||
				c.Client.Limits.KeepAliveMinTime != 5*time.Second || c.Client.Limits.KeepAliveInterval != 2*time.Hour || c.Client.Limits.KeepAliveTimeout != 20*time.Second {
				t.Errorf("defaults differ from etcd's: %+v", c)
			}
			if c.TLS.Client.MinVersion != tls.VersionTLS12 || c.TLS.Peer.MaxVersion != 0 {
				t.Errorf("TLS versions %x-%x, want TLS 1.2 to Go's choice", c.TLS.Client.MinVersion, c.TLS.Peer.MaxVersion)
			}
		}},
		{name: "wal dir", args: []string{"--wal-dir=/wal"}, check: func(t *testing.T, c member.Config) {
			if len(c.LogDirs) != 1 || c.LogDirs[0] != "/wal" {
				t.Errorf("LogDirs %v, want [/wal]", c.LogDirs)
			}
		}},
		{name: "raft and membership", args: []string{"--pre-vote=false", "--strict-reconfig-check=false", "--experimental-max-learners=3"}, check: func(t *testing.T, c member.Config) {
			if !c.DisablePreVote || !c.NoStrictReconfig || c.MaxLearners != 3 {
				t.Errorf("pre-vote off %v, strict off %v, max learners %d", c.DisablePreVote, c.NoStrictReconfig, c.MaxLearners)
			}
		}},
		{name: "gRPC", args: []string{"--max-concurrent-streams=10", "--grpc-keepalive-min-time=1s", "--grpc-keepalive-interval=0", "--enable-grpc-gateway=false"}, check: func(t *testing.T, c member.Config) {
			if c.Client.Limits.MaxConcurrentStreams != 10 || c.Client.Limits.KeepAliveMinTime != time.Second || c.Client.Limits.KeepAliveInterval != 0 || !c.Client.NoGateway {
				t.Errorf("gRPC settings %d %v %v %v", c.Client.Limits.MaxConcurrentStreams, c.Client.Limits.KeepAliveMinTime, c.Client.Limits.KeepAliveInterval, c.Client.NoGateway)
			}
		}},
		{name: "slow request warning", args: []string{"--experimental-warning-unary-request-duration=1s"}, check: func(t *testing.T, c member.Config) {
			if c.Client.WarnUnaryDuration != time.Second || c.WarningApplyDuration != 100*time.Millisecond {
				t.Errorf("WarningUnaryRequestDuration %v, WarningApplyDuration %v", c.Client.WarnUnaryDuration, c.WarningApplyDuration)
			}
		}},
		{name: "socket options", args: []string{"--socket-reuse-port", "--socket-reuse-address=true"}, check: func(t *testing.T, c member.Config) {
			if !c.Sockets.ReusePort || !c.Sockets.ReuseAddress {
				t.Errorf("Sockets %+v", c.Sockets)
			}
		}},
		{name: "CORS and host whitelist", args: []string{"--cors=http://ui.example:80", "--host-whitelist=etcd.example,localhost"}, check: func(t *testing.T, c member.Config) {
			if strings.Join(c.Client.Access.CORS, ",") != "http://ui.example:80" || strings.Join(c.Client.Access.HostWhitelist, ",") != "etcd.example,localhost" {
				t.Errorf("CORS %v, host whitelist %v", c.Client.Access.CORS, c.Client.Access.HostWhitelist)
			}
		}},
		{name: "HTTP URLs", args: []string{"--listen-client-http-urls=http://127.0.0.1:2381,http://127.0.0.1:2382"}, check: func(t *testing.T, c member.Config) {
			if len(c.Client.ListenHTTPURLs) != 2 {
				t.Errorf("ListenClientHTTPURLs %v", c.Client.ListenHTTPURLs)
			}
		}},
		{name: "TLS", args: []string{"--tls-min-version=TLS1.2", "--tls-max-version=TLS1.3", "--cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
			"--client-cert-file=/c.pem", "--client-key-file=/c-key.pem", "--peer-client-cert-file=/p.pem", "--peer-client-key-file=/p-key.pem",
			"--peer-cert-allowed-cn=m1,m2", "--client-cert-allowed-hostname=client.example.com", "--experimental-peer-skip-client-san-verification"}, check: func(t *testing.T, c member.Config) {
			cl, pe := c.TLS.Client, c.TLS.Peer
			if cl.MaxVersion != tls.VersionTLS13 || len(pe.CipherSuites) != 2 || len(cl.CipherSuites) != 2 {
				t.Errorf("versions or suites not on both sides: %+v %+v", cl, pe)
			}
			if cl.ClientCertFile != "/c.pem" || cl.ClientKeyFile != "/c-key.pem" || pe.ClientCertFile != "/p.pem" || pe.ClientKeyFile != "/p-key.pem" {
				t.Errorf("client certificates: %+v %+v", cl, pe)
			}
			if !pe.SkipClientSANVerify {
				t.Error("--peer-skip-client-san-verification not passed")
			}
			if strings.Join(pe.AllowedCNs, ",") != "m1,m2" || strings.Join(cl.AllowedHostnames, ",") != "client.example.com" {
				t.Errorf("allowed: %v %v", pe.AllowedCNs, cl.AllowedHostnames)
			}
		}},
		{name: "auto TLS", args: []string{"--auto-tls", "--peer-auto-tls", "--self-signed-cert-validity=2",
			"--listen-client-urls=https://127.0.0.1:2379", "--advertise-client-urls=https://127.0.0.1:2379",
			"--listen-peer-urls=https://127.0.0.1:2380", "--initial-advertise-peer-urls=https://127.0.0.1:2380"}, check: func(t *testing.T, c member.Config) {
			for side, info := range map[string]struct{ cert, key string }{"client": {c.TLS.Client.CertFile, c.TLS.Client.KeyFile}, "peer": {c.TLS.Peer.CertFile, c.TLS.Peer.KeyFile}} {
				if want := filepath.Join(c.DataDir, "fixtures", side, "cert.pem"); info.cert != want {
					t.Errorf("%s certificate %s, want %s", side, info.cert, want)
				}
				if _, err := tls.LoadX509KeyPair(info.cert, info.key); err != nil {
					t.Errorf("%s pair: %v", side, err)
				}
			}
			if !c.TLS.Client.SelfSigned || !c.TLS.Peer.SelfSigned {
				t.Error("auto TLS not marked self-signed")
			}
		}},
		{name: "auto TLS with certificates given", args: []string{"--auto-tls", "--cert-file=/s.pem", "--key-file=/s-key.pem"}, check: func(t *testing.T, c member.Config) {
			if c.TLS.Client.CertFile != "/s.pem" || c.TLS.Client.SelfSigned {
				t.Errorf("given certificate not used: %+v", c.TLS.Client)
			}
		}},
		{name: "truncation in bytes", args: []string{"--snapshot-bytes=1048576", "--snapshot-catchup-bytes=2097152"}, check: func(t *testing.T, c member.Config) {
			if c.SnapshotBytes != 1<<20 || c.CatchUpBytes != 2<<20 {
				t.Errorf("snapshot bytes %d, catch-up bytes %d", c.SnapshotBytes, c.CatchUpBytes)
			}
		}},
		{name: "3.6 names", args: []string{"--experimental-snapshot-catchup-entries=7", "--experimental-initial-corrupt-check=true", "--experimental-compact-hash-check-enabled"}, check: func(t *testing.T, c member.Config) {
			if c.CatchUpEntries != 7 || !c.InitialCorruptCheck {
				t.Errorf("catch-up %d, initial check %v", c.CatchUpEntries, c.InitialCorruptCheck)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parse(t, append([]string{"--data-dir=" + t.TempDir()}, tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, cfg)
		})
	}
}

// TestEnv: ETCD_* variables set the flags not given, with etcd's rules: a
// variable beside its flag is refused, an empty one ignored, ETCD_VERSION
// is no flag's, and the others are reported.
func TestEnv(t *testing.T) {
	t.Setenv("ETCD_MAX_LEARNERS", "4")
	t.Setenv("ETCD_PRE_VOTE", "false")
	t.Setenv("ETCD_WAL_DIR", "/from-env")
	t.Setenv("ETCD_QUOTA_BACKEND_BYTES", "") // empty: ignored
	t.Setenv("ETCD_VERSION", "3.7.3")        // not --version
	t.Setenv("ETCD_NO_SUCH_FLAG", "1")
	f, err := loadFlags([]string{"--data-dir=" + t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	// etcd reports an empty variable as unrecognized too: it reads none.
	if f.version || strings.Join(f.unrecognizedEnv, ",") != "ETCD_QUOTA_BACKEND_BYTES=,ETCD_NO_SUCH_FLAG=1" &&
		strings.Join(f.unrecognizedEnv, ",") != "ETCD_NO_SUCH_FLAG=1,ETCD_QUOTA_BACKEND_BYTES=" {
		t.Errorf("version %v, unrecognized %v; want false, [ETCD_QUOTA_BACKEND_BYTES= ETCD_NO_SUCH_FLAG=1]", f.version, f.unrecognizedEnv)
	}
	cfg, err := f.config(zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxLearners != 4 || !cfg.DisablePreVote || cfg.LogDirs[0] != "/from-env" {
		t.Errorf("max learners %d, pre-vote off %v, log dirs %v", cfg.MaxLearners, cfg.DisablePreVote, cfg.LogDirs)
	}
	if _, err := parse(t, "--data-dir="+t.TempDir(), "--wal-dir=/from-flag"); err == nil ||
		!strings.Contains(err.Error(), "conflicting environment variable ETCD_WAL_DIR is shadowed by corresponding command-line flag") {
		t.Errorf("flag and variable both given: %v, want etcd's refusal", err)
	}
	t.Setenv("ETCD_WAL_DIR", "")
	t.Setenv("ETCD_TLS_MIN_VERSION", "TLS1.0")
	if _, err := parse(t, "--data-dir="+t.TempDir()); err == nil || !strings.Contains(err.Error(), "ETCD_TLS_MIN_VERSION") && !strings.Contains(err.Error(), "TLS1.0") {
		t.Errorf("bad TLS version from the environment: %v", err)
	}
}

// TestConfigFile: etcd's YAML configuration file, as kubeadm-style and
// etcd's sample files write it: flag names as keys, TLS under
// client-transport-security and peer-transport-security, durations in
// nanoseconds; with a file, other flags and the environment are ignored.
func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("etcd.yaml", `
name: 'node1'
data-dir: `+filepath.Join(dir, "data")+`
wal-dir: `+filepath.Join(dir, "wal")+`
snapshot-count: 10000
heartbeat-interval: 100
election-timeout: 1000
listen-peer-urls: https://127.0.0.1:2380
listen-client-urls: https://127.0.0.1:2379
initial-advertise-peer-urls: https://127.0.0.1:2380
advertise-client-urls: https://127.0.0.1:2379
initial-cluster: node1=https://127.0.0.1:2380
initial-cluster-token: 'etcd-cluster'
initial-cluster-state: 'new'
force-new-cluster: true
strict-reconfig-check: false
experimental-snapshot-catch-up-entries: 777
enable-v2: false
watch-progress-notify-interval: 600000000000
log-outputs: [stderr]
cipher-suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]
feature-gates: InitialCorruptCheck=true
discovery-config:
  client:
    dial-timeout: 2000000000
client-transport-security:
  cert-file: /etc/server.crt
  key-file: /etc/server.key
  client-cert-auth: true
  trusted-ca-file: /etc/ca.crt
peer-transport-security:
  cert-file: /etc/peer.crt
  key-file: /etc/peer.key
  client-cert-auth: true
  trusted-ca-file: /etc/ca.crt
  allowed-cn: [node1, node2]
`)
	t.Setenv("ETCD_MAX_LEARNERS", "5") // ignored: a file is given
	cfg, err := parse(t, "--config-file="+good, "--name=ignored")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Name != "node1" || cfg.MaxLearners != 1 || cfg.LogDirs[0] != filepath.Join(dir, "wal") || !cfg.NoStrictReconfig {
		t.Errorf("name %q, max learners %d, log dirs %v, strict off %v", cfg.Name, cfg.MaxLearners, cfg.LogDirs, cfg.NoStrictReconfig)
	}
	if !cfg.ForceNewCluster {
		t.Error("force-new-cluster: true in the file, yet not in the member's configuration")
	}
	if cfg.CatchUpEntries != 777 {
		t.Errorf("experimental-snapshot-catch-up-entries: %d", cfg.CatchUpEntries)
	}
	if cfg.WatchProgressNotifyInterval != 10*time.Minute || !cfg.InitialCorruptCheck || len(cfg.InitialCluster["node1"]) != 1 {
		t.Errorf("progress interval %v, initial check %v, cluster %v", cfg.WatchProgressNotifyInterval, cfg.InitialCorruptCheck, cfg.InitialCluster)
	}
	if cl, pe := cfg.TLS.Client, cfg.TLS.Peer; cl.CertFile != "/etc/server.crt" || !cl.ClientCertAuth || pe.KeyFile != "/etc/peer.key" ||
		strings.Join(pe.AllowedCNs, ",") != "node1,node2" || len(cl.CipherSuites) != 1 {
		t.Errorf("TLS from the file: %+v %+v", cl, pe)
	}
	// ETCD_CONFIG_FILE names the file when the flag does not.
	t.Setenv("ETCD_CONFIG_FILE", good)
	if cfg, err := parse(t); err != nil || cfg.Name != "node1" {
		t.Errorf("ETCD_CONFIG_FILE: name %q, %v", cfg.Name, err)
	}
	t.Setenv("ETCD_CONFIG_FILE", "")
	for name, tc := range map[string]struct{ body, wantErr string }{
		"duration as a string":  {"watch-progress-notify-interval: 10m\n", "a duration must be integer nanoseconds"},
		"refused value":         {"unsafe-no-fsync: true\n", "--unsafe-no-fsync"},
		"discovery token alone": {"discovery-config:\n  token: abc\n", "both --discovery-token and --discovery-endpoints must be set"},
		"discovery server name": {"discovery-config:\n  client:\n    secure:\n      server-name: x\n", "discovery-config.client.secure.server-name: strata does not support it"},
		"bad TLS version":       {"tls-min-version: TLS1.1\n", `unexpected TLS version "TLS1.1"`},
		"bad security block":    {"client-transport-security: yes\n", "invalid client-transport-security"},
		"not YAML":              {"name: [\n", "config file"},
	} {
		t.Run(name, func(t *testing.T) {
			p := write(strings.ReplaceAll(name, " ", "-")+".yaml", "data-dir: "+filepath.Join(dir, "x")+"\n"+tc.body)
			if _, err := parse(t, "--config-file="+p); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// TestLogger: --logger, --log-outputs, --log-format and
// --enable-log-rotation with etcd's rules and errors; a file output
// receives the log, rotated or not.
func TestLogger(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "strata.log")
	rotated := filepath.Join(dir, "rotated.log")
	def := `{"maxsize": 100, "maxage": 0, "maxbackups": 0, "localtime": false, "compress": false}`
	for _, tc := range []struct {
		name, logger, outputs, format, wantErr string
		rotation                               *string
	}{
		{name: "etcd's defaults", logger: "zap", outputs: "default", format: "json"},
		{name: "console to stdout", logger: "zap", outputs: "stdout", format: "console"},
		{name: "journal", logger: "zap", outputs: "systemd/journal", format: "json"},
		{name: "file and stderr", logger: "zap", outputs: file + ",stderr", format: "json"},
		{name: "capnslog", logger: "capnslog", outputs: "default", format: "json", wantErr: "--logger=capnslog is removed in v3.5"},
		{name: "unknown logger", logger: "logrus", outputs: "default", format: "json", wantErr: `unknown logger option "logrus"`},
		{name: "default with more", logger: "zap", outputs: "default,stdout", format: "json", wantErr: `multi logoutput for "default" is not supported yet`},
		{name: "unknown format", logger: "zap", outputs: "default", format: "text", wantErr: "unknown log format: text, supported values json, console"},
		{name: "rotation of a file and stderr", logger: "zap", outputs: rotated + ",stderr", format: "json", rotation: &def},
		{name: "rotation without a file", logger: "zap", outputs: "default", format: "json", rotation: &def,
			wantErr: "--log-outputs requires a single file path when --log-rotate-config-json is defined"},
		{name: "rotation of two files", logger: "zap", outputs: file + "," + rotated, format: "json", rotation: &def,
			wantErr: "--log-outputs requires a single file path when --log-rotate-config-json is defined"},
		{name: "rotation config not JSON", logger: "zap", outputs: rotated, format: "json", rotation: new(string),
			wantErr: "improperly formatted log rotation config: unexpected end of JSON input"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lg, err := newLogger("info", tc.logger, tc.outputs, tc.format, tc.rotation)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			lg.Info("hello from the test")
			_ = lg.Sync()
		})
	}
	for _, f := range []string{file, rotated} {
		if data, err := os.ReadFile(f); err != nil || !strings.Contains(string(data), "hello from the test") {
			t.Errorf("log file %s: %q, %v", f, data, err)
		}
	}
}

// TestForceNewClusterFlag: --force-new-cluster, its environment variable
// and its default reach the member's configuration (it was refused before
// strata implemented it; member.Config.ForceNewCluster, node/force.go).
func TestForceNewClusterFlag(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  string
		want bool
	}{
		{name: "default", want: false},
		{name: "flag", args: []string{"--force-new-cluster"}, want: true},
		{name: "flag false", args: []string{"--force-new-cluster=false"}, want: false},
		{name: "environment", env: "true", want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("ETCD_FORCE_NEW_CLUSTER", tc.env)
			}
			cfg, err := parse(t, append([]string{"--data-dir=" + t.TempDir()}, tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.ForceNewCluster != tc.want {
				t.Errorf("ForceNewCluster %v, want %v", cfg.ForceNewCluster, tc.want)
			}
		})
	}
	var f flags
	if fl := newFlagSet(&f).Lookup("force-new-cluster"); fl == nil || strings.Contains(fl.Usage, "refused") || !strings.Contains(fl.Usage, "strata: as etcd") {
		t.Errorf("--force-new-cluster help does not say strata implements it: %v", fl)
	}
}
