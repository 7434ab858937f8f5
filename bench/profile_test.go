package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestFetchProfile(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/debug/pprof/profile":
			if r.URL.Query().Get("seconds") != "3" {
				http.Error(w, "want seconds=3", http.StatusBadRequest)
				return
			}
			w.Write([]byte("profile bytes"))
		case "/slow":
			time.Sleep(time.Second)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	tests := []struct {
		name    string
		path    string
		timeout time.Duration
		want    string // file content; "" means an error is expected
	}{
		{name: "saved", path: "/debug/pprof/profile?seconds=3", timeout: 5 * time.Second, want: "profile bytes"},
		{name: "pprof not enabled", path: "/nothing", timeout: 5 * time.Second},
		{name: "server error", path: "/debug/pprof/profile?seconds=1", timeout: 5 * time.Second},
		{name: "timeout", path: "/slow", timeout: 50 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "sub", "p.pb.gz")
			err := fetchProfile(context.Background(), srv.URL+tt.path, path, tt.timeout)
			if tt.want == "" {
				if err == nil {
					t.Fatal("fetchProfile succeeded, want an error")
				}
				if _, serr := os.Stat(path); serr == nil {
					t.Errorf("profile file written despite error %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tt.want {
				t.Errorf("file holds %q, want %q", b, tt.want)
			}
		})
	}
}
