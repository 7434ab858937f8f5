package transport

// Sharing one listener between gRPC and HTTP/1.x (moved from server, which
// serves the client URLs with it, so that the logger's client URL can too).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

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
