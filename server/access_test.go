package server

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestAccessControl: etcd's --host-whitelist and --cors on the client
// URLs' HTTP side.
func TestAccessControl(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("served")) })
	for _, tc := range []struct {
		name       string
		ac         AccessControl
		host       string
		tls        bool
		method     string
		origin     string
		wantCode   int
		wantOrigin string
		wantBody   string
	}{
		{name: "etcd's defaults", ac: AccessControl{CORS: []string{"*"}, HostWhitelist: []string{"*"}}, host: "evil.example:2379", wantCode: 200, wantOrigin: "*", wantBody: "served"},
		{name: "empty lists allow all", host: "evil.example", wantCode: 200, wantOrigin: "*", wantBody: "served"},
		{name: "host allowed", ac: AccessControl{HostWhitelist: []string{"etcd.example"}}, host: "etcd.example:2379", wantCode: 200, wantOrigin: "*", wantBody: "served"},
		{name: "host refused", ac: AccessControl{HostWhitelist: []string{"etcd.example"}}, host: "evil.example:2379", wantCode: http.StatusMisdirectedRequest,
			wantBody: `etcd --host-whitelist "evil.example"`},
		{name: "host refused, but over TLS", ac: AccessControl{HostWhitelist: []string{"etcd.example"}}, host: "evil.example", tls: true, wantCode: 200, wantOrigin: "*", wantBody: "served"},
		{name: "origin allowed", ac: AccessControl{CORS: []string{"http://ui.example:8080"}}, host: "h", origin: "http://ui.example:8080", wantCode: 200, wantOrigin: "http://ui.example:8080", wantBody: "served"},
		{name: "origin not allowed", ac: AccessControl{CORS: []string{"http://ui.example:8080"}}, host: "h", origin: "http://evil.example", wantCode: 200, wantBody: "served"},
		{name: "preflight", host: "h", method: http.MethodOptions, wantCode: 200, wantOrigin: "*"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, "/health", nil)
			req.Host = tc.host
			if tc.origin != "" {
				req.Header.Set("Origin", tc.origin)
			}
			if tc.tls {
				req.TLS = &tls.ConnectionState{}
			} else {
				req.TLS = nil
			}
			rec := httptest.NewRecorder()
			tc.ac.Wrap(ok, zap.NewNop()).ServeHTTP(rec, req)
			if rec.Code != tc.wantCode {
				t.Errorf("code %d, want %d", rec.Code, tc.wantCode)
			}
			if got := rec.Header().Get("Access-Control-Allow-Origin"); got != tc.wantOrigin {
				t.Errorf("Access-Control-Allow-Origin %q, want %q", got, tc.wantOrigin)
			}
			if !strings.Contains(rec.Body.String(), tc.wantBody) {
				t.Errorf("body %q, want it to contain %q", rec.Body.String(), tc.wantBody)
			}
		})
	}
}
