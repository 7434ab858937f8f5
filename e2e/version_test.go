package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/strata-kv/strata/internal/testutil"
)

// TestVersionLikeEtcd: `--version` on strata prints etcd's four lines, in
// etcd's order and with the etcd version of the real etcd it stands in for,
// then strata's own line (issue 14).
func TestVersionLikeEtcd(t *testing.T) {
	out := map[flavor][]string{}
	for _, f := range flavors {
		res := testutil.RunToExit(t, 10*time.Second, "", nil, binary(t, f), "--version")
		if res.Code != 0 {
			t.Fatalf("%s --version: exit %d\n%s%s", f, res.Code, res.Stdout, res.Stderr)
		}
		out[f] = strings.Split(strings.TrimSpace(res.Stdout), "\n")
	}
	if len(out[strata]) != len(out[etcd])+1 || !strings.HasPrefix(out[strata][len(out[etcd])], "strata Version: ") {
		t.Fatalf("strata --version:\n%s\nwant etcd's lines and one of strata's; etcd --version:\n%s",
			strings.Join(out[strata], "\n"), strings.Join(out[etcd], "\n"))
	}
	for i, line := range out[etcd] {
		key, val, _ := strings.Cut(line, ": ")
		gotKey, gotVal, _ := strings.Cut(out[strata][i], ": ")
		if gotKey != key {
			t.Errorf("line %d: %q, etcd's says %q", i+1, out[strata][i], line)
		}
		if key == "etcd Version" && gotVal != val {
			t.Errorf("strata says etcd Version %q, the etcd built beside it %q", gotVal, val)
		}
	}
}
