package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestTLSFlagParsing: etcd's accepted values and etcd's errors for
// --tls-min-version, --tls-max-version and --cipher-suites.
func TestTLSFlagParsing(t *testing.T) {
	for _, tc := range []struct {
		name           string
		min, max       string
		suites         []string
		wantErr        string
		wantMin        uint16
		wantSuiteCount int
	}{
		{name: "etcd's defaults", min: "TLS1.2", wantMin: tls.VersionTLS12},
		{name: "TLS 1.3 only", min: "TLS1.3", max: "TLS1.3", wantMin: tls.VersionTLS13},
		{name: "suites", min: "TLS1.2", suites: []string{"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "TLS_RSA_WITH_AES_128_CBC_SHA"}, wantMin: tls.VersionTLS12, wantSuiteCount: 2},
		{name: "TLS 1.1", min: "TLS1.1", wantErr: `unexpected TLS version "TLS1.1" (must be one of: TLS1.2, TLS1.3)`},
		{name: "bad max", min: "TLS1.2", max: "1.3", wantErr: `unexpected TLS version "1.3" (must be one of: TLS1.2, TLS1.3)`},
		{name: "min above max", min: "TLS1.3", max: "TLS1.2", wantErr: "min version (TLS1.3) is greater than max version (TLS1.2)"},
		{name: "unknown suite", min: "TLS1.2", suites: []string{"FOO"}, wantErr: `unexpected TLS cipher suite "FOO"`},
		{name: "suites with TLS 1.3 only", min: "TLS1.3", suites: []string{"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"}, wantErr: "cipher suites cannot be configured when only TLS1.3 is enabled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := func() error {
				min, err := ParseVersion(tc.min)
				if err != nil {
					return err
				}
				max, err := ParseVersion(tc.max)
				if err != nil {
					return err
				}
				suites, err := ParseCipherSuites(tc.suites)
				if err != nil {
					return err
				}
				if err := CheckVersions(tc.min, tc.max, min, max, suites); err != nil {
					return err
				}
				if min != tc.wantMin || len(suites) != tc.wantSuiteCount {
					t.Errorf("min %x, %d suites; want %x, %d", min, len(suites), tc.wantMin, tc.wantSuiteCount)
				}
				return nil
			}()
			if tc.wantErr == "" && err != nil {
				t.Fatalf("error %v", err)
			}
			if tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr) {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// TestAllowedCheck: --peer-cert-allowed-cn and --peer-cert-allowed-hostname
// as etcd applies them to a verified chain.
func TestAllowedCheck(t *testing.T) {
	leaf := &x509.Certificate{Subject: pkix.Name{CommonName: "member-1"}, DNSNames: []string{"m1.example.com"}}
	chains := [][]*x509.Certificate{{leaf}}
	for _, tc := range []struct {
		name      string
		info      Info
		chains    [][]*x509.Certificate
		wantErr   string
		wantNoChk bool
	}{
		{name: "neither", wantNoChk: true},
		{name: "CN allowed", info: Info{AllowedCNs: []string{"other", "member-1"}}, chains: chains},
		{name: "CN refused", info: Info{AllowedCNs: []string{"other"}}, chains: chains, wantErr: "client certificate authentication failed"},
		{name: "hostname allowed", info: Info{AllowedHostnames: []string{"m1.example.com"}}, chains: chains},
		{name: "hostname refused", info: Info{AllowedHostnames: []string{"m2.example.com"}}, chains: chains, wantErr: "client certificate authentication failed"},
		{name: "no verified chain", info: Info{AllowedCNs: []string{"member-1"}}, wantErr: "client certificate authentication failed"},
		{name: "both lists", info: Info{AllowedCNs: []string{"a"}, AllowedHostnames: []string{"b"}}, wantErr: "mutually exclusive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check, err := tc.info.allowedCheck()
			if err == nil && check == nil && !tc.wantNoChk {
				t.Fatal("no check")
			}
			if err == nil && check != nil {
				err = check(tc.chains)
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("error %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// TestSelfCert: --auto-tls generates a certificate for the listen hosts
// once and reuses it; the generated pair serves, and dialers skip
// verification of it, as etcd's do.
func TestSelfCert(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "fixtures", "peer")
	if _, err := SelfCert(dir, nil, 0, true, zap.NewNop()); err == nil {
		t.Fatal("validity 0 accepted")
	}
	info, err := SelfCert(dir, []string{"127.0.0.1:2380", "localhost:2380"}, 2, true, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(info.CertFile, info.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if cert.VerifyHostname("127.0.0.1") != nil || cert.VerifyHostname("localhost") != nil {
		t.Errorf("certificate names %v %v, want 127.0.0.1 and localhost", cert.IPAddresses, cert.DNSNames)
	}
	if years := cert.NotAfter.Sub(cert.NotBefore).Hours() / 24 / 365; years < 1.99 || years > 2.01 {
		t.Errorf("valid for %.2f years, want 2", years)
	}
	before, _ := os.ReadFile(info.CertFile)
	again, err := SelfCert(dir, []string{"127.0.0.1:2380"}, 1, true, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(again.CertFile); string(after) != string(before) {
		t.Error("a second start generated a new certificate instead of using the one there")
	}
	if _, err := info.ServerConfig(); err != nil {
		t.Fatal(err)
	}
	cc, err := info.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	if !cc.InsecureSkipVerify || len(cc.Certificates) != 1 {
		t.Errorf("dial config: skip verify %v, %d certificates; want true, 1", cc.InsecureSkipVerify, len(cc.Certificates))
	}
}

// TestClientCertFile: --client-cert-file and --client-key-file are what a
// member presents when it dials; the versions and suites reach both sides.
func TestClientCertFile(t *testing.T) {
	dir := t.TempDir()
	server, err := SelfCert(filepath.Join(dir, "server"), []string{"127.0.0.1:1"}, 1, false, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	client, err := SelfCert(filepath.Join(dir, "client"), []string{"127.0.0.1:1"}, 1, true, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	info := Info{CertFile: server.CertFile, KeyFile: server.KeyFile, ClientCertFile: client.CertFile, ClientKeyFile: client.KeyFile,
		MinVersion: tls.VersionTLS13, MaxVersion: tls.VersionTLS13}
	cc, err := info.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := tls.LoadX509KeyPair(client.CertFile, client.KeyFile)
	if len(cc.Certificates) != 1 || string(cc.Certificates[0].Certificate[0]) != string(want.Certificate[0]) {
		t.Error("dialing does not present --client-cert-file")
	}
	sc, err := info.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	if sc.MinVersion != tls.VersionTLS13 || sc.MaxVersion != tls.VersionTLS13 || cc.MinVersion != tls.VersionTLS13 {
		t.Errorf("versions: server %x-%x, client %x; want TLS 1.3", sc.MinVersion, sc.MaxVersion, cc.MinVersion)
	}
}
