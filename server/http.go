package server

// The HTTP side of the client URLs: etcd serves, next to gRPC and on the same
// port, /health, /livez, /readyz, /version, /metrics and the JSON gateway on
// /v3/. This file has the handlers and the listener that splits one port
// between the two protocols.

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"sort"
	"strings"
	"sync"
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

// http2Preface opens every HTTP/2 connection (RFC 9113 section 3.4). A
// plaintext gRPC client sends it first; an HTTP/1.x client never does.
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// sniffTimeout bounds how long a new connection may take to send the bytes
// that tell its protocol, so that idle connections do not pile up.
const sniffTimeout = 10 * time.Second

// SplitListener shares one listener between gRPC and HTTP/1.x, as etcd's
// cmux does for plaintext client URLs: connections that open with the HTTP/2
// preface go to GRPC, all others to HTTP. Only the first bytes of each
// connection are inspected, by a goroutine of its own, and then replayed;
// after that the connection is the server's, so gRPC throughput is that of
// grpc.Server.Serve (grpc.Server.ServeHTTP, the alternative, runs gRPC over
// net/http's separate HTTP/2 server, which lacks some of grpc-go's features).
// docs/http.md has the measurement.
//
// h2c (HTTP/2 without TLS) requests other than gRPC are not supported: they
// reach the gRPC server, as they do in etcd. NewTLSSplitListener does the
// same for TLS clients by the protocols their ClientHello offers.
//
// Concurrency: Serve runs the accept loop on the caller's goroutine; Close
// may be called from any goroutine and ends it.
type SplitListener struct {
	root       net.Listener
	tls        bool // route by the TLS ClientHello's ALPN instead of the preface
	grpc, http *subListener
	logger     *zap.Logger
}

// NewSplitListener wraps l. logger nil means zap.NewNop().
func NewSplitListener(l net.Listener, logger *zap.Logger) *SplitListener {
	if logger == nil {
		logger = zap.NewNop()
	}
	return &SplitListener{root: l, grpc: newSubListener(l.Addr()), http: newSubListener(l.Addr()), logger: logger}
}

// NewTLSSplitListener wraps a listener whose clients speak TLS. It routes
// by the protocols a connection's ClientHello offers: "h2" alone (gRPC
// clients) to GRPC, which must do the TLS handshake itself (grpc.Creds);
// any other to HTTP, still encrypted: wrap HTTP() with tls.NewListener and a
// configuration whose NextProtos is {"http/1.1"}.
func NewTLSSplitListener(l net.Listener, logger *zap.Logger) *SplitListener {
	s := NewSplitListener(l, logger)
	s.tls = true
	return s
}

// GRPC returns the listener for gRPC connections.
func (s *SplitListener) GRPC() net.Listener { return s.grpc }

// HTTP returns the listener for HTTP/1.x connections.
func (s *SplitListener) HTTP() net.Listener { return s.http }

// Serve accepts connections and hands each to its protocol's listener
// until the root listener is closed.
func (s *SplitListener) Serve() error {
	for {
		conn, err := s.root.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.grpc.Close()
			s.http.Close()
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("accept on %s: %w", s.root.Addr(), err)
		}
		go s.route(conn)
	}
}

// Close closes the root listener and both protocol listeners.
func (s *SplitListener) Close() error {
	err := s.root.Close()
	s.grpc.Close()
	s.http.Close()
	return err
}

func (s *SplitListener) route(conn net.Conn) {
	_ = conn.SetReadDeadline(time.Now().Add(sniffTimeout))
	sniff := sniffPlain
	if s.tls {
		sniff = sniffTLS
	}
	prefix, isGRPC, err := sniff(conn)
	if err != nil {
		s.logger.Debug("connection closed before its protocol was known", zap.Error(err))
		conn.Close()
		return
	}
	_ = conn.SetReadDeadline(time.Time{})
	c := &prefixConn{Conn: conn, prefix: prefix}
	if isGRPC {
		s.grpc.deliver(c)
	} else {
		s.http.deliver(c)
	}
}

// sniffPlain reads until the bytes diverge from the HTTP/2 preface (HTTP/1.x)
// or match all of it (gRPC).
func sniffPlain(r io.Reader) (prefix []byte, isGRPC bool, err error) {
	var buf [len(http2Preface)]byte
	n := 0
	for {
		m, err := r.Read(buf[n:])
		n += m
		if n > 0 && !strings.HasPrefix(http2Preface, string(buf[:n])) {
			return buf[:n], false, nil // diverged from the preface: HTTP/1.x
		}
		if n == len(buf) {
			return buf[:n], true, nil
		}
		if err != nil {
			return nil, false, err
		}
	}
}

// sniffTLS reads the first TLS record, the ClientHello, and routes by the
// protocols it offers (ALPN): gRPC clients offer "h2" alone; browsers,
// curl and Go's http.Client offer "http/1.1" as well, and the HTTP side
// negotiates that. Anything that is not a parsable ClientHello goes to the
// HTTP side, whose TLS handshake then refuses it.
func sniffTLS(r io.Reader) (prefix []byte, isGRPC bool, err error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, false, err
	}
	const recordTypeHandshake = 0x16
	size := int(binary.BigEndian.Uint16(hdr[3:5]))
	if hdr[0] != recordTypeHandshake || size > maxTLSRecord {
		return hdr[:], false, nil
	}
	rec := make([]byte, 5+size)
	copy(rec, hdr[:])
	if _, err := io.ReadFull(r, rec[5:]); err != nil {
		return nil, false, err
	}
	protos, ok := clientHelloALPN(rec[5:])
	return rec, ok && slices.Contains(protos, "h2") && !slices.Contains(protos, "http/1.1"), nil
}

// maxTLSRecord is the largest TLS plaintext record (RFC 8446 section 5.1)
// plus the expansion TLS 1.2 allows; a larger length is not TLS.
const maxTLSRecord = 16384 + 2048

// clientHelloALPN returns the ALPN protocol names of a ClientHello
// handshake message (RFC 8446 section 4.1.2, RFC 7301). ok is false if body
// is not a complete ClientHello; a hello without ALPN returns none, ok.
func clientHelloALPN(body []byte) (protos []string, ok bool) {
	const (
		handshakeClientHello = 1
		extensionALPN        = 16
	)
	if len(body) < 4 || body[0] != handshakeClientHello {
		return nil, false
	}
	n := int(body[1])<<16 | int(body[2])<<8 | int(body[3])
	if n > len(body)-4 {
		return nil, false // split across records: not worth routing on
	}
	b := body[4 : 4+n]
	// legacy_version (2), random (32)
	if len(b) < 34 {
		return nil, false
	}
	b = b[34:]
	// Skip legacy_session_id, cipher_suites, legacy_compression_methods.
	if _, b, ok = cut8(b); !ok {
		return nil, false
	}
	if _, b, ok = cut16(b); !ok {
		return nil, false
	}
	if _, b, ok = cut8(b); !ok {
		return nil, false
	}
	if len(b) == 0 {
		return nil, true // no extensions
	}
	exts, _, ok := cut16(b)
	if !ok {
		return nil, false
	}
	for len(exts) > 0 {
		if len(exts) < 2 {
			return nil, false
		}
		typ := binary.BigEndian.Uint16(exts)
		var field []byte
		if field, exts, ok = cut16(exts[2:]); !ok {
			return nil, false
		}
		if typ != extensionALPN {
			continue
		}
		list, _, ok := cut16(field)
		if !ok {
			return nil, false
		}
		for len(list) > 0 {
			var name []byte
			if name, list, ok = cut8(list); !ok {
				return nil, false
			}
			protos = append(protos, string(name))
		}
	}
	return protos, true
}

// cut8 splits a field with a one-byte length prefix off b.
func cut8(b []byte) (field, rest []byte, ok bool) {
	if len(b) < 1 || int(b[0]) > len(b)-1 {
		return nil, nil, false
	}
	return b[1 : 1+int(b[0])], b[1+int(b[0]):], true
}

// cut16 splits a field with a two-byte big-endian length prefix off b.
func cut16(b []byte) (field, rest []byte, ok bool) {
	if len(b) < 2 {
		return nil, nil, false
	}
	n := int(binary.BigEndian.Uint16(b))
	if n > len(b)-2 {
		return nil, nil, false
	}
	return b[2 : 2+n], b[2+n:], true
}

// prefixConn replays the bytes read while sniffing before the rest.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// subListener is one protocol's share of a SplitListener.
type subListener struct {
	addr      net.Addr
	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

func newSubListener(addr net.Addr) *subListener {
	return &subListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *subListener) deliver(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *subListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *subListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return nil
}

func (l *subListener) Addr() net.Addr { return l.addr }
