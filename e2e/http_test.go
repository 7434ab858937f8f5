package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strata-kv/strata/internal/testutil"
)

// httpDo sends one request and returns the status and body.
func httpDo(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	return resp.StatusCode, string(b)
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// TestHTTPEndpoints checks /health, /livez, /readyz and /version on strata
// and on etcd with the same expectations.
func TestHTTPEndpoints(t *testing.T) {
	t.Parallel()
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			p := start(t, f)
			url := p.Endpoint()
			for _, tc := range []struct {
				name, path string
				wantCode   int
				wantBody   string // exact
			}{
				{name: "health", path: "/health", wantCode: 200, wantBody: `{"health":"true","reason":""}`},
				{name: "health serializable", path: "/health?serializable=true", wantCode: 200, wantBody: `{"health":"true","reason":""}`},
				{name: "livez", path: "/livez", wantCode: 200, wantBody: "ok\n"},
				{name: "livez verbose", path: "/livez?verbose", wantCode: 200, wantBody: "[+]serializable_read ok\nok\n"},
				{name: "livez one check", path: "/livez/serializable_read", wantCode: 200, wantBody: "ok\n"},
				{name: "readyz", path: "/readyz", wantCode: 200, wantBody: "ok\n"},
				{name: "readyz one check", path: "/readyz/linearizable_read?verbose", wantCode: 200, wantBody: "[+]linearizable_read ok\nok\n"},
				{name: "readyz exclude", path: "/readyz?verbose&exclude=non_learner&exclude=data_corruption&exclude=serializable_read", wantCode: 200, wantBody: "[+]linearizable_read ok\nok\n"},
			} {
				code, body := httpDo(t, http.MethodGet, url+tc.path, "")
				if code != tc.wantCode || strings.TrimSpace(body) != strings.TrimSpace(tc.wantBody) {
					t.Errorf("%s: GET %s = %d %q, want %d %q", tc.name, tc.path, code, body, tc.wantCode, tc.wantBody)
				}
			}

			// Verbose readyz lists every check once (order is etcd's map order).
			code, body := httpDo(t, http.MethodGet, url+"/readyz?verbose", "")
			for _, check := range []string{"data_corruption", "serializable_read", "linearizable_read", "non_learner"} {
				if code != 200 || !strings.Contains(body, "[+]"+check+" ok\n") {
					t.Errorf("readyz?verbose = %d %q, want a [+]%s ok line", code, body, check)
				}
			}
			if code, _ := httpDo(t, http.MethodPost, url+"/health", ""); code != http.StatusMethodNotAllowed {
				t.Errorf("POST /health = %d, want 405", code)
			}

			code, body = httpDo(t, http.MethodGet, url+"/version", "")
			var v map[string]string
			if err := json.Unmarshal([]byte(body), &v); code != 200 || err != nil {
				t.Fatalf("/version = %d %q (%v)", code, body, err)
			}
			if !regexp.MustCompile(`^3\.\d+\.\d+`).MatchString(v["etcdserver"]) || !regexp.MustCompile(`^3\.\d+\.0$`).MatchString(v["etcdcluster"]) {
				t.Errorf("/version = %v, want etcdserver 3.x.y and etcdcluster 3.x.0", v)
			}
		})
	}
}

// TestHTTPHealthWithoutLeader: one member of three left alone has no
// leader: /health and the linearizable readyz check fail as in etcd, the
// serializable ones still pass.
func TestHTTPHealthWithoutLeader(t *testing.T) {
	t.Parallel()
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, f), Size: 3})
			c.Members[1].Kill()
			c.Members[2].Kill()
			url := c.Members[0].Endpoint()
			var code int
			var body string
			// A member that was leader, or that has not yet timed out its
			// leader, first fails the read (RANGE ERROR) until raft notices.
			for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
				if code, body = httpDo(t, http.MethodGet, url+"/health", ""); strings.Contains(body, "NO LEADER") {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if code != http.StatusServiceUnavailable || strings.TrimSpace(body) != `{"health":"false","reason":"RAFT NO LEADER"}` {
				t.Fatalf("/health alone = %d %q, want 503 RAFT NO LEADER", code, body)
			}
			if code, body := httpDo(t, http.MethodGet, url+"/health?serializable=true", ""); code != 200 {
				t.Errorf("/health?serializable=true alone = %d %q, want 200", code, body)
			}
			if code, body := httpDo(t, http.MethodGet, url+"/livez", ""); code != 200 {
				t.Errorf("/livez alone = %d %q, want 200", code, body)
			}
			code, body = httpDo(t, http.MethodGet, url+"/readyz", "")
			if code != http.StatusServiceUnavailable || !strings.Contains(body, "[-]linearizable_read failed") || !strings.Contains(body, "[+]serializable_read ok") {
				t.Errorf("/readyz alone = %d %q, want 503 with linearizable_read failed", code, body)
			}
		})
	}
}

// TestHTTPGateway drives etcd's JSON gateway: put, range, txn, and a watch
// stream, on both servers.
func TestHTTPGateway(t *testing.T) {
	t.Parallel()
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			p := start(t, f)
			url := p.Endpoint()
			post := func(path, body string) map[string]any {
				t.Helper()
				code, resp := httpDo(t, http.MethodPost, url+path, body)
				var out map[string]any
				if err := json.Unmarshal([]byte(resp), &out); code != 200 || err != nil {
					t.Fatalf("POST %s %s = %d %q (%v)", path, body, code, resp, err)
				}
				return out
			}

			// A watch stream opened first sees the put below.
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v3/watch",
				strings.NewReader(`{"create_request":{"key":"`+b64("foo")+`"}}`))
			wresp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("watch: %v", err)
			}
			defer wresp.Body.Close()
			lines := bufio.NewScanner(wresp.Body)
			if !lines.Scan() || !strings.Contains(lines.Text(), `"created":true`) {
				t.Fatalf("watch: first message %q (%v), want created", lines.Text(), lines.Err())
			}

			put := post("/v3/kv/put", `{"key":"`+b64("foo")+`","value":"`+b64("bar")+`"}`)
			rev := put["header"].(map[string]any)["revision"].(string)

			rng := post("/v3/kv/range", `{"key":"`+b64("foo")+`"}`)
			kvs, _ := rng["kvs"].([]any)
			if len(kvs) != 1 || kvs[0].(map[string]any)["value"] != b64("bar") || kvs[0].(map[string]any)["mod_revision"] != rev || rng["count"] != "1" {
				t.Fatalf("range = %v, want foo=bar at mod_revision %s", rng, rev)
			}

			txn := post("/v3/kv/txn", `{"compare":[{"key":"`+b64("foo")+`","result":"EQUAL","target":"VALUE","value":"`+b64("bar")+`"}],`+
				`"success":[{"request_put":{"key":"`+b64("foo")+`","value":"`+b64("baz")+`"}}],`+
				`"failure":[{"request_range":{"key":"`+b64("foo")+`"}}]}`)
			if txn["succeeded"] != true {
				t.Fatalf("txn = %v, want succeeded", txn)
			}
			if resps, _ := txn["responses"].([]any); len(resps) != 1 || resps[0].(map[string]any)["response_put"] == nil {
				t.Fatalf("txn responses = %v, want one response_put", txn["responses"])
			}
			txn = post("/v3/kv/txn", `{"compare":[{"key":"`+b64("foo")+`","result":"EQUAL","target":"VALUE","value":"`+b64("bar")+`"}],`+
				`"failure":[{"request_range":{"key":"`+b64("foo")+`"}}]}`)
			if _, ok := txn["succeeded"]; ok {
				t.Fatalf("second txn = %v, want not succeeded (false is omitted)", txn)
			}

			if !lines.Scan() || !strings.Contains(lines.Text(), `"value":"`+b64("bar")+`"`) {
				t.Fatalf("watch: second message %q (%v), want the put of bar", lines.Text(), lines.Err())
			}

			// etcd's error shape for an invalid request.
			code, body := httpDo(t, http.MethodPost, url+"/v3/kv/put", `{"value":"`+b64("x")+`"}`)
			if code != http.StatusBadRequest || !strings.Contains(body, "key is not provided") {
				t.Errorf("put without key = %d %q, want 400 key is not provided", code, body)
			}
		})
	}
}

// TestHTTPMetrics checks that the metrics dashboards chart are present and
// move with writes.
func TestHTTPMetrics(t *testing.T) {
	t.Parallel()
	p := start(t, strata)
	url := p.Endpoint()
	scrape := func() map[string]float64 { return scrapeMetrics(t, url) }
	before := scrape()
	cli := p.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for i := range 20 {
		if _, err := cli.Put(ctx, "k"+strconv.Itoa(i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	after := scrape()

	present := []string{
		"etcd_server_has_leader", "etcd_server_is_leader", "etcd_server_leader_changes_seen_total",
		"etcd_server_proposals_committed_total", "etcd_server_proposals_applied_total",
		"etcd_server_proposals_pending", "etcd_server_proposals_failed_total",
		"etcd_mvcc_db_total_size_in_bytes", "etcd_debugging_mvcc_current_revision",
		"etcd_disk_wal_fsync_duration_seconds_count", "etcd_disk_backend_commit_duration_seconds_count",
		"strata_raftlog_segments", "strata_raftlog_bytes", "strata_raftlog_fsyncs_total", "strata_raftlog_appends_total",
		"strata_engine_applied_index", "strata_engine_durable_index", "strata_raftlog_compactions_total",
		"go_goroutines",
	}
	for _, name := range present {
		if _, ok := after[name]; !ok {
			t.Errorf("metric %s missing", name)
		}
	}
	for _, name := range []string{"etcd_server_has_leader", "etcd_server_is_leader", "etcd_server_leader_changes_seen_total"} {
		if after[name] != 1 {
			t.Errorf("%s = %v, want 1 on a single member", name, after[name])
		}
	}
	for _, name := range []string{
		"etcd_server_proposals_committed_total", "etcd_server_proposals_applied_total",
		"etcd_debugging_mvcc_current_revision", "etcd_disk_wal_fsync_duration_seconds_count",
		"etcd_disk_backend_commit_duration_seconds_count", "strata_raftlog_fsyncs_total",
		"strata_raftlog_appends_total", "strata_engine_applied_index", "strata_raftlog_bytes",
		`grpc_server_handled_total{grpc_code="OK",grpc_method="Put",grpc_service="etcdserverpb.KV",grpc_type="unary"}`,
	} {
		if after[name] < before[name]+20 && !strings.HasPrefix(name, "strata_raftlog_bytes") {
			t.Errorf("%s moved from %v to %v over 20 puts, want +20 at least", name, before[name], after[name])
		}
		if after[name] <= before[name] {
			t.Errorf("%s did not move: %v -> %v", name, before[name], after[name])
		}
	}
	if after["etcd_server_proposals_pending"] != 0 || after["etcd_server_proposals_failed_total"] != 0 {
		t.Errorf("pending %v, failed %v after acknowledged puts, want 0 and 0",
			after["etcd_server_proposals_pending"], after["etcd_server_proposals_failed_total"])
	}
}

// scrapeMetrics reads a server's /metrics: each sample's name (with its
// labels) and value.
func scrapeMetrics(t *testing.T, url string) map[string]float64 {
	t.Helper()
	code, body := httpDo(t, http.MethodGet, url+"/metrics", "")
	if code != 200 {
		t.Fatalf("/metrics = %d", code)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// TestGroupCommitWaitsForWritesOnTheirWay checks the member's wiring of the
// group commit's wait (docs/write-path.md, decision 7) through the real
// binary: a lone writer's puts are never held, and concurrent writers' are,
// so that many puts share each fsync.
func TestGroupCommitWaitsForWritesOnTheirWay(t *testing.T) {
	t.Parallel()
	p := start(t, strata)
	url := p.Endpoint()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const holds = "strata_raft_incoming_waits_total"

	cli := p.Client(t)
	before := scrapeMetrics(t, url)
	for i := range 50 {
		if _, err := cli.Put(ctx, "lone"+strconv.Itoa(i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	after := scrapeMetrics(t, url)
	if _, ok := after[holds]; !ok {
		t.Fatalf("metric %s missing", holds)
	}
	if after[holds] != before[holds] {
		t.Fatalf("%s moved from %v to %v over one writer's puts: a lone writer was held", holds, before[holds], after[holds])
	}

	const writers, each = 64, 50
	clients := []*clientv3.Client{cli, p.Client(t), p.Client(t), p.Client(t)}
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if _, err := clients[w%len(clients)].Put(ctx, fmt.Sprintf("w%d-%d", w, i), "v"); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	loaded := scrapeMetrics(t, url)
	if loaded[holds] <= after[holds] {
		t.Errorf("%s did not move over %d concurrent writers' puts: the leader never waited for writes on their way", holds, writers)
	}
	entries := loaded["strata_raftlog_entries_total"] - after["strata_raftlog_entries_total"]
	fsyncs := loaded["strata_raftlog_fsyncs_total"] - after["strata_raftlog_fsyncs_total"]
	if entries < writers*each || fsyncs <= 0 || entries/fsyncs < 2 {
		t.Errorf("%v entries in %v fsyncs for %d puts from %d writers: want at least 2 entries per fsync", entries, fsyncs, writers*each, writers)
	}
}

// TestHTTPOverTLS serves the HTTP endpoints and gRPC on one https port with
// --client-cert-auth: clientv3 (ALPN h2) and an HTTP client offering both h2
// and http/1.1 (as curl does) are both served; an HTTP client without a
// certificate is refused.
func TestHTTPOverTLS(t *testing.T) {
	t.Parallel()
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			ca := newTestCA(t, "ca")
			serverCert, serverKey := ca.issue(t, "server")
			rootCert, rootKey := ca.issue(t, "root")
			url := fmt.Sprintf("https://127.0.0.1:%d", testutil.FreePorts(t, 1)[0])
			p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, f), Flags: []string{
				"--listen-client-urls=" + url, "--advertise-client-urls=" + url,
				"--cert-file=" + serverCert, "--key-file=" + serverKey, "--trusted-ca-file=" + ca.path,
				"--client-cert-auth",
			}})
			p.Launch()
			cli := tlsClient(t, url, ca, rootCert, rootKey)
			waitTLSReady(t, p, cli)

			pool := x509.NewCertPool()
			pool.AddCert(ca.cert)
			cert, err := tls.LoadX509KeyPair(rootCert, rootKey)
			if err != nil {
				t.Fatal(err)
			}
			withCert := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{ForceAttemptHTTP2: true,
				TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}}}
			resp, err := withCert.Get(url + "/health")
			if err != nil {
				t.Fatalf("GET /health over https: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != `{"health":"true","reason":""}` {
				t.Fatalf("GET /health over https = %d %q", resp.StatusCode, body)
			}
			resp, err = withCert.Post(url+"/v3/kv/put", "application/json", strings.NewReader(`{"key":"`+b64("tls")+`","value":"`+b64("yes")+`"}`))
			if err != nil {
				t.Fatalf("gateway put over https: %v", err)
			}
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("gateway put over https = %d %q", resp.StatusCode, body)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			if got, err := cli.Get(ctx, "tls"); err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "yes" {
				t.Fatalf("get of the gateway's put over gRPC: %v %v", got, err)
			}

			noCert := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
			if resp, err := noCert.Get(url + "/health"); err == nil {
				resp.Body.Close()
				t.Fatalf("GET /health without a client certificate = %d, want refused", resp.StatusCode)
			}
		})
	}
}

// TestHTTPListenMetricsURLs: --listen-metrics-urls serves /metrics and the
// health endpoints on a port of their own (kubeadm probes etcd there).
func TestHTTPListenMetricsURLs(t *testing.T) {
	t.Parallel()
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			murl := fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePorts(t, 1)[0])
			start(t, f, "--listen-metrics-urls="+murl)
			for _, tc := range []struct{ path, want string }{
				{"/health?exclude=NOSPACE&serializable=true", `"health":"true"`},
				{"/livez", "ok"},
				{"/readyz", "ok"},
				{"/metrics", "etcd_server_has_leader 1"},
			} {
				if code, body := httpDo(t, http.MethodGet, murl+tc.path, ""); code != 200 || !strings.Contains(body, tc.want) {
					t.Errorf("GET %s on the metrics URL = %d, want 200 with %q", tc.path, code, tc.want)
				}
			}
		})
	}
}

// TestHTTPGatewayAuth: with auth on, the gateway authenticates as etcd's
// does: a token from /v3/auth/authenticate in the Authorization header,
// bare or after "Bearer " (etcd trims it), grants the user's permissions;
// no token is refused.
func TestHTTPGatewayAuth(t *testing.T) {
	t.Parallel()
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			p := start(t, f, "--bcrypt-cost=4")
			setupAuth(t, p.Client(t))
			url := p.Endpoint()
			code, body := httpDo(t, http.MethodPost, url+"/v3/auth/authenticate", `{"name":"alice","password":"apw"}`)
			var auth struct{ Token string }
			if err := json.Unmarshal([]byte(body), &auth); code != 200 || err != nil || auth.Token == "" {
				t.Fatalf("authenticate = %d %q (%v)", code, body, err)
			}
			put := func(key, token string) (int, string) {
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v3/kv/put",
					strings.NewReader(`{"key":"`+b64(key)+`","value":"`+b64("v")+`"}`))
				if token != "" {
					req.Header.Set("Authorization", token)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatalf("put %s: %v", key, err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b)
			}
			if code, body := put("foo/a", auth.Token); code != 200 {
				t.Errorf("alice's put in her prefix = %d %q, want 200", code, body)
			}
			if code, body := put("foo/bearer", "Bearer "+auth.Token); code != 200 {
				t.Errorf("alice's put in her prefix, token after Bearer = %d %q, want 200", code, body)
			}
			if code, body := put("bar", auth.Token); code == 200 || !strings.Contains(body, "permission denied") {
				t.Errorf("alice's put outside her prefix = %d %q, want permission denied", code, body)
			}
			if code, body := put("foo/b", ""); code == 200 || !strings.Contains(body, "user name is empty") {
				t.Errorf("put without a token = %d %q, want user name is empty", code, body)
			}
		})
	}
}

// TestHTTPPeerRoundTrip: a member of three reports a round-trip histogram
// for each of its two peers, as etcd does.
func TestHTTPPeerRoundTrip(t *testing.T) {
	t.Parallel()
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			c := testutil.StartCluster(t, testutil.ClusterOptions{Binary: binary(t, f), Size: 3})
			url := c.Members[0].Endpoint()
			var peers int
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
				_, body := httpDo(t, http.MethodGet, url+"/metrics", "")
				peers = strings.Count(body, "\netcd_network_peer_round_trip_time_seconds_count{To=\"")
				if peers == 2 {
					return
				}
			}
			t.Fatalf("round-trip histograms for %d peers, want 2", peers)
		})
	}
}
