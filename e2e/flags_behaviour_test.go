package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/internal/testutil"
)

// TestMaxLearnersFlag: --max-learners bounds the learners a cluster takes,
// on both servers (etcd's default is one).
func TestMaxLearnersFlag(t *testing.T) {
	for _, f := range flavors {
		for _, tc := range []struct {
			flags    []string
			accepted int // learners added before the refusal
		}{
			{accepted: 1},
			{flags: []string{"--max-learners=2"}, accepted: 2},
		} {
			t.Run(fmt.Sprintf("%s/%d", f, tc.accepted), func(t *testing.T) {
				t.Parallel()
				cli := start(t, f, tc.flags...).Client(t)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				for i := range tc.accepted + 1 {
					_, err := cli.MemberAddAsLearner(ctx, []string{fmt.Sprintf("http://127.0.0.1:%d", i+1)})
					switch {
					case i < tc.accepted && err != nil:
						t.Fatalf("learner %d refused: %v", i+1, err)
					case i == tc.accepted && (err == nil || !strings.Contains(err.Error(), "too many learner members in cluster")):
						t.Fatalf("learner %d: %v, want too many learner members in cluster", i+1, err)
					}
				}
			})
		}
	}
}

// get fetches url with a short timeout and returns the status, or an error
// when nothing answers HTTP there.
func get(url string) (int, error) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// TestListenClientHTTPURLs: with --listen-client-http-urls, HTTP is
// served there and no longer on the client URLs, which keep serving gRPC;
// with --enable-grpc-gateway=false the JSON gateway is gone. Both servers
// answer alike.
func TestListenClientHTTPURLs(t *testing.T) {
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			httpURL := fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePorts(t, 1)[0])
			p := start(t, f, "--listen-client-http-urls="+httpURL)
			putGet(t, p.Client(t))
			if code, err := get(httpURL + "/health"); err != nil || code != http.StatusOK {
				t.Errorf("/health on --listen-client-http-urls: %d, %v", code, err)
			}
			if code, err := get(p.Endpoint() + "/health"); err == nil {
				t.Errorf("/health still served on the client URL: %d", code)
			}
		})
	}
	for _, f := range flavors {
		t.Run(string(f)+"/no gateway", func(t *testing.T) {
			t.Parallel()
			p := start(t, f, "--enable-grpc-gateway=false")
			body := strings.NewReader(`{"key":"Zm9v"}`)
			resp, err := http.Post(p.Endpoint()+"/v3/kv/range", "application/json", body)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("/v3/kv/range with the gateway off: %s, want 404", resp.Status)
			}
			if code, err := get(p.Endpoint() + "/health"); err != nil || code != http.StatusOK {
				t.Errorf("/health with the gateway off: %d, %v", code, err)
			}
		})
	}
}

// TestConfigFileFlag: both servers start from the same etcd YAML file
// given with --config-file; the harness's own flags are then ignored (the
// member's name is the file's), as etcd ignores them.
func TestConfigFileFlag(t *testing.T) {
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			// The file names the URLs and data directory the harness
			// chose, so that it finds the member where it waits for it.
			path := filepath.Join(t.TempDir(), "etcd.yaml")
			p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, f), Flags: []string{"--config-file=" + path}})
			yaml := fmt.Sprintf(`name: from-file
data-dir: %s
listen-client-urls: %s
advertise-client-urls: %s
listen-peer-urls: %s
initial-advertise-peer-urls: %s
initial-cluster: from-file=%s
initial-cluster-token: file-token
initial-cluster-state: new
heartbeat-interval: 50
election-timeout: 500
snapshot-count: 10000
max-learners: 2
watch-progress-notify-interval: 600000000000
feature-gates: InitialCorruptCheck=true
log-outputs: [stderr]
peer-transport-security:
  client-cert-auth: false
`, p.DataDir(), p.Endpoint(), p.Endpoint(), p.PeerURL(), p.PeerURL(), p.PeerURL())
			if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			p.Start()
			cli := p.Client(t)
			putGet(t, cli)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			members, err := cli.MemberList(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(members.Members) != 1 || members.Members[0].Name != "from-file" {
				t.Errorf("members %v, want one named from-file", members.Members)
			}
		})
	}
}

// TestWalDirFlag: --wal-dir holds the member's log (etcd's WAL, strata's
// raft log), and the member restarts from it with its data.
func TestWalDirFlag(t *testing.T) {
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			wal := filepath.Join(t.TempDir(), "wal")
			p := start(t, f, "--wal-dir="+wal)
			mods := seedKeys(t, p.Client(t), "seed/", 10)
			entries, err := os.ReadDir(wal)
			if err != nil || len(entries) == 0 {
				t.Fatalf("--wal-dir %s holds nothing: %v", wal, err)
			}
			p.Stop()
			p.Restart()
			checkSeed(t, p.Client(t), "seed/", mods)
		})
	}
}

// TestTLSVersionAndHostnameFlags: --tls-min-version=TLS1.3 refuses a
// TLS 1.2 client; --client-cert-allowed-hostname admits a client whose
// certificate is valid for the name and refuses one that is not. Both
// servers alike.
func TestTLSVersionAndHostnameFlags(t *testing.T) {
	for _, f := range flavors {
		for _, tc := range []struct {
			name  string
			flags []string
			// clientMax is the highest TLS version the client offers
			// (0: Go's); clientDNS the name its certificate is valid for.
			clientMax  uint16
			clientDNS  string
			wantServed bool
		}{
			{name: "TLS 1.3 server, TLS 1.3 client", flags: []string{"--tls-min-version=TLS1.3"}, clientDNS: "localhost", wantServed: true},
			{name: "TLS 1.3 server, TLS 1.2 client", flags: []string{"--tls-min-version=TLS1.3"}, clientMax: tls.VersionTLS12, clientDNS: "localhost"},
			{name: "allowed hostname matches", flags: []string{"--client-cert-allowed-hostname=client.example.com"}, clientDNS: "client.example.com", wantServed: true},
			{name: "allowed hostname differs", flags: []string{"--client-cert-allowed-hostname=client.example.com"}, clientDNS: "other.example.com"},
		} {
			t.Run(string(f)+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				ca := newTestCA(t, "ca")
				serverCert, serverKey := ca.issue(t, "server")
				url := fmt.Sprintf("https://127.0.0.1:%d", testutil.FreePorts(t, 1)[0])
				p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, f), Flags: append([]string{
					"--listen-client-urls=" + url, "--advertise-client-urls=" + url,
					"--cert-file=" + serverCert, "--key-file=" + serverKey, "--trusted-ca-file=" + ca.path, "--client-cert-auth",
				}, tc.flags...)})
				p.Launch()
				// A client every case admits tells when the server is ready.
				waitTLSReady(t, p, tlsClientFor(t, url, ca, "client.example.com", 0))
				cli := tlsClientFor(t, url, ca, tc.clientDNS, tc.clientMax)
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				_, err := cli.Put(ctx, "k", "v")
				if tc.wantServed && err != nil {
					t.Fatalf("refused: %v", err)
				}
				if !tc.wantServed && err == nil {
					t.Fatal("served, want refused")
				}
			})
		}
	}
}

// tlsClientFor returns a client for an https endpoint that trusts ca and
// presents a certificate of ca valid (as a client) for dnsName, offering
// TLS versions up to maxVersion (0: Go's).
func tlsClientFor(t *testing.T, endpoint string, ca *testCA, dnsName string, maxVersion uint16) *clientv3.Client {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "client"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{dnsName},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12, MaxVersion: maxVersion,
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: cfg, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// TestCORSAndHostWhitelist: --cors and --host-whitelist on the client
// URLs' HTTP side, on both servers: by default every answer allows every
// origin; a whitelist refuses a plain-HTTP request for another host with
// 421 and etcd's explanation; a CORS list echoes only the origins it names.
func TestCORSAndHostWhitelist(t *testing.T) {
	request := func(t *testing.T, endpoint, host, origin string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, endpoint+"/health", nil)
		if err != nil {
			t.Fatal(err)
		}
		if host != "" {
			req.Host = host
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			def := start(t, f)
			if resp, _ := request(t, def.Endpoint(), "", ""); resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "*" {
				t.Errorf("defaults: %s, Access-Control-Allow-Origin %q; want 200, *", resp.Status, resp.Header.Get("Access-Control-Allow-Origin"))
			}
			p := start(t, f, "--host-whitelist=127.0.0.1,etcd.example", "--cors=http://ui.example:8080")
			if resp, _ := request(t, p.Endpoint(), "etcd.example:2379", "http://ui.example:8080"); resp.StatusCode != 200 ||
				resp.Header.Get("Access-Control-Allow-Origin") != "http://ui.example:8080" {
				t.Errorf("whitelisted host, allowed origin: %s, Access-Control-Allow-Origin %q", resp.Status, resp.Header.Get("Access-Control-Allow-Origin"))
			}
			if resp, _ := request(t, p.Endpoint(), "", "http://evil.example:80"); resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "" {
				t.Errorf("other origin: %s, Access-Control-Allow-Origin %q; want 200 without it", resp.Status, resp.Header.Get("Access-Control-Allow-Origin"))
			}
			resp, body := request(t, p.Endpoint(), "evil.example:2379", "")
			if resp.StatusCode != http.StatusMisdirectedRequest || !strings.Contains(body, `etcd --host-whitelist "evil.example"`) {
				t.Errorf("host outside the whitelist: %s %q; want 421 with etcd's explanation", resp.Status, body)
			}
		})
	}
}

// TestPeerCertAllowedCN: a two-member cluster with peer TLS and
// --peer-client-cert-auth, each member presenting its own client
// certificate when it dials (--peer-client-cert-file), forms only when
// --peer-cert-allowed-cn names the common names of both kinds of
// certificate: as in etcd, the list applies to the certificate a member is
// served when it dials as well as to the one it is presented. Otherwise no
// member elects a leader. Both servers alike.
func TestPeerCertAllowedCN(t *testing.T) {
	for _, f := range flavors {
		for _, tc := range []struct {
			name    string
			allowed string
			forms   bool
		}{
			{name: "both kinds allowed", allowed: "m1,m2,peer-client-m1,peer-client-m2", forms: true},
			{name: "server certificates only", allowed: "m1,m2"},
			{name: "client certificates only", allowed: "peer-client-m1,peer-client-m2"},
		} {
			t.Run(string(f)+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				ca := newTestCA(t, "peer-ca")
				ports := testutil.FreePorts(t, 4)
				names := []string{"m1", "m2"}
				var initial []string
				for i, name := range names {
					initial = append(initial, fmt.Sprintf("%s=https://127.0.0.1:%d", name, ports[i]))
				}
				var procs []*testutil.Process
				var clients []*clientv3.Client
				for i, name := range names {
					cert, key := ca.issue(t, name)
					clientCert, clientKey := ca.issue(t, "peer-client-"+name)
					peer := fmt.Sprintf("https://127.0.0.1:%d", ports[i])
					client := fmt.Sprintf("http://127.0.0.1:%d", ports[2+i])
					p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, f), Name: name, Token: "e2e-allowed-cn", Flags: []string{
						"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
						"--initial-cluster=" + strings.Join(initial, ","),
						"--peer-cert-file=" + cert, "--peer-key-file=" + key, "--peer-trusted-ca-file=" + ca.path,
						"--peer-client-cert-file=" + clientCert, "--peer-client-key-file=" + clientKey,
						"--peer-client-cert-auth", "--peer-cert-allowed-cn=" + tc.allowed,
						"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
					}})
					p.Launch()
					procs = append(procs, p)
					cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { cli.Close() })
					clients = append(clients, cli)
				}
				if tc.forms {
					for i, p := range procs {
						waitTLSReady(t, p, clients[i])
					}
					putGet(t, clients[1])
					return
				}
				// Refused: for several election timeouts, no leader.
				deadline := time.Now().Add(5 * time.Second)
				for time.Now().Before(deadline) {
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					st, err := clients[0].Status(ctx, clients[0].Endpoints()[0])
					cancel()
					if err == nil && st.Leader != 0 {
						t.Fatalf("a leader (%x) with peers whose certificates the allowed CNs refuse", st.Leader)
					}
					time.Sleep(100 * time.Millisecond)
				}
			})
		}
	}
}

// issueFiles writes a certificate of ca for cn with the given SANs, usable
// as a client and a server, and its key; it returns their paths.
func issueFiles(t *testing.T, ca *testCA, cn string, ips []net.IP, dns []string) (certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  ips,
		DNSNames:     dns,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return writePEM(t, ca.dir, cn+".pem", "CERTIFICATE", der), writePEM(t, ca.dir, cn+"-key.pem", "EC PRIVATE KEY", keyDER)
}

// TestPeerClientSANVerification: a member dialing its peers with a client
// certificate (--peer-client-cert-file) that names another address than
// the one it connects from is refused by its peers unless they skip the
// check (--peer-skip-client-san-verification), as etcd's peers refuse it.
func TestPeerClientSANVerification(t *testing.T) {
	for _, f := range flavors {
		for _, skip := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/skip=%v", f, skip), func(t *testing.T) {
				t.Parallel()
				ca := newTestCA(t, "peer-ca")
				ports := testutil.FreePorts(t, 4)
				names := []string{"m1", "m2"}
				var initial []string
				for i, name := range names {
					initial = append(initial, fmt.Sprintf("%s=https://127.0.0.1:%d", name, ports[i]))
				}
				var procs []*testutil.Process
				var clients []*clientv3.Client
				for i, name := range names {
					cert, key := ca.issue(t, name)
					// Valid for 10.1.2.3 only; the member dials from 127.0.0.1.
					clientCert, clientKey := issueFiles(t, ca, "elsewhere-"+name, []net.IP{net.ParseIP("10.1.2.3")}, nil)
					peer := fmt.Sprintf("https://127.0.0.1:%d", ports[i])
					client := fmt.Sprintf("http://127.0.0.1:%d", ports[2+i])
					p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, f), Name: name, Token: "e2e-san", Flags: []string{
						"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
						"--initial-cluster=" + strings.Join(initial, ","),
						"--peer-cert-file=" + cert, "--peer-key-file=" + key, "--peer-trusted-ca-file=" + ca.path,
						"--peer-client-cert-file=" + clientCert, "--peer-client-key-file=" + clientKey,
						"--peer-client-cert-auth", fmt.Sprintf("--peer-skip-client-san-verification=%v", skip),
						"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
					}})
					p.Launch()
					procs = append(procs, p)
					cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { cli.Close() })
					clients = append(clients, cli)
				}
				if skip {
					for i, p := range procs {
						waitTLSReady(t, p, clients[i])
					}
					putGet(t, clients[1])
					return
				}
				deadline := time.Now().Add(5 * time.Second)
				for time.Now().Before(deadline) {
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					st, err := clients[0].Status(ctx, clients[0].Endpoints()[0])
					cancel()
					if err == nil && st.Leader != 0 {
						t.Fatalf("a leader (%x) though every peer's client certificate names another address", st.Leader)
					}
					time.Sleep(100 * time.Millisecond)
				}
			})
		}
	}
}

// TestHTTPSMetricsURL: an https --listen-metrics-urls is served with the
// client URLs' certificate, on both servers.
func TestHTTPSMetricsURL(t *testing.T) {
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			ca := newTestCA(t, "ca")
			cert, key := ca.issue(t, "server")
			ports := testutil.FreePorts(t, 2)
			client := fmt.Sprintf("https://127.0.0.1:%d", ports[0])
			metrics := fmt.Sprintf("https://127.0.0.1:%d", ports[1])
			p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, f), Flags: []string{
				"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
				"--cert-file=" + cert, "--key-file=" + key, "--listen-metrics-urls=" + metrics,
			}})
			p.Launch()
			waitTLSReady(t, p, tlsClient(t, client, ca, "", ""))
			pool := x509.NewCertPool()
			pool.AddCert(ca.cert)
			hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
			resp, err := hc.Get(metrics + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(body), "etcd_server_has_leader") {
				t.Errorf("https metrics URL: %s, %d bytes without etcd_server_has_leader", resp.Status, len(body))
			}
		})
	}
}
