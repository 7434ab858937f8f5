package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/internal/testutil"
)

// testCA is a certificate authority made for one test; nothing is
// committed to the repository.
type testCA struct {
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	path string // the CA certificate, PEM
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &testCA{dir: t.TempDir(), cert: cert, key: key}
	ca.path = writePEM(t, ca.dir, name+"-ca.pem", "CERTIFICATE", der)
	return ca
}

func writePEM(t *testing.T, dir, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// issue returns the paths of a certificate for cn, valid for 127.0.0.1 as
// a server and as a client (etcd's peers use one certificate both ways),
// and of its key.
func (ca *testCA) issue(t *testing.T, cn string) (certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost"},
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

// revoke writes a revocation list of ca naming the certificates at
// certPaths and returns its path.
func (ca *testCA) revoke(t *testing.T, certPaths ...string) string {
	t.Helper()
	var entries []x509.RevocationListEntry
	for _, path := range certPaths {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		block, _ := pem.Decode(data)
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, x509.RevocationListEntry{SerialNumber: cert.SerialNumber, RevocationTime: time.Now()})
	}
	der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{Number: big.NewInt(1),
		RevokedCertificateEntries: entries, ThisUpdate: time.Now(), NextUpdate: time.Now().Add(24 * time.Hour)}, ca.cert, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	// DER, as etcd reads it (strata reads PEM too).
	path := filepath.Join(ca.dir, "crl.der")
	if err := os.WriteFile(path, der, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// tlsClient returns a clientv3 client for an https endpoint that trusts
// ca and presents cert (none if certPath is empty).
func tlsClient(t *testing.T, endpoint string, ca *testCA, certPath, keyPath string) *clientv3.Client {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if certPath != "" {
		cert, err := tls.LoadX509KeyPair(certPath, keyPath)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: cfg, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// waitTLSReady polls with cli until a Get succeeds or p exits.
func waitTLSReady(t *testing.T, p *testutil.Process, cli *clientv3.Client) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		select {
		case <-p.Exited():
			t.Fatalf("server exited: %v", p.ExitErr())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err = cli.Get(ctx, "ready")
		cancel()
		if err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("not ready over TLS: %v", err)
}

// TestTLSClientCertAuth serves clients over https with
// --client-cert-auth: a client with a certificate from the trusted CA is
// served, one without a certificate or with a certificate from another CA
// is refused, and once auth is on the certificate's common name is the user.
func TestTLSClientCertAuth(t *testing.T) {
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			ca, other := newTestCA(t, "ca"), newTestCA(t, "other")
			serverCert, serverKey := ca.issue(t, "server")
			rootCert, rootKey := ca.issue(t, "root")
			aliceCert, aliceKey := ca.issue(t, "alice")
			strangerCert, strangerKey := other.issue(t, "root")
			url := fmt.Sprintf("https://127.0.0.1:%d", testutil.FreePorts(t, 1)[0])
			p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, f), Flags: []string{
				"--listen-client-urls=" + url, "--advertise-client-urls=" + url,
				"--cert-file=" + serverCert, "--key-file=" + serverKey, "--trusted-ca-file=" + ca.path,
				"--client-cert-auth", "--bcrypt-cost=4",
			}})
			p.Launch()
			root := tlsClient(t, url, ca, rootCert, rootKey)
			waitTLSReady(t, p, root)

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := root.Put(ctx, "k", "v"); err != nil {
				t.Fatalf("put with a trusted certificate: %v", err)
			}
			for name, cli := range map[string]*clientv3.Client{
				"no certificate":            tlsClient(t, url, ca, "", ""),
				"certificate of another CA": tlsClient(t, url, ca, strangerCert, strangerKey),
			} {
				cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := cli.Get(cctx, "k")
				ccancel()
				if err == nil {
					t.Errorf("%s: served, want refused", name)
				}
			}

			setupAuth(t, root)
			alice := tlsClient(t, url, ca, aliceCert, aliceKey)
			if _, err := alice.Put(ctx, "foo/x", "1"); err != nil {
				t.Fatalf("alice by certificate, in her prefix: %v", err)
			}
			if _, err := alice.Put(ctx, "bar", "1"); !errors.Is(rpctypes.Error(err), rpctypes.ErrPermissionDenied) {
				t.Fatalf("alice by certificate, outside: %v, want permission denied", err)
			}
			if _, err := alice.UserList(ctx); !errors.Is(rpctypes.Error(err), rpctypes.ErrPermissionDenied) {
				t.Fatalf("alice user list: %v, want permission denied", err)
			}
			if resp, err := root.UserList(ctx); err != nil || strings.Join(resp.Users, ",") != "alice,root" {
				t.Fatalf("root by certificate, user list: %v %v", resp, err)
			}
		})
	}
}

// TestPeerTLSCluster forms a three-member cluster whose members talk over
// https with --peer-client-cert-auth and serve clients over https, and
// checks that it replicates and that followers forward lease keepalives
// to the leader's https client URL.
// TestTLSClientCRL: with --client-crl-file, a client whose certificate the
// list revokes is refused and the others are served, on strata and on etcd
// (issue 14: strata refused to start with the flag).
func TestTLSClientCRL(t *testing.T) {
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			ca := newTestCA(t, "ca")
			serverCert, serverKey := ca.issue(t, "server")
			rootCert, rootKey := ca.issue(t, "root")
			revokedCert, revokedKey := ca.issue(t, "revoked")
			url := fmt.Sprintf("https://127.0.0.1:%d", testutil.FreePorts(t, 1)[0])
			p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, f), Flags: []string{
				"--listen-client-urls=" + url, "--advertise-client-urls=" + url,
				"--cert-file=" + serverCert, "--key-file=" + serverKey, "--trusted-ca-file=" + ca.path,
				"--client-cert-auth", "--client-crl-file=" + ca.revoke(t, revokedCert),
			}})
			p.Launch()
			root := tlsClient(t, url, ca, rootCert, rootKey)
			waitTLSReady(t, p, root)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := root.Put(ctx, "k", "v"); err != nil {
				t.Fatalf("put with a certificate the list does not name: %v", err)
			}
			cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := tlsClient(t, url, ca, revokedCert, revokedKey).Get(cctx, "k")
			ccancel()
			if err == nil {
				t.Errorf("a revoked certificate was served, want refused")
			}
		})
	}
}

func TestPeerTLSCluster(t *testing.T) {
	ca := newTestCA(t, "peer-ca")
	ports := testutil.FreePorts(t, 6)
	names := []string{"m1", "m2", "m3"}
	var initial []string
	for i, name := range names {
		initial = append(initial, fmt.Sprintf("%s=https://127.0.0.1:%d", name, ports[i]))
	}
	var procs []*testutil.Process
	var clients []*clientv3.Client
	for i, name := range names {
		cert, key := ca.issue(t, name)
		peer := fmt.Sprintf("https://127.0.0.1:%d", ports[i])
		client := fmt.Sprintf("https://127.0.0.1:%d", ports[3+i])
		p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, strata), Name: name, Token: "e2e-peer-tls", Flags: []string{
			"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
			"--initial-cluster=" + strings.Join(initial, ","),
			"--peer-cert-file=" + cert, "--peer-key-file=" + key, "--peer-trusted-ca-file=" + ca.path,
			"--peer-client-cert-auth",
			"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
			"--cert-file=" + cert, "--key-file=" + key, "--trusted-ca-file=" + ca.path,
		}})
		p.Launch()
		procs = append(procs, p)
		clients = append(clients, tlsClient(t, client, ca, "", ""))
	}
	for i, p := range procs {
		waitTLSReady(t, p, clients[i])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := clients[0]
	put, err := cli.Put(ctx, "over-tls", "yes")
	if err != nil {
		t.Fatal(err)
	}
	members, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(members.Members) != 3 {
		t.Fatalf("member list: %v", members.Members)
	}
	for _, m := range members.Members {
		if len(m.PeerURLs) != 1 || !strings.HasPrefix(m.PeerURLs[0], "https://") {
			t.Errorf("member %x peer URLs %v, want https", m.ID, m.PeerURLs)
		}
	}
	for i, p := range procs[1:] {
		c := clients[1+i]
		var got *clientv3.GetResponse
		for got == nil || got.Header.Revision < put.Header.Revision {
			if ctx.Err() != nil {
				t.Fatalf("%s never reached revision %d", p.Name(), put.Header.Revision)
			}
			if got, err = c.Get(ctx, "over-tls", clientv3.WithSerializable()); err != nil {
				t.Fatal(err)
			}
		}
		if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "yes" {
			t.Errorf("%s: %v", p.Name(), got.Kvs)
		}
	}
	// At least two of the three are followers: each forwards the
	// keepalive to the leader.
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range clients {
		if _, err := c.KeepAliveOnce(ctx, lease.ID); err != nil {
			t.Errorf("keepalive through %s: %v", names[i], err)
		}
	}
}
