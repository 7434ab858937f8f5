package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/strata-kv/strata/server"
)

// TestVersion: `strata --version` answers as `etcd --version` does, line
// for line, with the etcd API version strata implements, then strata's
// own line; it exits 0 without starting anything.
func TestVersion(t *testing.T) {
	var out bytes.Buffer
	printVersion(&out)
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	wantPrefixes := []string{"etcd Version: " + server.EtcdVersion, "Git SHA: ", "Go Version: go", "Go OS/Arch: ", "strata Version: "}
	if len(lines) != len(wantPrefixes) {
		t.Fatalf("--version printed %d lines, want %d:\n%s", len(lines), len(wantPrefixes), out.String())
	}
	for i, p := range wantPrefixes {
		if !strings.HasPrefix(lines[i], p) {
			t.Errorf("line %d is %q, want it to start with %q", i+1, lines[i], p)
		}
	}
	if code := runMember([]string{"--version"}); code != 0 {
		t.Errorf("strata --version exited %d, want 0", code)
	}
}
