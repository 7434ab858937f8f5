package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/strata-kv/strata/internal/testutil"
)

// TestStartupLogLikeEtcd: the lines that tools and test harnesses wait for
// in a starting member's log come in etcd's zap JSON shape (level, ts,
// caller, msg, and etcd's field names), in etcd's words and order, on
// strata as on real etcd: the member publishes itself to the cluster, then
// is ready to serve, then says how it serves each client URL.
func TestStartupLogLikeEtcd(t *testing.T) {
	want := []struct {
		msg    string
		fields []string
	}{
		{"published local member to cluster through raft", []string{"local-member-id", "local-member-attributes", "cluster-id"}},
		{"ready to serve client requests", nil},
		{"serving client traffic insecurely; this is strongly discouraged!", []string{"traffic", "address"}},
	}
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			p := testutil.StartProcess(t, testutil.Options{Binary: binary(t, f), Flags: []string{"--log-level=info"}})
			// A member may answer its first request a moment before its
			// log line says it is ready (etcd logs it after it starts
			// serving): read the output again, bounded, until every line
			// is there.
			var lines []map[string]any
			next := 0
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				lines, next = lines[:0], 0
				for _, line := range strings.Split(p.CurrentOutput(), "\n") {
					var entry map[string]any
					if json.Unmarshal([]byte(line), &entry) == nil && entry["msg"] != nil {
						lines = append(lines, entry)
					}
				}
				for _, entry := range lines {
					if next < len(want) && entry["msg"] == want[next].msg {
						next++
					}
				}
				if next == len(want) || time.Now().After(deadline) {
					break
				}
			}
			next = 0
			for _, entry := range lines {
				if next == len(want) {
					break
				}
				if entry["msg"] != want[next].msg {
					continue
				}
				for _, k := range append([]string{"level", "ts", "caller"}, want[next].fields...) {
					if _, ok := entry[k]; !ok {
						t.Errorf("%q has no %q field: %v", want[next].msg, k, entry)
					}
				}
				if entry["level"] != "info" {
					t.Errorf("%q logged at level %v, want info", want[next].msg, entry["level"])
				}
				next++
			}
			if next < len(want) {
				t.Fatalf("start-up log lacks %q (in order after the lines before it); %d JSON lines:\n%s", want[next].msg, len(lines), p.CurrentOutput())
			}
		})
	}
}
