package tlsconfig

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testPKI is a CA with certificates it issued, written as PEM files.
type testPKI struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	serial int64
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir()}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	p.ca, _ = x509.ParseCertificate(der)
	p.caKey, p.serial = key, 1
	p.write(t, "ca.pem", "CERTIFICATE", der)
	return p
}

func (p *testPKI) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// issue writes a certificate and key for name and returns its serial
// number and the key pair to present.
func (p *testPKI) issue(t *testing.T, name string) (*big.Int, tls.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p.serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: name},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath := p.write(t, name+".pem", "CERTIFICATE", der)
	keyPath := p.write(t, name+"-key.pem", "EC PRIVATE KEY", keyDER)
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		t.Fatal(err)
	}
	return big.NewInt(p.serial), pair
}

// revoke writes a revocation list naming serials.
func (p *testPKI) revoke(t *testing.T, serials ...*big.Int) string {
	t.Helper()
	var entries []x509.RevocationListEntry
	for _, s := range serials {
		entries = append(entries, x509.RevocationListEntry{SerialNumber: s, RevocationTime: time.Now()})
	}
	der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{Number: big.NewInt(time.Now().UnixNano()),
		RevokedCertificateEntries: entries, ThisUpdate: time.Now(), NextUpdate: time.Now().Add(time.Hour)}, p.ca, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	return p.write(t, "crl.pem", "X509 CRL", der)
}

// handshake has a client presenting cert connect to a server with cfg and
// returns the server's handshake error.
func handshake(t *testing.T, cfg *tls.Config, pool *x509.CertPool, cert tls.Certificate) error {
	t.Helper()
	serverConn, clientConn := net.Pipe()
	defer serverConn.Close()
	defer clientConn.Close()
	client := tls.Client(clientConn, &tls.Config{RootCAs: pool, ServerName: "localhost", Certificates: []tls.Certificate{cert}})
	go func() {
		_ = client.Handshake()
		// TLS 1.3 reports a refused client certificate on the first read.
		_, _ = client.Read(make([]byte, 1))
		clientConn.Close()
	}()
	server := tls.Server(serverConn, cfg)
	return server.Handshake()
}

// TestClientCRL: --client-crl-file refuses a client whose certificate the
// list names, with etcd's words, lets the others in, and applies a list
// rewritten after start without a restart; an unreadable list is refused
// when the configuration is built.
func TestClientCRL(t *testing.T) {
	p := newTestPKI(t)
	_, _ = p.issue(t, "server")
	revokedSerial, revoked := p.issue(t, "revoked")
	laterSerial, later := p.issue(t, "later")
	_, good := p.issue(t, "good")
	info := Info{CertFile: filepath.Join(p.dir, "server.pem"), KeyFile: filepath.Join(p.dir, "server-key.pem"),
		TrustedCAFile: filepath.Join(p.dir, "ca.pem"), ClientCertAuth: true, CRLFile: p.revoke(t, revokedSerial)}
	cfg, err := info.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(p.ca)
	if err := handshake(t, cfg, pool, revoked); !errors.Is(err, errRevoked) {
		t.Errorf("revoked client: handshake %v, want %v", err, errRevoked)
	}
	for name, cert := range map[string]tls.Certificate{"good": good, "later": later} {
		if err := handshake(t, cfg, pool, cert); err != nil {
			t.Errorf("%s client: %v", name, err)
		}
	}
	p.revoke(t, revokedSerial, laterSerial)
	if err := handshake(t, cfg, pool, later); !errors.Is(err, errRevoked) {
		t.Errorf("client revoked after start: handshake %v, want %v", err, errRevoked)
	}

	for name, path := range map[string]string{"missing": filepath.Join(p.dir, "nope.pem"), "not a list": info.CertFile} {
		bad := info
		bad.CRLFile = path
		if _, err := bad.ServerConfig(); err == nil || !strings.Contains(err.Error(), "revocation list") {
			t.Errorf("%s CRL file: ServerConfig error %v, want one about the revocation list", name, err)
		}
	}
}
