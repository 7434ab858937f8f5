package member

import (
	"fmt"
	"time"

	"google.golang.org/grpc"

	"github.com/strata-kv/strata/auth"
	"github.com/strata-kv/strata/server"
	"github.com/strata-kv/strata/tlsconfig"
)

// AuthConfig is etcd's auth flags.
type AuthConfig struct {
	// Token is --auth-token: "simple" (default) or
	// "jwt,pub-key=PATH,priv-key=PATH,sign-method=RS256[,ttl=5m]".
	Token string
	// TokenTTL is --auth-token-ttl for simple tokens (0: 300 s).
	TokenTTL time.Duration
	// BcryptCost is --bcrypt-cost (0: bcrypt's default, 10).
	BcryptCost int
}

// openAuth builds the auth store from the engine, for the applier.
func (m *Member) openAuth() (*auth.Store, error) {
	tokens, err := auth.ParseTokenOptions(m.cfg.Auth.Token, m.cfg.Auth.TokenTTL)
	if err != nil {
		return nil, err
	}
	if m.cfg.Auth.BcryptCost != 0 {
		if err := auth.ValidateBcryptCost(m.cfg.Auth.BcryptCost); err != nil {
			return nil, fmt.Errorf("--bcrypt-cost: %w", err)
		}
	}
	s := auth.New(auth.Options{
		BcryptCost: m.cfg.Auth.BcryptCost, Tokens: tokens, Logger: m.logger.Named("auth"),
	})
	if err := s.Load(m.engine); err != nil {
		return nil, err
	}
	return s, nil
}

// startSecurity prepares the client gRPC server's options (TLS
// credentials, auth interceptors) and the Auth service.
func (m *Member) startSecurity(limits server.Limits) ([]grpc.ServerOption, error) {
	opts, err := tlsconfig.ServerCreds("--listen-client-urls", m.cfg.ListenClientURLs, m.cfg.TLS.Client)
	if err != nil {
		return nil, err
	}
	m.authService = server.NewAuth(m, m.authStore, limits, m.cfg.TLS.Client.ClientCertAuth)
	return append(opts, m.authService.ServerOptions()...), nil
}
