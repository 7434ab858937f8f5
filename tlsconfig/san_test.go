package tlsconfig

import (
	"context"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"testing"
)

// fakeResolver answers reverse and forward lookups from maps.
type fakeResolver struct {
	reverse map[string][]string
	forward map[string][]string
}

func (f fakeResolver) LookupAddr(_ context.Context, addr string) ([]string, error) {
	if names, ok := f.reverse[addr]; ok {
		return names, nil
	}
	return nil, errors.New("no PTR record")
}

func (f fakeResolver) LookupHost(_ context.Context, host string) ([]string, error) {
	if addrs, ok := f.forward[host]; ok {
		return addrs, nil
	}
	return nil, errors.New("no such host")
}

// TestCheckSAN: etcd's check of a connecting peer's certificate against
// the address it connects from (--peer-skip-client-san-verification off).
func TestCheckSAN(t *testing.T) {
	r := fakeResolver{
		reverse: map[string][]string{"10.0.0.2": {"m2.example.com."}, "10.0.0.3": {"m3.pods.example.com."}},
		forward: map[string][]string{"m4.example.com": {"10.0.0.4"}},
	}
	for _, tc := range []struct {
		name    string
		cert    *x509.Certificate
		remote  string
		wantErr string
	}{
		{name: "no SAN", cert: &x509.Certificate{}, remote: "10.9.9.9:1"},
		{name: "IP matches", cert: &x509.Certificate{IPAddresses: []net.IP{net.ParseIP("10.0.0.1")}}, remote: "10.0.0.1:40000"},
		{name: "IP differs", cert: &x509.Certificate{IPAddresses: []net.IP{net.ParseIP("10.0.0.1")}}, remote: "10.0.0.9:40000", wantErr: "10.0.0.9"},
		{name: "IP differs, DNS reverse matches", cert: &x509.Certificate{IPAddresses: []net.IP{net.ParseIP("10.0.0.1")}, DNSNames: []string{"m2.example.com"}}, remote: "10.0.0.2:1"},
		{name: "wildcard covers the reverse name", cert: &x509.Certificate{DNSNames: []string{"*.pods.example.com"}}, remote: "10.0.0.3:1"},
		{name: "DNS forward matches", cert: &x509.Certificate{DNSNames: []string{"m4.example.com"}}, remote: "10.0.0.4:1"},
		{name: "DNS matches nothing", cert: &x509.Certificate{DNSNames: []string{"m5.example.com"}}, remote: "10.0.0.5:1",
			wantErr: `tls: "10.0.0.5" does not match any of DNSNames ["m5.example.com"] (no such host)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkSAN(context.Background(), tc.cert, tc.remote, r)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
		})
	}
}
