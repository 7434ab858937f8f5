package tlsconfig

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/credentials"
)

// sanChecked is the peer listener's credentials unless
// --peer-skip-client-san-verification: after the handshake, the
// certificate a connecting peer presented must name the address it
// connects from (checkSAN), as etcd's peer listener requires.
type sanChecked struct {
	credentials.TransportCredentials
}

// ServerHandshake implements credentials.TransportCredentials.
func (s sanChecked) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, auth, err := s.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return conn, auth, err
	}
	if info, ok := auth.(credentials.TLSInfo); ok && len(info.State.PeerCertificates) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := checkSAN(ctx, info.State.PeerCertificates[0], raw.RemoteAddr().String(), net.DefaultResolver); err != nil {
			conn.Close()
			return nil, nil, err
		}
	}
	return conn, auth, nil
}

// Clone implements credentials.TransportCredentials.
func (s sanChecked) Clone() credentials.TransportCredentials {
	return sanChecked{s.TransportCredentials.Clone()}
}

// resolver is the part of net.Resolver checkSAN uses.
type resolver interface {
	LookupAddr(ctx context.Context, addr string) ([]string, error)
	LookupHost(ctx context.Context, host string) ([]string, error)
}

// checkSAN is etcd's rule for a peer's certificate and the address
// (host:port) it connects from: a certificate naming no IP and no DNS name
// passes; else one of its IPs must be the address, or one of its DNS names
// must be the address's reverse name (a wildcard covering it) or resolve
// to the address.
func checkSAN(ctx context.Context, cert *x509.Certificate, remote string, r resolver) error {
	if len(cert.IPAddresses) == 0 && len(cert.DNSNames) == 0 {
		return nil
	}
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return err
	}
	if len(cert.IPAddresses) > 0 {
		err := cert.VerifyHostname(host)
		if err == nil {
			return nil
		}
		if len(cert.DNSNames) == 0 {
			return err
		}
	}
	var names, wildcards []string
	for _, n := range cert.DNSNames {
		if suffix, ok := strings.CutPrefix(n, "*"); ok && strings.HasPrefix(suffix, ".") {
			wildcards = append(wildcards, suffix)
		} else {
			names = append(names, n)
		}
	}
	reverse, lookupErr := r.LookupAddr(ctx, host)
	for _, name := range reverse {
		name = strings.TrimSuffix(name, ".")
		if slices.Contains(names, name) || slices.ContainsFunc(wildcards, func(w string) bool { return strings.HasSuffix(name, w) }) {
			return nil
		}
	}
	for _, n := range names {
		addrs, err := r.LookupHost(ctx, n)
		if err != nil {
			lookupErr = err
			continue
		}
		if slices.Contains(addrs, host) {
			return nil
		}
	}
	suffix := ""
	if lookupErr != nil {
		suffix = " (" + lookupErr.Error() + ")"
	}
	return fmt.Errorf("tls: %q does not match any of DNSNames %q%s", host, cert.DNSNames, suffix)
}
