// Package tlsconfig turns etcd's TLS flags (--cert-file, --key-file,
// --client-cert-file, --client-key-file, --trusted-ca-file,
// --client-cert-auth, --client-crl-file, --client-cert-allowed-hostname and
// their --peer-* twins, --peer-cert-allowed-cn, --cipher-suites,
// --tls-min-version, --tls-max-version, and the self-signed certificates of
// --auto-tls and --peer-auto-tls) into the TLS configurations strata's
// listeners serve with and its dialers (peers, the leader's client URL)
// connect with. TLS 1.2 is the minimum unless --tls-min-version says
// TLS1.3, as in etcd.
package tlsconfig

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"os"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Info is one side's TLS material, in etcd's flag terms: --cert-file,
// --key-file, --trusted-ca-file, --client-cert-auth (or their --peer-*
// twins).
type Info struct {
	CertFile      string
	KeyFile       string
	TrustedCAFile string
	// ClientCertAuth requires every connecting party to present a
	// certificate signed by TrustedCAFile; on the client side, the
	// certificate's common name is then the user when auth is on.
	ClientCertAuth bool
	// CRLFile (--client-crl-file, --peer-crl-file) is a certificate
	// revocation list: a connecting party whose certificate, or any
	// certificate of its chain, it lists is refused. The file is read at
	// every handshake, as etcd reads it, so a new list applies without a
	// restart.
	CRLFile string
	// ClientCertFile and ClientKeyFile (--client-cert-file,
	// --peer-client-cert-file and their keys) are the certificate this
	// member presents when it dials the other side; CertFile and KeyFile
	// if empty, as in etcd.
	ClientCertFile string
	ClientKeyFile  string
	// AllowedCNs and AllowedHostnames (--peer-cert-allowed-cn,
	// --peer-cert-allowed-hostname, --client-cert-allowed-hostname) narrow
	// client certificate authentication: a verified certificate must carry
	// one of the common names, or be valid for one of the host names
	// (etcd's rule; at most one of the two lists may be set). As in etcd,
	// the lists apply both ways: a member with a certificate that dials
	// the other side requires the same of the certificate it is served.
	AllowedCNs       []string
	AllowedHostnames []string
	// CipherSuites, MinVersion and MaxVersion (--cipher-suites,
	// --tls-min-version, --tls-max-version; ParseCipherSuites,
	// ParseVersion) bound the handshakes served and dialed. Empty or 0:
	// Go's choice, with TLS 1.2 the floor.
	CipherSuites []uint16
	MinVersion   uint16
	MaxVersion   uint16
	// SkipClientSANVerify (--peer-skip-client-san-verification) turns off
	// the peer listener's check that a connecting peer's certificate names
	// the address it connects from (PeerServing), as in etcd.
	SkipClientSANVerify bool
	// SelfSigned marks a certificate SelfCert generated (--auto-tls,
	// --peer-auto-tls): nobody can verify it, so this member does not
	// verify the other side's either when it dials, as etcd does.
	SelfSigned bool
}

// Config secures the client and peer URLs. An https:// URL needs the
// side's certificate and key; an empty Info serves plaintext.
type Config struct {
	Client Info
	Peer   Info
}

// Empty reports whether no certificate is configured.
func (t Info) Empty() bool { return t.CertFile == "" && t.KeyFile == "" }

func (t Info) pool() (*x509.CertPool, error) {
	if t.TrustedCAFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(t.TrustedCAFile)
	if err != nil {
		return nil, fmt.Errorf("read trusted CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("trusted CA file %s holds no PEM certificate", t.TrustedCAFile)
	}
	return pool, nil
}

// ServerConfig returns the configuration a listener serves with.
func (t Info) ServerConfig() (*tls.Config, error) {
	if t.CertFile == "" || t.KeyFile == "" {
		return nil, errors.New("TLS needs both a certificate file and a key file")
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("load key pair %s, %s: %w", t.CertFile, t.KeyFile, err)
	}
	pool, err := t.pool()
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool}
	t.bound(cfg)
	if t.ClientCertAuth {
		if pool == nil {
			return nil, errors.New("client certificate authentication needs a trusted CA file")
		}
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	if t.CRLFile != "" {
		// A list that cannot be read now is a configuration error, not
		// a reason to refuse every connection later.
		if _, err := readCRL(t.CRLFile); err != nil {
			return nil, err
		}
	}
	allowed, err := t.allowedCheck()
	if err != nil {
		return nil, err
	}
	if t.CRLFile != "" || allowed != nil {
		crlFile := t.CRLFile
		cfg.VerifyPeerCertificate = func(raw [][]byte, chains [][]*x509.Certificate) error {
			if crlFile != "" {
				if err := checkRevoked(crlFile, raw); err != nil {
					return err
				}
			}
			if allowed != nil {
				return allowed(chains)
			}
			return nil
		}
	}
	return cfg, nil
}

// errRevoked is etcd's answer to a revoked certificate.
var errRevoked = errors.New("transport: certificate revoked")

// readCRL reads and parses a revocation list, PEM or DER.
func readCRL(path string) (*x509.RevocationList, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read certificate revocation list: %w", err)
	}
	if block, _ := pem.Decode(data); block != nil {
		data = block.Bytes
	}
	crl, err := x509.ParseRevocationList(data)
	if err != nil {
		return nil, fmt.Errorf("parse certificate revocation list %s: %w", path, err)
	}
	return crl, nil
}

// checkRevoked refuses a peer whose certificates (raw, as presented) the
// list at crlFile names, by issuer and serial number.
func checkRevoked(crlFile string, raw [][]byte) error {
	crl, err := readCRL(crlFile)
	if err != nil {
		return err
	}
	for _, der := range raw {
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			return fmt.Errorf("parse peer certificate: %w", err)
		}
		if !bytes.Equal(cert.RawIssuer, crl.RawIssuer) {
			continue
		}
		for _, r := range crl.RevokedCertificateEntries {
			if r.SerialNumber.Cmp(cert.SerialNumber) == 0 {
				return errRevoked
			}
		}
	}
	return nil
}

// ClientConfig returns the configuration for dialing the other side: the
// certificate to present (peers authenticate each other with it) and the
// CA to trust (the system's if none).
func (t Info) ClientConfig() (*tls.Config, error) {
	pool, err := t.pool()
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{RootCAs: pool, InsecureSkipVerify: t.SelfSigned}
	t.bound(cfg)
	certFile, keyFile := t.CertFile, t.KeyFile
	if t.ClientCertFile != "" || t.ClientKeyFile != "" {
		certFile, keyFile = t.ClientCertFile, t.ClientKeyFile
	}
	if certFile != "" || keyFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("load key pair %s, %s: %w", certFile, keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	if !t.Empty() {
		allowed, err := t.allowedCheck()
		if err != nil {
			return nil, err
		}
		if allowed != nil {
			cfg.VerifyPeerCertificate = func(_ [][]byte, chains [][]*x509.Certificate) error { return allowed(chains) }
		}
	}
	return cfg, nil
}

// URLsSecure reports whether the URLs are https (all of them) or http (all of
// them): one gRPC server serves them, with or without TLS.
func URLsSecure(flag string, urls []string) (bool, error) {
	https, http := 0, 0
	for _, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil {
			return false, fmt.Errorf("%s: invalid URL %q: %w", flag, raw, err)
		}
		switch u.Scheme {
		case "https", "unixs":
			https++
		default:
			http++
		}
	}
	if https > 0 && http > 0 {
		return false, fmt.Errorf("%s: mixing http and https URLs is not supported", flag)
	}
	return https > 0, nil
}

// ServerCreds returns the gRPC server option for a side whose listen URLs
// are urls, or nil for plaintext.
func ServerCreds(flag string, urls []string, info Info) ([]grpc.ServerOption, error) {
	secure, err := URLsSecure(flag, urls)
	if err != nil || !secure {
		return nil, err
	}
	cfg, err := info.ServerConfig()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(cfg))}, nil
}

// DialCreds returns the credentials for dialing rawURL, a client or peer
// URL of another member: TLS with t's certificate and CA for https,
// plaintext otherwise. A TLS configuration that cannot be loaded was
// already refused at start-up (ServerConfig, peerOptions); should the
// files change underneath, the dial fails its handshake and says why.
func (t Info) DialCreds(rawURL string, logger *zap.Logger) credentials.TransportCredentials {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "https" {
		return insecure.NewCredentials()
	}
	cfg, err := t.ClientConfig()
	if err != nil {
		logger.Warn("cannot load TLS configuration to dial a member", zap.String("url", rawURL), zap.Error(err))
		cfg = &tls.Config{}
		t.bound(cfg)
	}
	return credentials.NewTLS(cfg)
}

// PeerServing returns the peer gRPC server's credentials (from
// --listen-peer-urls and the peer TLS files) and the TLS configuration the
// transport dials peers with: nil, plaintext, when neither the listen nor
// the advertised peer URLs are https.
func (c Config) PeerServing(listenPeerURLs, advertisePeerURLs []string) ([]grpc.ServerOption, *tls.Config, error) {
	var opts []grpc.ServerOption
	listenSecure, err := URLsSecure("--listen-peer-urls", listenPeerURLs)
	if err != nil {
		return nil, nil, err
	}
	if listenSecure {
		cfg, err := c.Peer.ServerConfig()
		if err != nil {
			return nil, nil, fmt.Errorf("--listen-peer-urls: %w", err)
		}
		creds := credentials.NewTLS(cfg)
		if !c.Peer.SkipClientSANVerify {
			creds = sanChecked{creds}
		}
		opts = []grpc.ServerOption{grpc.Creds(creds)}
	}
	secure, err := URLsSecure("--initial-advertise-peer-urls", advertisePeerURLs)
	if err != nil {
		return nil, nil, err
	}
	if !secure && opts == nil {
		return nil, nil, nil
	}
	cfg, err := c.Peer.ClientConfig()
	if err != nil {
		return nil, nil, fmt.Errorf("peer TLS: %w", err)
	}
	return opts, cfg, nil
}

// ForwardConfig is the TLS configuration for forwarding requests to the
// leader's https client URL: this member's client-side certificate, the
// client CA. nil when the member has no client TLS material (the leader's
// URL is then plaintext, or the forward fails its handshake and says why).
func (t Info) ForwardConfig(logger *zap.Logger) *tls.Config {
	if t.Empty() && t.TrustedCAFile == "" && t.ClientCertFile == "" {
		return nil
	}
	cfg, err := t.ClientConfig()
	if err != nil {
		logger.Warn("cannot load client TLS configuration for forwarding", zap.Error(err))
		return nil
	}
	return cfg
}
