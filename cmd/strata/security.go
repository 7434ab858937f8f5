package main

import (
	"flag"
	"time"

	"github.com/strata-kv/strata/auth"
	"github.com/strata-kv/strata/member"
	"github.com/strata-kv/strata/tlsconfig"
)

// securityFlags are etcd's TLS and auth flags.
type securityFlags struct {
	certFile, keyFile, trustedCAFile             string
	clientCertAuth                               bool
	clientCRLFile, peerCRLFile                   string
	peerCertFile, peerKeyFile, peerTrustedCAFile string
	peerClientCertAuth                           bool
	authToken                                    string
	authTokenTTL                                 uint
	bcryptCost                                   uint
}

func (s *securityFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.certFile, "cert-file", "", "Path to the client server TLS cert file.")
	fs.StringVar(&s.keyFile, "key-file", "", "Path to the client server TLS key file.")
	fs.StringVar(&s.trustedCAFile, "trusted-ca-file", "", "Path to the client server TLS trusted CA cert file.")
	fs.BoolVar(&s.clientCertAuth, "client-cert-auth", false, "Enable client cert authentication.")
	fs.StringVar(&s.peerCertFile, "peer-cert-file", "", "Path to the peer server TLS cert file.")
	fs.StringVar(&s.peerKeyFile, "peer-key-file", "", "Path to the peer server TLS key file.")
	fs.StringVar(&s.peerTrustedCAFile, "peer-trusted-ca-file", "", "Path to the peer server TLS trusted CA file.")
	fs.BoolVar(&s.peerClientCertAuth, "peer-client-cert-auth", false, "Enable peer client cert authentication.")
	fs.StringVar(&s.clientCRLFile, "client-crl-file", "", "Path to the client certificate revocation list file.")
	fs.StringVar(&s.peerCRLFile, "peer-crl-file", "", "Path to the peer certificate revocation list file.")
	fs.StringVar(&s.authToken, "auth-token", "simple", "Specify auth token specific options (simple, or jwt,pub-key=...,priv-key=...,sign-method=...,ttl=...).")
	fs.UintVar(&s.authTokenTTL, "auth-token-ttl", 300, "The lifetime in seconds of the auth token.")
	fs.UintVar(&s.bcryptCost, "bcrypt-cost", 10, "Specify bcrypt algorithm cost factor for auth password hashing.")
}

func (s *securityFlags) apply(cfg *member.Config) {
	cfg.TLS = tlsconfig.Config{
		Client: tlsconfig.Info{CertFile: s.certFile, KeyFile: s.keyFile, TrustedCAFile: s.trustedCAFile, ClientCertAuth: s.clientCertAuth,
			CRLFile: s.clientCRLFile},
		Peer: tlsconfig.Info{CertFile: s.peerCertFile, KeyFile: s.peerKeyFile, TrustedCAFile: s.peerTrustedCAFile, ClientCertAuth: s.peerClientCertAuth,
			CRLFile: s.peerCRLFile},
	}
	cfg.Auth = auth.Flags{
		Token:      s.authToken,
		TokenTTL:   time.Duration(s.authTokenTTL) * time.Second,
		BcryptCost: int(s.bcryptCost),
	}
}
