package testutil

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// echoServer accepts connections and echoes each line back until closed.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// roundTrip sends a line through a new or given connection and reads it
// back, with a deadline so a refused link fails instead of hanging.
func roundTrip(c net.Conn, line string) error {
	if err := c.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return err
	}
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if got != line+"\n" {
		return errors.New("echo mismatch: " + got)
	}
	return nil
}

func TestProxy(t *testing.T) {
	p, err := NewProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	defer p.Close()
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatalf("dial proxy: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	open := dial()
	if err := roundTrip(open, "before"); err != nil {
		t.Fatalf("through a healthy proxy: %v", err)
	}

	p.Blackhole()
	if !p.Blackholed() {
		t.Fatal("Blackholed() is false after Blackhole")
	}
	if err := roundTrip(open, "cut"); err == nil {
		t.Error("a connection open before Blackhole still carries data")
	}
	if err := roundTrip(dial(), "refused"); err == nil {
		t.Error("a connection opened after Blackhole carries data")
	}

	p.Heal()
	if err := roundTrip(dial(), "after"); err != nil {
		t.Errorf("after Heal: %v", err)
	}
}

func TestProxyTargetDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	p, err := NewProxy(addr)
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("dial proxy: %v", err)
	}
	defer c.Close()
	if err := roundTrip(c, "x"); err == nil {
		t.Error("a connection to a proxy whose target is down carries data")
	}
}

func TestProxyBlockSource(t *testing.T) {
	p, err := NewProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	// Every connection from this test is "a": what BlockSource matches.
	p.SetSourceOf(func(net.Conn) string { return "a" })
	p.Start()
	defer p.Close()
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatalf("dial proxy: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	open := dial()
	if err := roundTrip(open, "x"); err != nil {
		t.Fatal(err)
	}
	p.BlockSource("b")
	if err := roundTrip(open, "other source blocked"); err != nil {
		t.Errorf("blocking another source cut this one: %v", err)
	}
	p.BlockSource("a")
	if err := roundTrip(open, "cut"); err == nil {
		t.Error("a connection from a blocked source still carries data")
	}
	if err := roundTrip(dial(), "refused"); err == nil {
		t.Error("a new connection from a blocked source carries data")
	}
	p.UnblockSource("a")
	if err := roundTrip(dial(), "after"); err != nil {
		t.Errorf("after UnblockSource: %v", err)
	}
}

// TestProxyBlockSourceResolvesLate covers a dialer whose process could not
// be named when its connection was accepted (its socket missed in one read
// of /proc/net/tcp): BlockSource must name it again and cut it, or an etcd
// member that reads its peers' messages on connections it dialed keeps
// hearing its leader through an Isolate.
func TestProxyBlockSourceResolvesLate(t *testing.T) {
	p, err := NewProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	var lookups atomic.Int32
	p.SetSourceOf(func(net.Conn) string {
		if lookups.Add(1) == 1 {
			return "" // the first lookup, at accept, finds no owner
		}
		return "a"
	})
	p.Start()
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("dial proxy: %v", err)
	}
	defer c.Close()
	if err := roundTrip(c, "x"); err != nil {
		t.Fatal(err)
	}
	p.BlockSource("a")
	if err := roundTrip(c, "cut"); err == nil {
		t.Error("a connection whose source was named only after accept still carries data once that source is blocked")
	}
}

// TestProxyBlockSourceFailsClosed covers a dialer that is never named
// (every lookup of its socket misses): while a source is blocked, such a
// connection is cut and a new one refused, since it may be the blocked
// source's; once nothing is blocked it passes again.
func TestProxyBlockSourceFailsClosed(t *testing.T) {
	p, err := NewProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	p.SetSourceOf(func(net.Conn) string { return "" })
	p.Start()
	defer p.Close()
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatalf("dial proxy: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	open := dial()
	if err := roundTrip(open, "x"); err != nil {
		t.Fatal(err)
	}
	p.BlockSource("a")
	if err := roundTrip(open, "cut"); err == nil {
		t.Error("an unnamed connection still carries data while a source is blocked")
	}
	if err := roundTrip(dial(), "refused"); err == nil {
		t.Error("a new unnamed connection carries data while a source is blocked")
	}
	p.UnblockSource("a")
	if err := roundTrip(dial(), "after"); err != nil {
		t.Errorf("after UnblockSource: %v", err)
	}
}

func TestSocketOwner(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	accepted, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer accepted.Close()
	// The dialer, the holder of accepted's other end, is this process.
	if pid, ok := socketOwner(accepted, []int{os.Getpid()}); !ok || pid != os.Getpid() {
		t.Errorf("socketOwner(%v) = %d, %v; want %d, true", accepted.RemoteAddr(), pid, ok, os.Getpid())
	}
	if _, ok := socketOwner(accepted, []int{1 << 30}); ok {
		t.Error("socketOwner found the socket in a process that does not exist")
	}
}

// TestSocketInode reads tables in /proc/net/tcp's format. The dialer's
// address alone does not name a socket: the CI run that failed
// TestSocketOwner found its port first on a TIME_WAIT line (inode 0) of an
// earlier connection, and Linux gives one ephemeral port to connections
// with different destinations.
func TestSocketInode(t *testing.T) {
	const header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
	line := func(local, remote, state, inode string) string {
		return fmt.Sprintf("   0: %s %s %s 00000000:00000000 00:00000000 00000000  1000        0 %s 1 0000000000000000 20 4 30 10 -1\n", local, remote, state, inode)
	}
	dialer := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 0xEBBC}
	proxy := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 0x9C41}
	const d, p, o = "0100007F:EBBC", "0100007F:9C41", "0100007F:1F90"
	for _, tc := range []struct {
		name  string
		table string
		want  string
	}{
		{"only the socket", line(d, p, "01", "4242"), "4242"},
		{"after a TIME_WAIT from the same port", line(d, o, "06", "0") + line(d, p, "01", "4242"), "4242"},
		{"after a live socket from the same port to elsewhere", line(d, o, "01", "777") + line(d, p, "01", "4242"), "4242"},
		{"the same ends in TIME_WAIT only", line(d, p, "06", "0"), ""},
		{"the other direction", line(p, d, "01", "555"), ""},
		{"absent", line(o, p, "01", "555"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := socketInode(strings.NewReader(header+tc.table), dialer, proxy)
			if err != nil || got != tc.want {
				t.Errorf("socketInode = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
