package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/strata-kv/strata/internal/testutil"
	"github.com/strata-kv/strata/logger"
	"github.com/strata-kv/strata/tlsconfig"
)

// TestLoggerTLS: three members with https peer and client URLs and client
// certificate authentication on both, and a logger with https peer and
// client URLs (--peer-cert-file ..., --cert-file ..., --client-cert-auth),
// certificates of one CA generated here. The logger joins with `strata
// logger join --endpoints https://... --cacert --cert --key`, receives the
// log over TLS from the members, serves `strata logger status|recover`
// and /health over https to a client with a certificate, and refuses one
// without a certificate or without the CA. The members (--logger-truncate)
// reach its https client URL with their client certificates (their
// Truncate requests arrive), and `strata restore --logger https://...
// --cacert --cert --key` rebuilds the cluster's state from a backup
// version and the logger's entries.
func TestLoggerTLS(t *testing.T) {
	ca := newTestCA(t, "ca")
	ports := testutil.FreePorts(t, 8)
	names := []string{"m1", "m2", "m3"}
	var initial []string
	for i, name := range names {
		initial = append(initial, fmt.Sprintf("%s=https://127.0.0.1:%d", name, ports[i]))
	}
	var clientURLs []string
	for i, name := range names {
		cert, key := ca.issue(t, name)
		peer := fmt.Sprintf("https://127.0.0.1:%d", ports[i])
		client := fmt.Sprintf("https://127.0.0.1:%d", ports[3+i])
		clientURLs = append(clientURLs, client)
		p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, strata), Name: name, Token: "e2e-logger-tls", Flags: []string{
			"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
			"--initial-cluster=" + strings.Join(initial, ","),
			"--peer-cert-file=" + cert, "--peer-key-file=" + key, "--peer-trusted-ca-file=" + ca.path, "--peer-client-cert-auth",
			"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
			"--cert-file=" + cert, "--key-file=" + key, "--trusted-ca-file=" + ca.path, "--client-cert-auth",
			"--logger-truncate",
		}})
		p.Launch()
	}
	adminCert, adminKey := ca.issue(t, "admin")
	cli := tlsClient(t, clientURLs[0], ca, adminCert, adminKey)
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	for {
		c, cancelPut := context.WithTimeout(ctx, time.Second)
		_, err := cli.Put(c, "ready", "1")
		cancelPut()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the TLS cluster is not ready: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The logger, https both ways.
	loggerCert, loggerKey := ca.issue(t, "logger")
	lp := &loggerProc{
		dir:       filepath.Join(t.TempDir(), "logger.data"),
		peerURL:   fmt.Sprintf("https://127.0.0.1:%d", ports[6]),
		clientURL: fmt.Sprintf("https://127.0.0.1:%d", ports[7]),
	}
	lp.Process = testutil.NewProcess(t, testutil.Options{
		Binary: binary(t, strata), Name: "logger", DataDir: lp.dir,
		Command: []string{"logger", "--data-dir=" + lp.dir, "--listen-peer-urls=" + lp.peerURL,
			"--advertise-peer-urls=" + lp.peerURL, "--listen-client-urls=" + lp.clientURL,
			"--peer-cert-file=" + loggerCert, "--peer-key-file=" + loggerKey, "--peer-trusted-ca-file=" + ca.path, "--peer-client-cert-auth",
			"--cert-file=" + loggerCert, "--key-file=" + loggerKey, "--trusted-ca-file=" + ca.path, "--client-cert-auth"},
	})
	dialTLS, err := tlsconfig.Info{TrustedCAFile: ca.path, ClientCertFile: adminCert, ClientKeyFile: adminKey}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	lp.cli, err = logger.DialTLS(lp.clientURL, dialTLS)
	if err != nil {
		t.Fatal(err)
	}
	defer lp.cli.Close()
	for {
		_, err := cli.MemberAddAsLearner(ctx, []string{lp.peerURL})
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "unhealthy cluster") || ctx.Err() != nil {
			t.Fatalf("member add --learner: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	tlsArgs := []string{"--cacert=" + ca.path, "--cert=" + adminCert, "--key=" + adminKey}
	if out, err := runStrata(t, append([]string{"logger", "join", "--data-dir=" + lp.dir, "--name=L1",
		"--advertise-peer-urls=" + lp.peerURL, "--endpoints=" + clientURLs[1]}, tlsArgs...)...); err != nil {
		t.Fatalf("strata logger join over https: %v\n%s", err, out)
	}
	lp.Launch()

	// A backup version, then writes the logger must hold.
	target := "file://" + filepath.Join(t.TempDir(), "target")
	res := testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), append([]string{"backup", "create",
		"--endpoints=" + clientURLs[0], "--target=" + target, "--command-timeout=10s"}, tlsArgs...)...)
	if res.Code != 0 {
		t.Fatalf("backup create: exit %d, stdout %q, stderr %s", res.Code, res.Stdout, res.Stderr)
	}
	for i := range 300 {
		if _, err := cli.Put(ctx, fmt.Sprintf("k%d", i%20), fmt.Sprint("v", i)); err != nil {
			t.Fatal(err)
		}
	}
	head, err := cli.Get(ctx, "k0")
	if err != nil {
		t.Fatal(err)
	}
	lastRev := head.Header.Revision
	var commit uint64
	for _, ep := range clientURLs {
		if st, err := cli.Status(ctx, ep); err == nil {
			commit = max(commit, st.RaftIndex)
		}
	}
	st := lp.waitCommit(t, commit, 60*time.Second)
	if st.FirstIndex != 1 {
		t.Errorf("the logger holds from %d over TLS; want the whole log from 1", st.FirstIndex)
	}

	// The CLI, with and without the TLS flags.
	out, err := runStrata(t, append([]string{"logger", "status", "--endpoint=" + lp.clientURL, "--json"}, tlsArgs...)...)
	var got struct {
		CommitIndex uint64 `json:"commit_index"`
	}
	if err != nil || json.Unmarshal([]byte(out), &got) != nil || got.CommitIndex < commit {
		t.Errorf("strata logger status over https: %v, %q", err, out)
	}
	out, err = runStrata(t, append([]string{"logger", "recover", "--endpoint=" + lp.clientURL,
		fmt.Sprintf("--cluster=%x", head.Header.ClusterId), "--first=1", "--last=10"}, tlsArgs...)...)
	if err != nil || strings.Count(out, "\n") != 10 {
		t.Errorf("strata logger recover over https: %v, %q", err, out)
	}
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		// Refused in the handshake: the client sees a certificate error
		// or, under TLS 1.3, the connection closed under it.
		{name: "no client certificate", args: []string{"--cacert=" + ca.path}, want: "rpc error"},
		{name: "no CA", args: []string{"--cert=" + adminCert, "--key=" + adminKey}, want: "certificate"},
		{name: "plaintext", args: nil, want: ""},
	} {
		url := lp.clientURL
		if tt.name == "plaintext" {
			url = "http://" + strings.TrimPrefix(lp.clientURL, "https://")
		}
		out, err := runStrata(t, append([]string{"logger", "status", "--endpoint=" + url}, tt.args...)...)
		if err == nil || !strings.Contains(out, tt.want) {
			t.Errorf("strata logger status, %s: %v, %q; want a refusal naming %q", tt.name, err, out, tt.want)
		}
	}

	// /health over https with a client certificate.
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	cert, err := tls.LoadX509KeyPair(adminCert, adminKey)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}}
	resp, err := hc.Get(lp.clientURL + "/health")
	if err != nil {
		t.Fatalf("GET /health over https: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"health":"true"`) {
		t.Errorf("GET /health over https: %s %s", resp.Status, body)
	}

	// strata restore --logger https://... with the TLS flags.
	want := readKVsAt(t, ctx, cli, lastRev)
	p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, strata), Name: "r", Token: "restored"})
	res = testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), append([]string{"restore", "--from=" + target,
		"--logger=" + lp.clientURL, fmt.Sprintf("--to-revision=%d", lastRev), "--data-dir=" + p.DataDir(), "--name=r",
		"--initial-cluster=r=" + p.PeerURL(), "--initial-advertise-peer-urls=" + p.PeerURL(), "--initial-cluster-token=restored"}, tlsArgs...)...)
	if res.Code != 0 {
		t.Fatalf("restore --logger over https: exit %d, stdout %q, stderr %s", res.Code, res.Stdout, res.Stderr)
	}
	p.Launch()
	if err := p.WaitReady(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	rcli := p.Client(t)
	defer rcli.Close()
	if got := readKVsAt(t, ctx, rcli, lastRev); got != want {
		t.Errorf("restored from the logger over https:\n%s\nthe cluster answered:\n%s", got, want)
	}
	res = testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "restore", "--from="+target,
		"--logger="+lp.clientURL, fmt.Sprintf("--to-revision=%d", lastRev), "--data-dir="+filepath.Join(t.TempDir(), "none"),
		"--cacert="+ca.path)
	if res.Code != 1 || !strings.Contains(res.Stderr, "ask the logger at "+lp.clientURL) {
		t.Errorf("restore --logger over https without a client certificate: exit %d, stderr %q; want a refusal from the logger", res.Code, res.Stderr)
	}
	// The members' Truncate requests reach the https client URL with
	// their client certificates.
	deadline := time.Now().Add(30 * time.Second)
	for len(st.Truncations) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no Truncate from the members over TLS: %+v", st)
		}
		time.Sleep(200 * time.Millisecond)
		if st, err = lp.status(); err != nil {
			t.Fatal(err)
		}
	}

}

// TestLoggerAutoTLS: `strata logger` takes etcd's --auto-tls,
// --peer-auto-tls and --tls-min-version as a member does: its https client
// and peer URLs present the certificates it generated in
// <data-dir>/fixtures/client and /peer, a TLS 1.2 handshake is refused with
// --tls-min-version=TLS1.3, and a version etcd refuses is refused with
// etcd's message before anything is written.
func TestLoggerAutoTLS(t *testing.T) {
	ports := testutil.FreePorts(t, 2)
	dir := filepath.Join(t.TempDir(), "logger.data")
	peerURL := fmt.Sprintf("https://127.0.0.1:%d", ports[0])
	clientURL := fmt.Sprintf("https://127.0.0.1:%d", ports[1])
	args := []string{"logger", "--data-dir=" + dir, "--listen-peer-urls=" + peerURL,
		"--advertise-peer-urls=" + peerURL, "--listen-client-urls=" + clientURL, "--auto-tls", "--peer-auto-tls"}

	res := testutil.RunToExit(t, 30*time.Second, "", nil, binary(t, strata), append(args, "--tls-min-version=TLS1.1")...)
	if res.Code != 2 || !strings.Contains(res.Stderr, "TLS1.1") {
		t.Fatalf("--tls-min-version=TLS1.1: exit %d, stderr %q; want exit 2 naming the version", res.Code, res.Stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "fixtures")); !os.IsNotExist(err) {
		t.Fatalf("a refused command line wrote certificates: %v", err)
	}

	p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, strata), Name: "logger", DataDir: dir,
		Command: append(args, "--tls-min-version=TLS1.3")})
	p.Launch()
	for _, side := range []struct{ name, url string }{{"client", clientURL}, {"peer", peerURL}} {
		addr := strings.TrimPrefix(side.url, "https://")
		var conn *tls.Conn
		var err error
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			conn, err = tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
			if err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			t.Fatalf("%s URL over TLS 1.3: %v", side.name, err)
		}
		got := conn.ConnectionState().PeerCertificates[0].Raw
		conn.Close()
		file := filepath.Join(dir, "fixtures", side.name, "cert.pem")
		pemBytes, err := os.ReadFile(file)
		if err != nil {
			t.Fatalf("--auto-tls wrote no certificate: %v", err)
		}
		if block, _ := pem.Decode(pemBytes); block == nil || !bytes.Equal(block.Bytes, got) {
			t.Errorf("the %s URL presents a certificate other than %s", side.name, file)
		}
		if c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS12}); err == nil {
			c.Close()
			t.Errorf("the %s URL accepted TLS 1.2 under --tls-min-version=TLS1.3", side.name)
		}
	}
}
