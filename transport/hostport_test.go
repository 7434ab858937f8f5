package transport

import "testing"

func TestHostPort(t *testing.T) {
	for _, tc := range []struct {
		url, want string
		ok        bool
	}{
		{"http://127.0.0.1:2380", "127.0.0.1:2380", true},
		{"https://m1.example:2380", "m1.example:2380", true},
		{"unix://socket", "", false},
		{"127.0.0.1:2380", "", false},
		{"http://", "", false},
	} {
		got, err := HostPort(tc.url)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("HostPort(%q) = %q, %v; want %q, ok=%v", tc.url, got, err, tc.want, tc.ok)
		}
	}
}
