package server

import (
	"fmt"
	"net"
	"net/http"
	"slices"

	"go.uber.org/zap"
)

// AccessControl is etcd's --cors and --host-whitelist on the HTTP side of
// the client URLs (not the metrics URLs, as in etcd):
//
//   - a request over plain HTTP whose Host header names a host outside
//     HostWhitelist is refused with 421 Misdirected Request and etcd's
//     explanation, against DNS rebinding (CVE-2018-5702); over TLS every
//     host is served;
//   - every answer carries CORS headers for the request's Origin when
//     CORS allows it (for "*" when CORS allows every origin), and an
//     OPTIONS request (a browser's preflight) is answered 200 at once.
//
// An empty list, or one holding "*", allows everything: etcd's default.
type AccessControl struct {
	CORS          []string
	HostWhitelist []string
}

// allows reports whether list admits v: empty and "*" admit everything.
func allows(list []string, v string) bool {
	return len(list) == 0 || slices.Contains(list, "*") || slices.Contains(list, v)
}

// Wrap returns h behind the access control.
func (a AccessControl) Wrap(h http.Handler, logger *zap.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil {
			host := r.Host
			if hostOnly, _, err := net.SplitHostPort(r.Host); err == nil {
				host = hostOnly
			}
			if !allows(a.HostWhitelist, host) {
				logger.Warn("rejecting HTTP request to prevent DNS rebinding attacks", zap.String("host", host))
				http.Error(w, hostRefusal(host), http.StatusMisdirectedRequest)
				return
			}
		}
		if allows(a.CORS, "*") { // every origin
			addCORSHeaders(w, "*")
		} else if origin := r.Header.Get("Origin"); allows(a.CORS, origin) {
			addCORSHeaders(w, origin)
		}
		if r.Method == http.MethodOptions {
			w.WriteHeader(http.StatusOK)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// addCORSHeaders allows origin the methods and headers etcd allows.
func addCORSHeaders(w http.ResponseWriter, origin string) {
	w.Header().Add("Access-Control-Allow-Methods", "POST, GET, OPTIONS, PUT, DELETE")
	w.Header().Add("Access-Control-Allow-Origin", origin)
	w.Header().Add("Access-Control-Allow-Headers", "accept, content-type, authorization")
}

// hostRefusal is etcd's answer to a request for a host outside
// --host-whitelist.
func hostRefusal(host string) string {
	return fmt.Sprintf(`
etcd received your request, but the Host header was unrecognized.

To fix this, choose one of the following options:
- Enable TLS, then any HTTPS request will be allowed.
- Add the hostname you want to use to the whitelist in settings.
  - e.g. etcd --host-whitelist %q

This requirement has been added to help prevent "DNS Rebinding" attacks (CVE-2018-5702).
`, host)
}
