package server

// The HTTP side of the client URLs: etcd serves, next to gRPC and on the same
// port, /health, /livez, /readyz, /version, /metrics and the JSON gateway on
// /v3/. This file has the handlers and the listener that splits one port
// between the two protocols.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/pprof"
	"sort"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/etcdserverpb/gw"
	"go.etcd.io/etcd/api/v3/version"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
)

// AlarmSource lists the member's active alarms. A Backend that implements
// it makes /health and /readyz report alarms as etcd does; one that does not
// has none.
type AlarmSource interface {
	Alarms() []*pb.AlarmMember
}

// HTTPConfig is what the HTTP handler serves from.
type HTTPConfig struct {
	// Backend answers the leader, learner and alarm questions.
	Backend Backend
	// Range is the KV service's Range: the health checks read through it so
	// that they exercise the path clients use.
	Range func(context.Context, *pb.RangeRequest) (*pb.RangeResponse, error)
	// RequestTimeout bounds /health's read (etcd: its request timeout).
	RequestTimeout time.Duration
	// Metrics serves /metrics; nil: not served.
	Metrics http.Handler
	// Stats counts health checks (etcd_server_health_*); nil: not counted.
	Stats *Metrics
	// Gateway serves /v3/...; nil: not served.
	Gateway http.Handler
	// Pprof serves Go's runtime profiles under /debug/pprof/ (etcd's
	// --enable-pprof). Off by default: a CPU profile costs the server CPU
	// while it runs and the endpoints are not authenticated.
	Pprof bool
	// Logger; nil means zap.NewNop().
	Logger *zap.Logger
}

// NewHTTPHandler returns the handler for the client URLs' HTTP/1.1 side.
func NewHTTPHandler(cfg HTTPConfig) http.Handler {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = 5 * time.Second
	}
	h := &httpHandler{cfg: cfg}
	mux := http.NewServeMux()
	mux.HandleFunc("/health", h.health)
	mux.HandleFunc("/version", h.version)
	for _, reg := range []checkRegistry{h.livez(), h.readyz()} {
		mux.HandleFunc("/"+reg.kind, reg.handler(cfg.Logger, cfg.Stats, reg.names()))
		for _, name := range reg.names() {
			mux.HandleFunc("/"+reg.kind+"/"+name, reg.handler(cfg.Logger, cfg.Stats, []string{name}))
		}
	}
	if cfg.Metrics != nil {
		mux.Handle("/metrics", cfg.Metrics)
	}
	if cfg.Gateway != nil {
		mux.Handle("/v3/", cfg.Gateway)
	}
	if cfg.Pprof {
		// pprof.Index serves the named profiles (heap, goroutine, block,
		// mutex, allocs...) below the prefix; the others have their own
		// handlers, as net/http/pprof registers them on the default mux.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

type httpHandler struct {
	cfg HTTPConfig
}

// healthResult is etcd's /health body.
type healthResult struct {
	Health string `json:"health"`
	Reason string `json:"reason"`
}

func (h *httpHandler) alarms() []*pb.AlarmMember {
	if src, ok := h.cfg.Backend.(AlarmSource); ok {
		return src.Alarms()
	}
	return nil
}

// health answers etcd's /health: false with an alarm (unless excluded with
// ?exclude=NAME), false without a leader (unless ?serializable=true), false
// if a one-key read fails; each failure names its reason as etcd does.
func (h *httpHandler) health(w http.ResponseWriter, r *http.Request) {
	if !allowGet(w, r) {
		return
	}
	excluded := querySet(r, "exclude")
	serializable := r.URL.Query().Get("serializable") == "true"
	res := h.checkHealth(r.Context(), excluded, serializable)
	h.cfg.Stats.observeHealth(res.Health == "true")
	body, _ := json.Marshal(res)
	if res.Health != "true" {
		h.cfg.Logger.Warn("/health error", zap.String("output", string(body)))
		http.Error(w, string(body), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

func (h *httpHandler) checkHealth(ctx context.Context, excluded map[string]bool, serializable bool) healthResult {
	for _, a := range h.alarms() {
		if excluded[a.Alarm.String()] {
			continue
		}
		reason := "ALARM UNKNOWN"
		switch a.Alarm {
		case pb.AlarmType_NOSPACE:
			reason = "ALARM NOSPACE"
		case pb.AlarmType_CORRUPT:
			reason = "ALARM CORRUPT"
		}
		return healthResult{Health: "false", Reason: reason}
	}
	if !serializable && h.cfg.Backend.Leader() == 0 {
		return healthResult{Health: "false", Reason: "RAFT NO LEADER"}
	}
	ctx, cancel := context.WithTimeout(ctx, h.cfg.RequestTimeout)
	defer cancel()
	if err := h.read(ctx, serializable); err != nil {
		return healthResult{Health: "false", Reason: fmt.Sprintf("RANGE ERROR:%s", err)}
	}
	return healthResult{Health: "true"}
}

func (h *httpHandler) read(ctx context.Context, serializable bool) error {
	_, err := h.cfg.Range(ctx, &pb.RangeRequest{Key: []byte{0}, KeysOnly: true, Limit: 1, Serializable: serializable})
	return err
}

// version answers etcd's /version: the etcd version strata implements, and
// the cluster and storage versions derived from it (every strata member
// speaks the same API, so the cluster version is its major.minor).
func (h *httpHandler) version(w http.ResponseWriter, r *http.Request) {
	if !allowGet(w, r) {
		return
	}
	cluster := version.Cluster(EtcdVersion) + ".0"
	body, err := json.Marshal(version.Versions{Server: EtcdVersion, Cluster: cluster, Storage: cluster})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// checkRegistry is a set of named checks served, as etcd 3.6 serves them,
// at /<kind> (all checks, minus ?exclude=NAME ones) and at /<kind>/<name>.
type checkRegistry struct {
	kind   string
	checks map[string]func(context.Context) error
}

func (h *httpHandler) livez() checkRegistry {
	return checkRegistry{kind: "livez", checks: map[string]func(context.Context) error{
		"serializable_read": func(ctx context.Context) error { return h.read(ctx, true) },
	}}
}

func (h *httpHandler) readyz() checkRegistry {
	return checkRegistry{kind: "readyz", checks: map[string]func(context.Context) error{
		"data_corruption": func(context.Context) error {
			for _, a := range h.alarms() {
				if a.Alarm == pb.AlarmType_CORRUPT {
					return fmt.Errorf("alarm activated: %s", a.Alarm)
				}
			}
			return nil
		},
		"serializable_read": func(ctx context.Context) error { return h.read(ctx, true) },
		"linearizable_read": func(ctx context.Context) error { return h.read(ctx, false) },
		"non_learner": func(context.Context) error {
			if h.cfg.Backend.Status().IsLearner {
				return errors.New("not supported for learner")
			}
			return nil
		},
	}}
}

// names returns the check names sorted, so that verbose output is stable
// (etcd's order is a map's).
func (reg checkRegistry) names() []string {
	names := make([]string, 0, len(reg.checks))
	for name := range reg.checks {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// handler runs checks (minus those named by ?exclude= when more than one)
// and answers 200 "ok" or 503 with one [+]/[-] line per check; ?verbose
// shows those lines on success too.
func (reg checkRegistry) handler(logger *zap.Logger, stats *Metrics, checks []string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !allowGet(w, r) {
			return
		}
		run := checks
		if len(checks) > 1 {
			excluded := querySet(r, "exclude")
			run = nil
			for _, name := range checks {
				if excluded[name] {
					delete(excluded, name)
					continue
				}
				run = append(run, name)
			}
			if len(excluded) > 0 {
				logger.Warn("some health checks cannot be excluded", zap.Any("missing-health-checks", excluded))
			}
		}
		var out bytes.Buffer
		failed := false
		for _, name := range run {
			err := reg.checks[name](r.Context())
			stats.observeCheck(reg.kind, name, err == nil)
			if err != nil {
				fmt.Fprintf(&out, "[-]%s failed: %v\n", name, err)
				failed = true
			} else {
				fmt.Fprintf(&out, "[+]%s ok\n", name)
			}
		}
		if failed {
			logger.Warn("health check failed", zap.String("path", r.URL.Path), zap.String("reason", out.String()))
			http.Error(w, out.String(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if _, ok := r.URL.Query()["verbose"]; ok {
			_, _ = w.Write(out.Bytes())
		}
		_, _ = fmt.Fprint(w, "ok\n")
	}
}

func allowGet(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet {
		return true
	}
	w.Header().Set("Allow", http.MethodGet)
	http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
	return false
}

func querySet(r *http.Request, name string) map[string]bool {
	set := map[string]bool{}
	for _, v := range r.URL.Query()[name] {
		if v != "" {
			set[v] = true
		}
	}
	return set
}

// NewGateway returns etcd's JSON gateway (/v3/kv/put, /v3/kv/range,
// /v3/watch, ...) forwarding to the gRPC services behind conn, with etcd's
// JSON conventions (proto field names, unknown fields ignored, bytes as
// base64). It is the grpc-gateway registration etcd's api module ships;
// conn is a loopback connection to the member's own gRPC server, so every
// request takes the path a gRPC client's would (validation, limits, auth).
func NewGateway(ctx context.Context, conn *grpc.ClientConn) (http.Handler, error) {
	mux := runtime.NewServeMux(runtime.WithMarshalerOption(runtime.MIMEWildcard,
		&runtime.HTTPBodyMarshaler{Marshaler: &runtime.JSONPb{
			MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true},
			UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: true},
		}}))
	for _, register := range []func(context.Context, *runtime.ServeMux, *grpc.ClientConn) error{
		gw.RegisterKVHandler, gw.RegisterWatchHandler, gw.RegisterLeaseHandler,
		gw.RegisterClusterHandler, gw.RegisterMaintenanceHandler, gw.RegisterAuthHandler,
	} {
		if err := register(ctx, mux, conn); err != nil {
			return nil, fmt.Errorf("register gateway handler: %w", err)
		}
	}
	return mux, nil
}
