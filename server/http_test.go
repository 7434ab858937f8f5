package server

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// fakeHealthBackend answers the questions the health checks ask; the rest
// of Backend is nil and must not be called.
type fakeHealthBackend struct {
	Backend
	leader  uint64
	learner bool
	alarms  []*pb.AlarmMember
}

func (b *fakeHealthBackend) Leader() uint64            { return b.leader }
func (b *fakeHealthBackend) Status() Status            { return Status{IsLearner: b.learner} }
func (b *fakeHealthBackend) Alarms() []*pb.AlarmMember { return b.alarms }
func alarm(a pb.AlarmType) []*pb.AlarmMember           { return []*pb.AlarmMember{{MemberID: 1, Alarm: a}} }
func okRange(context.Context, *pb.RangeRequest) error  { return nil }
func failLinearizable(_ context.Context, r *pb.RangeRequest) error {
	if r.Serializable {
		return nil
	}
	return errors.New("etcdserver: request timed out")
}

func TestHealthHandlers(t *testing.T) {
	for _, tc := range []struct {
		name     string
		backend  fakeHealthBackend
		rangeErr func(context.Context, *pb.RangeRequest) error
		path     string
		wantCode int
		wantBody string
	}{
		{name: "healthy", backend: fakeHealthBackend{leader: 1}, path: "/health", wantCode: 200, wantBody: `{"health":"true","reason":""}`},
		{name: "no leader", backend: fakeHealthBackend{}, path: "/health", wantCode: 503, wantBody: `{"health":"false","reason":"RAFT NO LEADER"}`},
		{name: "no leader serializable", backend: fakeHealthBackend{}, path: "/health?serializable=true", wantCode: 200, wantBody: `{"health":"true","reason":""}`},
		{name: "nospace alarm", backend: fakeHealthBackend{leader: 1, alarms: alarm(pb.AlarmType_NOSPACE)}, path: "/health", wantCode: 503, wantBody: `{"health":"false","reason":"ALARM NOSPACE"}`},
		{name: "corrupt alarm before leader", backend: fakeHealthBackend{alarms: alarm(pb.AlarmType_CORRUPT)}, path: "/health", wantCode: 503, wantBody: `{"health":"false","reason":"ALARM CORRUPT"}`},
		{name: "excluded alarm", backend: fakeHealthBackend{leader: 1, alarms: alarm(pb.AlarmType_NOSPACE)}, path: "/health?exclude=NOSPACE", wantCode: 200, wantBody: `{"health":"true","reason":""}`},
		{name: "range fails", backend: fakeHealthBackend{leader: 1}, rangeErr: failLinearizable, path: "/health", wantCode: 503, wantBody: `{"health":"false","reason":"RANGE ERROR:etcdserver: request timed out"}`},
		{name: "livez", backend: fakeHealthBackend{}, rangeErr: failLinearizable, path: "/livez?verbose", wantCode: 200, wantBody: "[+]serializable_read ok\nok"},
		{name: "readyz verbose", backend: fakeHealthBackend{leader: 1}, path: "/readyz?verbose", wantCode: 200,
			wantBody: "[+]data_corruption ok\n[+]linearizable_read ok\n[+]non_learner ok\n[+]serializable_read ok\nok"},
		{name: "readyz quiet", backend: fakeHealthBackend{leader: 1}, path: "/readyz", wantCode: 200, wantBody: "ok"},
		{name: "readyz learner", backend: fakeHealthBackend{leader: 1, learner: true}, path: "/readyz", wantCode: 503,
			wantBody: "[+]data_corruption ok\n[+]linearizable_read ok\n[-]non_learner failed: not supported for learner\n[+]serializable_read ok"},
		{name: "readyz learner excluded", backend: fakeHealthBackend{leader: 1, learner: true}, path: "/readyz?exclude=non_learner", wantCode: 200, wantBody: "ok"},
		{name: "readyz corrupt", backend: fakeHealthBackend{leader: 1, alarms: alarm(pb.AlarmType_CORRUPT)}, path: "/readyz/data_corruption", wantCode: 503,
			wantBody: "[-]data_corruption failed: alarm activated: CORRUPT"},
		{name: "readyz one check ignores exclude", backend: fakeHealthBackend{leader: 1}, rangeErr: failLinearizable, path: "/readyz/linearizable_read?exclude=linearizable_read", wantCode: 503,
			wantBody: "[-]linearizable_read failed: etcdserver: request timed out"},
		{name: "unknown exclude", backend: fakeHealthBackend{leader: 1}, path: "/livez?exclude=nonsense", wantCode: 200, wantBody: "ok"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rangeErr := tc.rangeErr
			if rangeErr == nil {
				rangeErr = okRange
			}
			h := NewHTTPHandler(HTTPConfig{
				Backend: &tc.backend,
				Range: func(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
					if err := rangeErr(ctx, r); err != nil {
						return nil, err
					}
					return &pb.RangeResponse{}, nil
				},
			})
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
			if got := strings.TrimSpace(rec.Body.String()); rec.Code != tc.wantCode || got != tc.wantBody {
				t.Errorf("GET %s = %d %q, want %d %q", tc.path, rec.Code, got, tc.wantCode, tc.wantBody)
			}
		})
	}
}

func TestVersionHandler(t *testing.T) {
	h := NewHTTPHandler(HTTPConfig{Backend: &fakeHealthBackend{}})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/version", nil))
	cluster := strings.Join(strings.Split(EtcdVersion, ".")[:2], ".") + ".0"
	want := `{"etcdserver":"` + EtcdVersion + `","etcdcluster":"` + cluster + `","storage":"` + cluster + `"}`
	if rec.Code != 200 || rec.Body.String() != want {
		t.Errorf("/version = %d %q, want 200 %q", rec.Code, rec.Body.String(), want)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPut, "/version", nil))
	if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET" {
		t.Errorf("PUT /version = %d (Allow %q), want 405 with Allow: GET", rec.Code, rec.Header().Get("Allow"))
	}
}

// TestPprofHandlers checks that /debug/pprof/ is served only when enabled,
// as with etcd's --enable-pprof.
func TestPprofHandlers(t *testing.T) {
	tests := []struct {
		name     string
		pprof    bool
		path     string
		wantCode int
		wantBody string
	}{
		{name: "off: index", pprof: false, path: "/debug/pprof/", wantCode: http.StatusNotFound},
		{name: "off: cmdline", pprof: false, path: "/debug/pprof/cmdline", wantCode: http.StatusNotFound},
		{name: "on: index lists profiles", pprof: true, path: "/debug/pprof/", wantCode: http.StatusOK, wantBody: "goroutine"},
		{name: "on: named profile", pprof: true, path: "/debug/pprof/goroutine?debug=1", wantCode: http.StatusOK, wantBody: "goroutine profile:"},
		{name: "on: cmdline", pprof: true, path: "/debug/pprof/cmdline", wantCode: http.StatusOK},
		{name: "on: unknown profile", pprof: true, path: "/debug/pprof/nosuch", wantCode: http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := NewHTTPHandler(HTTPConfig{Backend: &fakeHealthBackend{}, Pprof: tt.pprof})
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tt.path, nil))
			if rec.Code != tt.wantCode {
				t.Fatalf("GET %s = %d, want %d", tt.path, rec.Code, tt.wantCode)
			}
			if !strings.Contains(rec.Body.String(), tt.wantBody) {
				t.Errorf("GET %s body does not contain %q:\n%.300s", tt.path, tt.wantBody, rec.Body.String())
			}
		})
	}
}
