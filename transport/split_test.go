package transport

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// routeOnce sends payload on a new connection to a SplitListener and
// reports which side accepted it and what that side read.
func routeOnce(t testing.TB, payload []byte, closeAfter bool) (side string, got []byte) {
	t.Helper()
	root, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewSplitListener(root, nil)
	defer s.Close()
	go func() { _ = s.Serve() }()
	client, err := net.Dial("tcp", root.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if _, err := client.Write(payload); err != nil {
		t.Fatal(err)
	}
	if closeAfter {
		_ = client.(*net.TCPConn).CloseWrite()
	}
	type accepted struct {
		side string
		conn net.Conn
	}
	ch := make(chan accepted, 2)
	for side, l := range map[string]net.Listener{"grpc": s.GRPC(), "http": s.HTTP()} {
		go func() {
			if c, err := l.Accept(); err == nil {
				ch <- accepted{side, c}
			}
		}()
	}
	select {
	case a := <-ch:
		defer a.conn.Close()
		_ = a.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, len(payload))
		n, _ := io.ReadFull(a.conn, buf)
		return a.side, buf[:n]
	case <-time.After(500 * time.Millisecond):
		return "none", nil
	}
}

func TestSplitListenerRoutes(t *testing.T) {
	for _, tc := range []struct {
		name       string
		payload    string
		closeAfter bool
		want       string
	}{
		{name: "short HTTP/1.0 request", payload: "GET / HTTP/1.0\r\n\r\n", want: "http"},
		{name: "HTTP/1.1 POST", payload: "POST /v3/kv/put HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", want: "http"},
		{name: "one byte that is not the preface", payload: "G", want: "http"},
		{name: "HTTP/2 preface", payload: http2Preface + "\x00\x00\x00\x04\x00\x00\x00\x00\x00", want: "grpc"},
		{name: "exactly the preface", payload: http2Preface, want: "grpc"},
		{name: "preface cut short then closed", payload: http2Preface[:10], closeAfter: true, want: "none"},
		{name: "PRI but not HTTP/2", payload: "PRI /x HTTP/1.1\r\n\r\n", want: "http"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			side, got := routeOnce(t, []byte(tc.payload), tc.closeAfter)
			if side != tc.want {
				t.Fatalf("routed to %s, want %s", side, tc.want)
			}
			if side != "none" && string(got) != tc.payload {
				t.Fatalf("%s side read %q, want the payload replayed %q", side, got, tc.payload)
			}
		})
	}
}

// TestSplitListenerServesBoth runs a gRPC server and an HTTP server on one
// port, as the member does.
func TestSplitListenerServesBoth(t *testing.T) {
	root, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewSplitListener(root, nil)
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, health.NewServer())
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "hello") })}
	go func() { _ = s.Serve() }()
	go func() { _ = gs.Serve(s.GRPC()) }()
	go func() { _ = hs.Serve(s.HTTP()) }()
	defer func() {
		_ = hs.Close()
		gs.Stop()
		_ = s.Close()
	}()

	conn, err := grpc.NewClient("passthrough:///"+root.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || res.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC health check = %v, %v; want SERVING", res, err)
	}
	resp, err := http.Get("http://" + root.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "hello" {
		t.Fatalf("HTTP body %q, want hello", body)
	}
}

// FuzzSplitListenerRoute: whatever a client sends first, the connection
// reaches exactly one side with its bytes intact, or (a strict prefix of
// the preface followed by EOF) is dropped.
func FuzzSplitListenerRoute(f *testing.F) {
	for _, seed := range []string{"GET / HTTP/1.1\r\n\r\n", http2Preface, http2Preface[:5], "", "\x16\x03\x01"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		if len(payload) == 0 || len(payload) > 4096 {
			return
		}
		side, got := routeOnce(t, payload, true)
		isPrefixOfPreface := len(payload) < len(http2Preface) && strings.HasPrefix(http2Preface, string(payload))
		want := "http"
		switch {
		case isPrefixOfPreface:
			want = "none"
		case strings.HasPrefix(string(payload), http2Preface):
			want = "grpc"
		}
		if side != want {
			t.Fatalf("payload %q routed to %s, want %s", payload, side, want)
		}
		if side != "none" && string(got) != string(payload) {
			t.Fatalf("read %q, want %q", got, payload)
		}
	})
}

// clientHello returns the first TLS record a Go client sends when it offers
// protos.
func clientHello(t testing.TB, protos []string) []byte {
	t.Helper()
	client, server := net.Pipe()
	defer server.Close()
	go func() {
		c := tls.Client(client, &tls.Config{ServerName: "x", NextProtos: protos})
		_ = c.Handshake() // fails when the pipe closes
		client.Close()
	}()
	var hdr [5]byte
	if _, err := io.ReadFull(server, hdr[:]); err != nil {
		t.Fatal(err)
	}
	rec := make([]byte, 5+(int(hdr[3])<<8|int(hdr[4])))
	copy(rec, hdr[:])
	if _, err := io.ReadFull(server, rec[5:]); err != nil {
		t.Fatal(err)
	}
	return rec
}

func TestSniffTLS(t *testing.T) {
	for _, tc := range []struct {
		name     string
		protos   []string
		wantGRPC bool
	}{
		{name: "gRPC offers h2 alone", protos: []string{"h2"}, wantGRPC: true},
		{name: "curl offers h2 and http/1.1", protos: []string{"h2", "http/1.1"}},
		{name: "HTTP/1.1 only", protos: []string{"http/1.1"}},
		{name: "no ALPN", protos: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := clientHello(t, tc.protos)
			protos, ok := clientHelloALPN(rec[5:])
			if !ok || !slices.Equal(protos, tc.protos) {
				t.Fatalf("clientHelloALPN = %q, %v; want %q", protos, ok, tc.protos)
			}
			prefix, isGRPC, err := sniffTLS(bytes.NewReader(rec))
			if err != nil || isGRPC != tc.wantGRPC || !bytes.Equal(prefix, rec) {
				t.Fatalf("sniffTLS = grpc %v, err %v, replay equal %v; want grpc %v", isGRPC, err, bytes.Equal(prefix, rec), tc.wantGRPC)
			}
		})
	}
	// Plaintext on a TLS port goes to the HTTP side, whose handshake refuses it.
	prefix, isGRPC, err := sniffTLS(strings.NewReader("GET / HTTP/1.1\r\n\r\n"))
	if err != nil || isGRPC || string(prefix) != "GET /" {
		t.Fatalf("plaintext: %q %v %v", prefix, isGRPC, err)
	}
}

// FuzzClientHelloALPN: any bytes parse without panicking, and a truncated
// real hello is never mistaken for a complete one.
func FuzzClientHelloALPN(f *testing.F) {
	f.Add(clientHello(f, []string{"h2"})[5:])
	f.Add(clientHello(f, []string{"h2", "http/1.1"})[5:])
	f.Add([]byte{1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, body []byte) {
		protos, ok := clientHelloALPN(body)
		if !ok && protos != nil {
			t.Fatalf("not ok but returned %q", protos)
		}
	})
}
