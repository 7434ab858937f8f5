package main

import (
	"strings"
	"testing"
)

// TestFeatureGates: etcd's --feature-gates syntax, defaults and refusals
// (the messages are etcd's), and the one gate strata acts on.
func TestFeatureGates(t *testing.T) {
	for _, tc := range []struct {
		name    string
		values  []string // one --feature-gates flag each
		wantErr string
		on, off []string
	}{
		{name: "defaults", on: []string{"FastLeaseKeepAlive", "TxnModeWriteWithSharedBuffer"}, off: []string{"InitialCorruptCheck", "CompactHashCheck"}},
		{name: "kubeadm's", values: []string{"InitialCorruptCheck=true"}, on: []string{"InitialCorruptCheck"}},
		{name: "several, spaces", values: []string{"InitialCorruptCheck=true, FastLeaseKeepAlive=false"}, on: []string{"InitialCorruptCheck"}, off: []string{"FastLeaseKeepAlive"}},
		{name: "later flag wins", values: []string{"InitialCorruptCheck=true", "InitialCorruptCheck=false"}, off: []string{"InitialCorruptCheck"}},
		{name: "AllAlpha", values: []string{"AllAlpha=true"}, on: []string{"InitialCorruptCheck", "CompactHashCheck", "FastLeaseKeepAlive"}},
		{name: "AllBeta off, one alpha on", values: []string{"AllBeta=false,LeaseCheckpoint=true"}, on: []string{"LeaseCheckpoint"}, off: []string{"FastLeaseKeepAlive", "InitialCorruptCheck"}},
		{name: "unknown gate", values: []string{"Bogus=true"}, wantErr: "unrecognized feature gate: Bogus"},
		{name: "not a bool", values: []string{"InitialCorruptCheck=maybe"}, wantErr: "invalid value of InitialCorruptCheck=maybe"},
		{name: "no value", values: []string{"InitialCorruptCheck"}, wantErr: "missing bool value for InitialCorruptCheck"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var g featureGates
			var err error
			for _, v := range tc.values {
				if err = g.Set(v); err != nil {
					break
				}
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Set(%q) = %v, want an error with %q", tc.values, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Set(%q): %v", tc.values, err)
			}
			for _, name := range tc.on {
				if !g.Enabled(name) {
					t.Errorf("%s off, want on", name)
				}
			}
			for _, name := range tc.off {
				if g.Enabled(name) {
					t.Errorf("%s on, want off", name)
				}
			}
		})
	}
	// The flag reaches the member's configuration.
	var f flags
	fs := newFlagSet(&f)
	if err := fs.Parse([]string{"--feature-gates=InitialCorruptCheck=true"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := f.memberConfig()
	if err != nil {
		t.Fatal(err)
	}
	f.corrupt.apply(&cfg)
	if !cfg.InitialCorruptCheck {
		t.Error("--feature-gates=InitialCorruptCheck=true did not turn the initial corruption check on")
	}
}
