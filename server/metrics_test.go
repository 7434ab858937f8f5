package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/strata-kv/strata/raftlog"
)

// fakeState gives fixed readings for every part of a StateSource.
type fakeState struct{ leader uint64 }

func (f fakeState) Leader() uint64                { return f.leader }
func (fakeState) LeaderChanges() uint64           { return 3 }
func (fakeState) IncomingWaits() (uint64, uint64) { return 11, 2 }
func (fakeState) CommitIndex() uint64             { return 42 }
func (fakeState) Rev() int64                      { return 17 }
func (fakeState) CompactRev() int64               { return 5 }
func (fakeState) DiskSize() int64                 { return 4096 }
func (fakeState) AppliedIndex() uint64            { return 41 }
func (fakeState) DurableIndex() uint64            { return 30 }
func (fakeState) FirstIndex() (uint64, error)     { return 10, nil }
func (fakeState) LastIndex() (uint64, error)      { return 42, nil }
func (fakeState) Stats() raftlog.Stats {
	return raftlog.Stats{Segments: 2, Bytes: 100, DiskBytes: 200, Appends: 7, Entries: 9, BytesWritten: 300, Fsyncs: 7,
		BatchFiles: 2, BatchBytes: 4096, BatchCommands: 1200, BatchRecords: 150, BatchesWritten: 3, CompactionsSkipped: 4}
}
func (fakeState) FsyncHistogram() raftlog.Histogram {
	b := map[float64]uint64{}
	for _, ub := range raftlog.FsyncBuckets {
		b[ub] = 6
	}
	b[0.001] = 4
	return raftlog.Histogram{Buckets: b, Count: 7, Sum: 20 * time.Millisecond}
}

// newTestMetrics is a member's metrics over fixed readings.
func newTestMetrics(leader uint64) *Metrics {
	m := NewMetrics()
	f := fakeState{leader: leader}
	m.Registry().MustRegister(NewStateCollector(StateSource{MemberID: 0xabc, Raft: f, Applier: f, Store: f, Engine: f, Log: f}))
	return m
}

func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	return string(body)
}

func TestMetricsExposition(t *testing.T) {
	for _, tc := range []struct {
		name   string
		leader uint64
		want   []string
	}{
		{name: "leader", leader: 0xabc, want: []string{
			"etcd_server_has_leader 1", "etcd_server_is_leader 1", "etcd_server_leader_changes_seen_total 3",
			"etcd_server_proposals_committed_total 42", "etcd_server_proposals_applied_total 41",
			"etcd_mvcc_db_total_size_in_bytes 4096", "etcd_debugging_mvcc_current_revision 17",
			"etcd_debugging_mvcc_compact_revision 5",
			`etcd_disk_wal_fsync_duration_seconds_bucket{le="0.001"} 4`, `etcd_disk_wal_fsync_duration_seconds_bucket{le="8.192"} 6`,
			`etcd_disk_wal_fsync_duration_seconds_bucket{le="+Inf"} 7`, "etcd_disk_wal_fsync_duration_seconds_sum 0.02",
			"strata_raftlog_segments 2", "strata_raftlog_bytes 100", "strata_raftlog_disk_bytes 200",
			"strata_raftlog_appends_total 7", "strata_raftlog_entries_total 9", "strata_raftlog_written_bytes_total 300",
			"strata_raftlog_fsyncs_total 7", "strata_raftlog_first_index 10", "strata_raftlog_last_index 42",
			"strata_raftlog_compactions_total 3", "strata_raftlog_compactions_skipped_total 4", "strata_raftlog_batch_files 2", "strata_raftlog_batch_commands 1200", "strata_raftlog_batch_records 150", "strata_engine_applied_index 41", "strata_engine_durable_index 30",
			"strata_raft_incoming_waits_total 11", "strata_raft_incoming_wait_timeouts_total 2",
			`etcd_server_id{server_id="abc"} 1`, `etcd_server_version{server_version="` + EtcdVersion + `"} 1`,
		}},
		{name: "follower", leader: 0xdef, want: []string{"etcd_server_has_leader 1", "etcd_server_is_leader 0"}},
		{name: "no leader", leader: 0, want: []string{"etcd_server_has_leader 0", "etcd_server_is_leader 0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := scrape(t, newTestMetrics(tc.leader))
			for _, line := range tc.want {
				if !strings.Contains(body, "\n"+line+"\n") {
					t.Errorf("exposition lacks %q", line)
				}
			}
		})
	}
}

func TestMetricsProposalsAndHealth(t *testing.T) {
	m := newTestMetrics(1)
	ok := m.ProposalStarted()
	failed := m.ProposalStarted()
	pending := m.ProposalStarted()
	ok(nil)
	failed(errors.New("timed out"))
	_ = pending

	h := NewHTTPHandler(HTTPConfig{
		Backend: &fakeHealthBackend{leader: 1},
		Range: func(_ context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
			if r.Serializable {
				return &pb.RangeResponse{}, nil
			}
			return nil, errors.New("no")
		},
		Stats: m,
	})
	for _, path := range []string{"/health?serializable=true", "/health", "/readyz/linearizable_read", "/livez"} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
	}
	body := scrape(t, m)
	for _, line := range []string{
		"etcd_server_proposals_pending 1", "etcd_server_proposals_failed_total 1",
		"etcd_server_health_success 1", "etcd_server_health_failures 1",
		`etcd_server_healthcheck{name="linearizable_read",type="readyz"} 0`,
		`etcd_server_healthcheck{name="serializable_read",type="livez"} 1`,
		`etcd_server_healthchecks_total{name="linearizable_read",status="error",type="readyz"} 1`,
	} {
		if !strings.Contains(body, "\n"+line+"\n") {
			t.Errorf("exposition lacks %q", line)
		}
	}
}
