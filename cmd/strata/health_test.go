package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHealth(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
		code   int
		says   string
	}{
		{name: "healthy", status: 200, body: `{"health":"true","reason":""}`, code: 0, says: "is healthy"},
		{name: "no leader", status: 503, body: `{"health":"false","reason":"RAFT NO LEADER"}`, code: 1, says: "RAFT NO LEADER (503 Service Unavailable)"},
		{name: "not etcd's answer", status: 200, body: `ok`, code: 1, says: "not etcd's JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/health" {
					http.NotFound(w, r)
					return
				}
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte(tt.body))
			}))
			defer srv.Close()
			var out, errOut bytes.Buffer
			code := runHealth([]string{"--endpoint", srv.URL + "/"}, &out, &errOut)
			if code != tt.code || !strings.Contains(out.String()+errOut.String(), tt.says) {
				t.Fatalf("exit %d, output %q %q; want exit %d saying %q", code, out.String(), errOut.String(), tt.code, tt.says)
			}
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		srv := httptest.NewServer(http.NotFoundHandler())
		url := srv.URL
		srv.Close()
		var out, errOut bytes.Buffer
		if code := runHealth([]string{"--endpoint", url}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "unhealthy") {
			t.Fatalf("exit %d, stderr %q", code, errOut.String())
		}
	})
}
