package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/internal/testutil"
)

// putGet writes a key through cli and reads it back.
func putGet(t *testing.T, cli *clientv3.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	put, err := cli.Put(ctx, "flags/key", "value")
	if err != nil {
		t.Fatalf("put: %v", err)
	}
	got, err := cli.Get(ctx, "flags/key")
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "value" || got.Kvs[0].ModRevision != put.Header.Revision {
		t.Fatalf("get after put: %v (put at revision %d)", got.Kvs, put.Header.Revision)
	}
}

// httpsURL turns the harness's http://127.0.0.1:port into https://.
func httpsURL(u string) string { return "https://" + strings.TrimPrefix(u, "http://") }

// TestKubeadmFlags starts each server with the command of kubeadm's etcd
// static pod manifest (Kubernetes 1.34's getEtcdCommand: TLS with client
// certificates on the client and peer URLs, a metrics URL, the
// InitialCorruptCheck gate, --snapshot-count=10000,
// --watch-progress-notify-interval=5s), certificates made by the test in
// place of /etc/kubernetes/pki/etcd; both must serve a put and a get to a
// client presenting the API server's certificate, and answer kubeadm's
// probes (/livez, /readyz) on the metrics URL. strata alone also gets the
// command of the kubeadm releases that passed etcd 3.6's --experimental-*
// names (which etcd 3.7 no longer accepts).
func TestKubeadmFlags(t *testing.T) {
	type variant struct {
		name    string
		flavors []flavor
		extra   []string
	}
	for _, v := range []variant{
		{name: "feature gate", flavors: flavors, extra: []string{"--feature-gates=InitialCorruptCheck=true", "--watch-progress-notify-interval=5s"}},
		{name: "3.6 names", flavors: []flavor{strata}, extra: []string{"--experimental-initial-corrupt-check=true", "--experimental-watch-progress-notify-interval=5s"}},
	} {
		for _, f := range v.flavors {
			t.Run(v.name+"/"+string(f), func(t *testing.T) {
				t.Parallel()
				ca := newTestCA(t, "etcd-ca")
				serverCert, serverKey := ca.issue(t, "kubeadm-node")
				peerCert, peerKey := ca.issue(t, "kubeadm-node-peer")
				apiCert, apiKey := ca.issue(t, "kube-apiserver-etcd-client")
				ports := testutil.FreePorts(t, 2)
				local := fmt.Sprintf("https://127.0.0.1:%d", ports[0])
				metrics := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
				p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, f), Name: "kubeadm-node"})
				advertise := httpsURL(p.Endpoint())
				peer := httpsURL(p.PeerURL())
				p = testutil.NewProcess(t, testutil.Options{Binary: binary(t, f), Name: "kubeadm-node", Flags: append([]string{
					"--advertise-client-urls=" + advertise,
					"--cert-file=" + serverCert,
					"--client-cert-auth=true",
					"--data-dir=" + filepath.Join(t.TempDir(), "var-lib-etcd"),
					"--initial-advertise-peer-urls=" + peer,
					"--initial-cluster=kubeadm-node=" + peer,
					"--key-file=" + serverKey,
					"--listen-client-urls=" + local + "," + advertise,
					"--listen-metrics-urls=" + metrics,
					"--listen-peer-urls=" + peer,
					"--name=kubeadm-node",
					"--peer-cert-file=" + peerCert,
					"--peer-client-cert-auth=true",
					"--peer-key-file=" + peerKey,
					"--peer-trusted-ca-file=" + ca.path,
					"--snapshot-count=10000",
					"--trusted-ca-file=" + ca.path,
				}, v.extra...)})
				p.Launch()
				cli := tlsClient(t, local, ca, apiCert, apiKey)
				waitTLSReady(t, p, cli)
				putGet(t, cli)
				putGet(t, tlsClient(t, advertise, ca, apiCert, apiKey))
				for _, path := range []string{"/livez", "/readyz", "/health"} {
					resp, err := http.Get(metrics + path)
					if err != nil {
						t.Fatalf("kubeadm's probe %s: %v", path, err)
					}
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						t.Errorf("kubeadm's probe %s: %s", path, resp.Status)
					}
				}
			})
		}
	}
}

// helpFlag matches a flag line of `etcd --help`: the name and the default
// shown, quoted or not.
var helpFlag = regexp.MustCompile(`^  --([a-z0-9-]+)(?: '(.*)'| (\S+))?$`)

// etcdHelpDefaults reads every flag of the real etcd's --help with the
// default it shows. Where the help shows no usable literal value, the
// value is etcd's actual default (server/embed/config.go NewConfig).
func etcdHelpDefaults(t *testing.T) map[string]string {
	t.Helper()
	res := testutil.RunToExit(t, 30*time.Second, "", nil, bins.Etcd, "--help")
	out := res.Stdout + res.Stderr
	literal := map[string]string{
		"max-concurrent-streams":               "4294967295", // shown as 'math.MaxUint32'
		"backend-batch-interval":               "0s",         // shown as ''
		"memory-mlock":                         "false",
		"enable-grpc-gateway":                  "true",
		"bootstrap-defrag-threshold-megabytes": "0",
		"compaction-sleep-interval":            "0s",
		"downgrade-check-time":                 "5s",
		"snapshot-catchup-entries":             "5000",
	}
	defaults := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		m := helpFlag.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		value := m[2] + m[3]
		if v, ok := literal[m[1]]; ok {
			value = v
		}
		defaults[m[1]] = value
	}
	if len(defaults) != 113 {
		t.Fatalf("etcd --help lists %d flags; this test was written against etcd 3.7.3's 113:\n%s", len(defaults), out)
	}
	return defaults
}

// TestEveryEtcdFlagAtDefault starts each server with every flag of the
// real etcd's `etcd --help`, each given its default explicitly, and has it
// serve a put and a get. The flags that place the member (name, data
// directory, URLs, initial cluster and token) keep the harness's values.
// Four are given to strata only (etcdRefusesDefault): --discovery and
// --discovery-proxy, which etcd 3.7.3 lists but no longer defines, and two
// comma-separated lists whose empty default etcd, given it explicitly,
// reads as one empty item: --discovery-endpoints ("multiple discovery or
// bootstrap flags are set") and --cipher-suites ("unexpected TLS cipher
// suite \"\"").
func TestEveryEtcdFlagAtDefault(t *testing.T) {
	defaults := etcdHelpDefaults(t)
	placing := map[string]bool{
		"name": true, "data-dir": true, "listen-peer-urls": true, "listen-client-urls": true,
		"initial-advertise-peer-urls": true, "initial-cluster": true, "advertise-client-urls": true,
		"initial-cluster-token": true,
	}
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			var args []string
			for name, value := range defaults {
				if placing[name] || (f == etcd && etcdRefusesDefault[name]) {
					continue
				}
				args = append(args, "--"+name+"="+value)
			}
			p := start(t, f, args...)
			putGet(t, p.Client(t))
		})
	}
}

// etcdRefusesDefault are the flags of etcd 3.7.3's --help that etcd refuses
// when given their default explicitly (TestEveryEtcdFlagAtDefault).
var etcdRefusesDefault = map[string]bool{"discovery": true, "discovery-proxy": true, "discovery-endpoints": true, "cipher-suites": true}

// TestFlagErrorsAsEtcd: an unknown flag and bad TLS settings are refused
// by both servers with etcd's words (etcd's in a JSON log line, its quotes
// escaped), and nothing starts.
func TestFlagErrorsAsEtcd(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{name: "unknown flag", args: []string{"--no-such-flag=1"}, want: "flag provided but not defined: -no-such-flag"},
		{name: "TLS 1.1", args: []string{"--tls-min-version=TLS1.1"}, want: `unexpected TLS version "TLS1.1" (must be one of: TLS1.2, TLS1.3)`},
		{name: "min above max", args: []string{"--tls-min-version=TLS1.3", "--tls-max-version=TLS1.2"}, want: "min version (TLS1.3) is greater than max version (TLS1.2)"},
		{name: "cipher suites with TLS 1.3 only", args: []string{"--tls-min-version=TLS1.3", "--cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"},
			want: "cipher suites cannot be configured when only TLS1.3 is enabled"},
		{name: "unknown cipher suite", args: []string{"--cipher-suites=NOT_A_SUITE"}, want: `unexpected TLS cipher suite "NOT_A_SUITE"`},
		{name: "discovery fallback proxy", args: []string{"--discovery-fallback=proxy"}, want: `v2 proxy is deprecated, and --discovery-fallback can't be configured as "proxy"`},
		{name: "compact hash check time 0", args: []string{"--compact-hash-check-time=0"}, want: "--compact-hash-check-time must be >0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, f := range flavors {
				t.Run(string(f), func(t *testing.T) {
					t.Parallel()
					p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, f)})
					res := testutil.RunToExit(t, 30*time.Second, "", nil, binary(t, f), append(p.Args(), tc.args...)...)
					if res.Code == 0 {
						t.Fatalf("started, want a refusal naming %q", tc.want)
					}
					if !strings.Contains(res.Stderr, tc.want) && !strings.Contains(res.Stderr, strings.ReplaceAll(tc.want, `"`, `\"`)) {
						t.Errorf("exit %d, stderr does not say %q:\n%s", res.Code, tc.want, res.Stderr)
					}
					if _, err := os.Stat(p.DataDir()); err == nil {
						t.Errorf("a refused start created %s", p.DataDir())
					}
				})
			}
		})
	}
}

// TestAutoTLS: --auto-tls and --peer-auto-tls serve https client and peer
// URLs with certificates each server generates in
// <data-dir>/fixtures/client and /peer; a client that skips verification
// (etcdctl --insecure-skip-tls-verify) is served, on both servers.
func TestAutoTLS(t *testing.T) {
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, f)})
			client, peer := httpsURL(p.Endpoint()), httpsURL(p.PeerURL())
			p = testutil.NewProcess(t, testutil.Options{Binary: binary(t, f), Flags: []string{
				"--auto-tls", "--peer-auto-tls", "--self-signed-cert-validity=2",
				"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
				"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer, "--initial-cluster=m1=" + peer,
			}})
			p.Launch()
			cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: 3 * time.Second, Logger: zap.NewNop(),
				TLS: &tls.Config{InsecureSkipVerify: true}})
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			waitTLSReady(t, p, cli)
			putGet(t, cli)
			for _, side := range []string{"client", "peer"} {
				for _, file := range []string{"cert.pem", "key.pem"} {
					if _, err := os.Stat(filepath.Join(p.DataDir(), "fixtures", side, file)); err != nil {
						t.Errorf("%s: %v", side, err)
					}
				}
			}
		})
	}
}
