package etcdurl

import (
	"slices"
	"strings"
	"testing"
)

// TestNormalize follows etcd's types.NewURLs on the cases an operator
// meets: a missing port or a path refused, unix URLs taken, spaces trimmed,
// the list sorted.
func TestNormalize(t *testing.T) {
	for _, tc := range []struct {
		in      []string
		want    []string
		wantErr string
	}{
		{in: []string{"http://10.0.0.1:2380"}, want: []string{"http://10.0.0.1:2380"}},
		{in: []string{" https://b:2380 ", "http://a:2380"}, want: []string{"http://a:2380", "https://b:2380"}},
		{in: []string{"unix://localhost:2380"}, want: []string{"unix://localhost:2380"}},
		{in: []string{"http://10.0.0.1"}, wantErr: `URL address does not have the form "host:port": http://10.0.0.1`},
		{in: []string{"http://10.0.0.1:2380/x"}, wantErr: "URL must not contain a path: http://10.0.0.1:2380/x"},
		{in: []string{"ftp://10.0.0.1:2380"}, wantErr: "URL scheme must be http, https, unix, or unixs: ftp://10.0.0.1:2380"},
		{in: []string{"10.0.0.1:2380"}, wantErr: "first path segment in URL cannot contain colon"},
		{in: nil, wantErr: "no valid URLs given"},
	} {
		got, err := Normalize(tc.in)
		switch {
		case tc.wantErr != "" && (err == nil || !contains(err.Error(), tc.wantErr)):
			t.Errorf("Normalize(%q) = %q, %v; want error %q", tc.in, got, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || !slices.Equal(got, tc.want)):
			t.Errorf("Normalize(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
