//go:build unix

package transport

import (
	"testing"
)

// TestListenReusePort: with ReusePort (--socket-reuse-port) a second
// listener binds a port already bound; without it, it cannot.
func TestListenReusePort(t *testing.T) {
	for _, tc := range []struct {
		name       string
		cfg        ListenConfig
		secondOpen bool
	}{
		{name: "defaults", cfg: ListenConfig{}},
		{name: "reuse address only", cfg: ListenConfig{ReuseAddress: true}},
		{name: "reuse port", cfg: ListenConfig{ReusePort: true}, secondOpen: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first, err := tc.cfg.ListenAddr("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer first.Close()
			second, err := tc.cfg.Listen("client", []string{"http://" + first.Addr().String()})
			if err == nil {
				for _, l := range second {
					l.Close()
				}
			}
			if (err == nil) != tc.secondOpen {
				t.Fatalf("second listener on %s: %v; want it opened: %v", first.Addr(), err, tc.secondOpen)
			}
		})
	}
}
