package logger

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// fakeClock is a settable clock for /health.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	body, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(body)
}

// TestHealth: /health is etcd's JSON, 200 only while every cluster's
// learner heard from a leader within HealthTimeout; 503 naming the
// cluster before any leader was heard and once one was not for longer.
func TestHealth(t *testing.T) {
	dir := newDataDir(t, 0, 20, 20)
	t0 := time.Unix(1_000_000, 0)
	clock := &fakeClock{t: t0}
	l, err := Open(Config{DataDir: dir, Now: clock.now, HealthTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h := l.httpHandler()
	for _, step := range []struct {
		name      string
		heartbeat bool // a leader's heartbeat arrives first
		at        time.Duration
		code      int
		body      string
	}{
		{name: "no leader heard yet", at: 0, code: 503, body: `{"health":"false","reason":"NO_LEADER: c1 (no leader heard yet)"}`},
		{name: "a heartbeat", heartbeat: true, at: 0, code: 200, body: `{"health":"true","reason":""}`},
		{name: "within the timeout", at: 3 * time.Second, code: 200, body: `{"health":"true","reason":""}`},
		{name: "past the timeout", at: 4 * time.Second, code: 503, body: `{"health":"false","reason":"NO_LEADER: c1 (no leader heard for 4s)"}`},
		{name: "heard again", heartbeat: true, at: 4 * time.Second, code: 200, body: `{"health":"true","reason":""}`},
	} {
		clock.set(t0.Add(step.at))
		if step.heartbeat {
			m := &raftpb.Message{Type: raftpb.MessageType_MsgHeartbeat.Enum(), From: proto.Uint64(1), To: proto.Uint64(2), Term: proto.Uint64(1)}
			if err := l.cluster(0xc1).ln.cfg.Inbox.Process(context.Background(), m); err != nil {
				t.Fatal(err)
			}
		}
		code, body := get(t, h, "/health")
		if code != step.code || strings.TrimSpace(body) != step.body {
			t.Fatalf("%s: /health = %d %s, want %d %s", step.name, code, body, step.code, step.body)
		}
	}
}

// TestMetrics: /metrics has each cluster's values under its cluster ID,
// read at the scrape (a log restarted after a snapshot at 10: one gap,
// entries from 11).
func TestMetrics(t *testing.T) {
	dir := newDataDir(t, 10, 20, 20)
	l, err := Open(Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	code, body := get(t, l.httpHandler(), "/metrics")
	if code != 200 {
		t.Fatalf("/metrics = %d %s", code, body)
	}
	for _, want := range []string{
		`strata_logger_first_index{cluster_id="c1"} 11`,
		`strata_logger_last_index{cluster_id="c1"} 20`,
		`strata_logger_commit_index{cluster_id="c1"} 20`,
		`strata_logger_lag_entries{cluster_id="c1"} 0`,
		`strata_logger_gaps_total{cluster_id="c1"} 1`,
		`strata_logger_truncations_total{cluster_id="c1"} 0`,
		`strata_logger_entries_logged_total{cluster_id="c1"} 0`,
		`strata_logger_has_leader{cluster_id="c1"} 0`,
		`# TYPE strata_logger_logged_bytes_total counter`,
		`# TYPE strata_logger_log_bytes gauge`,
		`# TYPE strata_logger_fsyncs_total counter`,
		`# TYPE strata_logger_fsync_seconds_total counter`,
		`go_goroutines`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
