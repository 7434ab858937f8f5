package member

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// TLSInfo is one side's TLS material, in etcd's flag terms: --cert-file,
// --key-file, --trusted-ca-file, --client-cert-auth (or their --peer-*
// twins).
type TLSInfo struct {
	CertFile      string
	KeyFile       string
	TrustedCAFile string
	// ClientCertAuth requires every connecting party to present a
	// certificate signed by TrustedCAFile; on the client side, the
	// certificate's common name is then the user when auth is on.
	ClientCertAuth bool
}

// TLSConfig secures the client and peer URLs. An https:// URL needs the
// side's certificate and key; an empty TLSInfo serves plaintext.
type TLSConfig struct {
	Client TLSInfo
	Peer   TLSInfo
}

// Empty reports whether no certificate is configured.
func (t TLSInfo) Empty() bool { return t.CertFile == "" && t.KeyFile == "" }

func (t TLSInfo) pool() (*x509.CertPool, error) {
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
func (t TLSInfo) ServerConfig() (*tls.Config, error) {
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
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, ClientCAs: pool}
	if t.ClientCertAuth {
		if pool == nil {
			return nil, errors.New("client certificate authentication needs a trusted CA file")
		}
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// ClientConfig returns the configuration for dialing the other side: the
// certificate to present (peers authenticate each other with it) and the
// CA to trust (the system's if none).
func (t TLSInfo) ClientConfig() (*tls.Config, error) {
	pool, err := t.pool()
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if !t.Empty() {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("load key pair %s, %s: %w", t.CertFile, t.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// urlsTLS reports whether the URLs are https (all of them) or http (all of
// them): one gRPC server serves them, with or without TLS.
func urlsTLS(flag string, urls []string) (bool, error) {
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

// serverCreds returns the gRPC server option for a side whose listen URLs
// are urls, or nil for plaintext.
func serverCreds(flag string, urls []string, info TLSInfo) ([]grpc.ServerOption, error) {
	secure, err := urlsTLS(flag, urls)
	if err != nil || !secure {
		return nil, err
	}
	cfg, err := info.ServerConfig()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(cfg))}, nil
}

// peerOptions returns the peer gRPC server's credentials and the TLS
// configuration the transport dials peers with (nil: plaintext).
func (m *Member) peerOptions() ([]grpc.ServerOption, *tls.Config, error) {
	opts, err := serverCreds("--listen-peer-urls", m.cfg.ListenPeerURLs, m.cfg.TLS.Peer)
	if err != nil {
		return nil, nil, err
	}
	secure, err := urlsTLS("--initial-advertise-peer-urls", m.cfg.AdvertisePeerURLs)
	if err != nil {
		return nil, nil, err
	}
	if !secure && opts == nil {
		return nil, nil, nil
	}
	cfg, err := m.cfg.TLS.Peer.ClientConfig()
	if err != nil {
		return nil, nil, fmt.Errorf("peer TLS: %w", err)
	}
	return opts, cfg, nil
}

// dialCreds returns the credentials for dialing rawURL, a client or peer
// URL of another member: TLS with info's certificate and CA for https,
// plaintext otherwise. A TLS configuration that cannot be loaded was
// already refused at start-up (ServerConfig, peerOptions); should the
// files change underneath, the dial fails its handshake and says why.
func (m *Member) dialCreds(rawURL string, info TLSInfo) credentials.TransportCredentials {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "https" {
		return insecure.NewCredentials()
	}
	cfg, err := info.ClientConfig()
	if err != nil {
		m.logger.Warn("cannot load TLS configuration to dial a member", zap.String("url", rawURL), zap.Error(err))
		cfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return credentials.NewTLS(cfg)
}

// forwardTLS is the TLS configuration for forwarding requests to the
// leader's https client URL: this member's client-side certificate, the
// client CA. nil when the member has no client TLS material (the leader's
// URL is then plaintext, or the forward fails its handshake and says why).
func (m *Member) forwardTLS() *tls.Config {
	info := m.cfg.TLS.Client
	if info.Empty() && info.TrustedCAFile == "" {
		return nil
	}
	cfg, err := info.ClientConfig()
	if err != nil {
		m.logger.Warn("cannot load client TLS configuration for forwarding", zap.Error(err))
		return nil
	}
	return cfg
}
