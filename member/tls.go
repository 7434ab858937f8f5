package member

import (
	"crypto/tls"
	"fmt"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/strata-kv/strata/tlsconfig"
)

// peerOptions returns the peer gRPC server's credentials and the TLS
// configuration the transport dials peers with (nil: plaintext).
func (m *Member) peerOptions() ([]grpc.ServerOption, *tls.Config, error) {
	opts, err := tlsconfig.ServerCreds("--listen-peer-urls", m.cfg.ListenPeerURLs, m.cfg.TLS.Peer)
	if err != nil {
		return nil, nil, err
	}
	secure, err := tlsconfig.URLsSecure("--initial-advertise-peer-urls", m.cfg.AdvertisePeerURLs)
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
