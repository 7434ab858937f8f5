package testutil

import (
	"slices"
	"testing"
)

// TestWithEngine: with STRATA_E2E_ENGINE set, strata members and strata
// restore get --engine ahead of the test's own flags, which still win;
// etcd's binaries and a test naming its engine are left alone; unset, no
// flag is added (strata's default).
func TestWithEngine(t *testing.T) {
	for _, tc := range []struct {
		name, env, binary, sub string
		args, want             []string
	}{
		{"member", "bbolt", "/tmp/b/strata", "", []string{"--name=m1"}, []string{"--engine=bbolt", "--name=m1"}},
		{"restore", "appendlog", "/tmp/b/strata", "restore", []string{"restore", "snap.db", "--data-dir=d"}, []string{"restore", "--engine=appendlog", "snap.db", "--data-dir=d"}},
		{"the test names its engine", "bbolt", "/tmp/b/strata", "restore", []string{"restore", "--engine=pebble", "x"}, []string{"restore", "--engine=pebble", "x"}},
		{"etcd", "bbolt", "/tmp/b/etcd", "", []string{"--name=m1"}, []string{"--name=m1"}},
		{"etcdutl restore", "bbolt", "/tmp/b/etcdutl", "restore", []string{"restore", "x"}, []string{"restore", "x"}},
		{"unset", "", "/tmp/b/strata", "", []string{"--name=m1"}, []string{"--name=m1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EngineEnv, tc.env)
			if got := withEngine(tc.binary, tc.sub, slices.Clone(tc.args)); !slices.Equal(got, tc.want) {
				t.Fatalf("withEngine(%s, %q) = %q, want %q", tc.binary, tc.args, got, tc.want)
			}
		})
	}
	t.Setenv(EngineEnv, "hybridlog")
	p := &Process{opts: Options{Binary: "/tmp/b/strata", Name: "m1", DataDir: "d", Flags: []string{"--engine=pebble"}}}
	args := p.Args()
	if i, j := slices.Index(args, "--engine=hybridlog"), slices.Index(args, "--engine=pebble"); i < 0 || j < i {
		t.Fatalf("member args %q: want --engine=hybridlog before the test's --engine=pebble", args)
	}
}
