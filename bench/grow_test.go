package main

import "testing"

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		err  bool
	}{
		{in: "1048576", want: 1 << 20},
		{in: "8MiB", want: 8 << 20},
		{in: "20GiB", want: 20 << 30},
		{in: "20gb", want: 20 << 30},
		{in: "1.5G", want: 3 << 29},
		{in: "512 KiB", want: 512 << 10},
		{in: "100B", want: 100},
		{in: "1TiB", want: 1 << 40},
		{in: "", err: true},
		{in: "GiB", err: true},
		{in: "-1MiB", err: true},
		{in: "ten", err: true},
	}
	for _, tt := range tests {
		got, err := parseBytes(tt.in)
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.err)
		}
	}
}

func TestGrowQuota(t *testing.T) {
	o := defaultGrowOptions()
	if q := o.quotaBytes(); q != 40<<30 {
		t.Errorf("quota for the 20 GiB default: %d, want twice the target", q)
	}
	o.bytes = 8 << 20
	if q := o.quotaBytes(); q != 8<<30 {
		t.Errorf("quota for 8 MiB: %d, want the 8 GiB floor", q)
	}
	o.quota = 3 << 30
	if q := o.quotaBytes(); q != 3<<30 {
		t.Errorf("-grow-quota 3GiB gave %d", q)
	}
}
