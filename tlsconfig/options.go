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
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"go.uber.org/zap"
)

// ParseVersion reads --tls-min-version or --tls-max-version: "" (Go's
// choice, 0), "TLS1.2" or "TLS1.3". The error is etcd's.
func ParseVersion(v string) (uint16, error) {
	switch v {
	case "":
		return 0, nil
	case "TLS1.2":
		return tls.VersionTLS12, nil
	case "TLS1.3":
		return tls.VersionTLS13, nil
	}
	return 0, fmt.Errorf("unexpected TLS version %q (must be one of: TLS1.2, TLS1.3)", v)
}

// CheckVersions applies etcd's rules to the TLS flags together: the
// minimum not above the maximum, and no cipher suites when only TLS 1.3 is
// allowed (Go does not let TLS 1.3's be chosen). The errors are etcd's.
func CheckVersions(minName, maxName string, min, max uint16, suites []uint16) error {
	if max != 0 && min > max {
		return fmt.Errorf("min version (%s) is greater than max version (%s)", minName, maxName)
	}
	if min == tls.VersionTLS13 && len(suites) > 0 {
		return errors.New("cipher suites cannot be configured when only TLS1.3 is enabled")
	}
	return nil
}

// ParseCipherSuites reads --cipher-suites: Go's (and IANA's) names, such as
// TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, the insecure ones included as
// etcd accepts them. The error is etcd's.
func ParseCipherSuites(names []string) ([]uint16, error) {
	known := map[string]uint16{}
	for _, c := range slices.Concat(tls.CipherSuites(), tls.InsecureCipherSuites()) {
		known[c.Name] = c.ID
	}
	var out []uint16
	for _, n := range names {
		id, ok := known[n]
		if !ok {
			return nil, fmt.Errorf("unexpected TLS cipher suite %q", n)
		}
		out = append(out, id)
	}
	return out, nil
}

// bound sets the versions and cipher suites on cfg; TLS 1.2 is the floor.
func (t Info) bound(cfg *tls.Config) {
	cfg.MinVersion = max(t.MinVersion, tls.VersionTLS12)
	cfg.MaxVersion = t.MaxVersion
	cfg.CipherSuites = t.CipherSuites
}

// allowedCheck returns the check of AllowedCNs or AllowedHostnames on the
// verified chains of a connecting party, nil if neither is set. As in etcd,
// a party passes if the leaf of any verified chain has an allowed common
// name or is valid for an allowed host name; without verified chains
// (no client certificate authentication) nobody passes.
func (t Info) allowedCheck() (func(chains [][]*x509.Certificate) error, error) {
	if len(t.AllowedCNs) > 0 && len(t.AllowedHostnames) > 0 {
		return nil, fmt.Errorf("AllowedCNs and AllowedHostnames are mutually exclusive (cns=%q, hostnames=%q)", t.AllowedCNs, t.AllowedHostnames)
	}
	if len(t.AllowedCNs) == 0 && len(t.AllowedHostnames) == 0 {
		return nil, nil
	}
	cns, hosts := t.AllowedCNs, t.AllowedHostnames
	return func(chains [][]*x509.Certificate) error {
		for _, chain := range chains {
			if len(chain) == 0 {
				continue
			}
			leaf := chain[0]
			if slices.Contains(cns, leaf.Subject.CommonName) {
				return nil
			}
			for _, h := range hosts {
				if leaf.VerifyHostname(h) == nil {
					return nil
				}
			}
		}
		return errors.New("client certificate authentication failed")
	}, nil
}

// SelfCert is --auto-tls and --peer-auto-tls: it returns the Info of a
// self-signed certificate and key in dir (cert.pem, key.pem), generated
// there on first use with the host of each of listenURLs' hosts
// ("host:port") as its IP or DNS names and valid for validityYears
// (--self-signed-cert-validity); on later starts the files already there
// are used, as etcd does. peer adds the client-auth usage, since a member
// presents its peer certificate when it dials.
func SelfCert(dir string, hosts []string, validityYears uint, peer bool, logger *zap.Logger) (Info, error) {
	if validityYears == 0 {
		return Info{}, errors.New("selfSignedCertValidity is invalid,it should be greater than 0")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Info{}, fmt.Errorf("cannot create cert directory: %w", err)
	}
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	info := Info{CertFile: certPath, KeyFile: keyPath, SelfSigned: true}
	_, certErr := os.Stat(certPath)
	_, keyErr := os.Stat(keyPath)
	if certErr == nil && keyErr == nil {
		return info, nil
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return Info{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"etcd"}},
		NotBefore:             now,
		NotAfter:              now.Add(time.Duration(validityYears) * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageKeyEncipherment | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	if peer {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	for _, hp := range hosts {
		h, _, err := net.SplitHostPort(hp)
		if err != nil {
			h = hp
		}
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	logger.Warn("automatically generate certificates", zap.Time("certificate-validity-bound-not-after", tmpl.NotAfter))
	key, err := ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	if err != nil {
		return Info{}, fmt.Errorf("cannot generate ECDSA key: %w", err)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return Info{}, fmt.Errorf("cannot generate x509 certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Info{}, err
	}
	// Each file appears whole (written aside, then renamed), the
	// certificate last: a start that finds both finds a complete pair.
	if err := writeFileSynced(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return Info{}, err
	}
	if err := writeFileSynced(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return Info{}, err
	}
	logger.Info("created cert file", zap.String("path", certPath))
	logger.Info("created key file", zap.String("path", keyPath))
	return info, nil
}

// writeFileSynced writes data to path whole: into a temporary file, synced,
// then renamed over path.
func writeFileSynced(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Validate refuses settings etcd refuses before any connection: both
// AllowedCNs and AllowedHostnames set.
func (t Info) Validate() error {
	_, err := t.allowedCheck()
	return err
}
