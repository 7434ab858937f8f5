package main

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/strata-kv/strata/discovery"
)

// TestDiscoveryFlags: the --discovery-* flags (and discovery-config in a
// config file) reach the discovery client's configuration with etcd's
// defaults, and turn discovery on in the member's: the token becomes the
// cluster token, and the initial cluster is this member alone until
// discovery replaces it.
func TestDiscoveryFlags(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "etcd.yaml")
	if err := os.WriteFile(file, []byte(`name: m2
data-dir: `+filepath.Join(dir, "file-data")+`
initial-advertise-peer-urls: http://10.0.0.2:2380
discovery-config:
  token: file-token
  client:
    endpoints: [http://d2:2379, http://d1:2379]
    request-timeout: 7000000000
    max-recv-bytes: 1000
    secure:
      insecure-transport: false
      cacert: /etc/ca.crt
    auth:
      username: root
      password: pw
`), 0o600); err != nil {
		t.Fatal(err)
	}
	etcdDefaults := discovery.Config{
		DialTimeout: 2 * time.Second, RequestTimeout: 5 * time.Second, KeepAliveTime: 2 * time.Second,
		KeepAliveTimeout: 6 * time.Second, InsecureTransport: true,
	}
	with := func(change func(*discovery.Config)) discovery.Config {
		c := etcdDefaults
		change(&c)
		return c
	}
	for _, tc := range []struct {
		name string
		args []string
		// off: discovery stays off; else want is the client's config.
		off       bool
		want      discovery.Config
		wantName  string
		wantPeers []string
	}{
		{name: "off by default", args: nil, off: true},
		{name: "off with an empty endpoints flag", args: []string{"--discovery-endpoints="}, off: true},
		{
			name:     "flags",
			args:     []string{"--name=m1", "--initial-advertise-peer-urls=http://10.0.0.1:2380", "--discovery-token=tok", "--discovery-endpoints=http://d2:2379,http://d1:2379,http://d1:2379"},
			want:     with(func(c *discovery.Config) { c.Token, c.Endpoints = "tok", []string{"http://d1:2379", "http://d2:2379"} }),
			wantName: "m1", wantPeers: []string{"http://10.0.0.1:2380"},
		},
		{
			name: "client flags",
			args: []string{"--discovery-token=tok", "--discovery-endpoints=https://d:2379", "--discovery-dial-timeout=1s",
				"--discovery-request-timeout=3s", "--discovery-keepalive-time=4s", "--discovery-keepalive-timeout=9s",
				"--discovery-insecure-transport=false", "--discovery-insecure-skip-tls-verify", "--discovery-cert=/c", "--discovery-key=/k",
				"--discovery-cacert=/ca", "--discovery-user=u", "--discovery-password=p"},
			want: discovery.Config{Token: "tok", Endpoints: []string{"https://d:2379"}, DialTimeout: time.Second, RequestTimeout: 3 * time.Second,
				KeepAliveTime: 4 * time.Second, KeepAliveTimeout: 9 * time.Second, InsecureSkipVerify: true, CertFile: "/c", KeyFile: "/k",
				CAFile: "/ca", User: "u", Password: "p"},
			wantName: "default", wantPeers: []string{"http://127.0.0.1:2380"},
		},
		{
			name: "config file",
			args: []string{"--config-file=" + file},
			want: with(func(c *discovery.Config) {
				c.Token, c.Endpoints, c.RequestTimeout = "file-token", []string{"http://d1:2379", "http://d2:2379"}, 7*time.Second
				c.InsecureTransport, c.CAFile, c.User, c.Password = false, "/etc/ca.crt", "root", "pw"
			}),
			wantName: "m2", wantPeers: []string{"http://10.0.0.2:2380"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if !slices.ContainsFunc(args, func(a string) bool { return len(a) > 14 && a[:14] == "--config-file=" }) {
				args = append([]string{"--data-dir=" + filepath.Join(t.TempDir(), "data")}, args...)
			}
			f, err := loadFlags(args)
			if err != nil {
				t.Fatal(err)
			}
			dc, on, err := f.discovery.config(f.initialCluster)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := parse(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			if tc.off {
				if on || cfg.Discover != nil {
					t.Fatalf("discovery on: %+v", dc)
				}
				return
			}
			if !on || cfg.Discover == nil {
				t.Fatal("discovery off")
			}
			if !reflect.DeepEqual(dc, tc.want) {
				t.Errorf("client config\n%+v, want\n%+v", dc, tc.want)
			}
			if cfg.InitialClusterToken != tc.want.Token {
				t.Errorf("cluster token %q, want the discovery token %q", cfg.InitialClusterToken, tc.want.Token)
			}
			if len(cfg.InitialCluster) != 1 || !slices.Equal(cfg.InitialCluster[tc.wantName], tc.wantPeers) {
				t.Errorf("initial cluster before discovery %v, want %s=%v", cfg.InitialCluster, tc.wantName, tc.wantPeers)
			}
		})
	}
}
