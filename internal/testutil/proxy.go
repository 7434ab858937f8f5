package testutil

import (
	"fmt"
	"io"
	"net"
	"sync"
)

// Proxy is a TCP forwarder in front of one member's peer port. The member
// advertises the proxy's address as its peer URL, so every connection
// another member opens to it passes through the proxy, and a test can cut
// them: Blackhole closes the open connections and refuses new ones (each is
// accepted and closed at once), Heal lets connections through again.
//
// A blackholed proxy cuts a member's incoming peer links only: the member
// still dials its peers' proxies. For raft that is a partition all the
// same: every answer to the member's messages (MsgAppResp, MsgHeartbeatResp,
// votes) travels on the peers' own streams to the member, so an isolated
// leader hears from no one, loses quorum (CheckQuorum) and steps down, and
// an isolated follower's pre-votes are never answered. Links from all
// members are cut at once because the proxy cannot tell the dialing
// member from a loopback source address.
//
// Concurrency: all methods are safe from any goroutine. Start and Close
// own the accept goroutine and one pair of copy goroutines per connection.
type Proxy struct {
	ln     net.Listener
	target string

	wg sync.WaitGroup // accept loop and copy goroutines, for Close

	mu struct {
		sync.Mutex
		blackholed bool
		closed     bool
		conns      map[net.Conn]struct{} // both sides of every forwarded connection
	}
}

// NewProxy listens on a free loopback port and forwards to target
// ("127.0.0.1:port"). Call Start to begin accepting.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy for %s: listen: %w", target, err)
	}
	p := &Proxy{ln: ln, target: target}
	p.mu.conns = map[net.Conn]struct{}{}
	return p, nil
}

// Addr is the address the proxy listens on, "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL is Addr as an http URL, for --initial-advertise-peer-urls.
func (p *Proxy) URL() string { return "http://" + p.Addr() }

// Start begins accepting connections in a goroutine.
func (p *Proxy) Start() {
	p.wg.Add(1)
	go p.acceptLoop()
}

// Blackhole closes every forwarded connection and refuses new ones until
// Heal.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mu.blackholed = true
	for c := range p.mu.conns {
		c.Close()
	}
}

// Heal lets new connections through again. Connections cut by Blackhole
// stay closed; the members redial.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mu.blackholed = false
}

// Blackholed reports whether the proxy is refusing connections.
func (p *Proxy) Blackholed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mu.blackholed
}

// Close stops accepting, closes every connection and waits for the
// proxy's goroutines to end.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.mu.closed = true
	for c := range p.mu.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			// Closed by Close; a loopback listener fails for no other reason
			// a test could recover from.
			return
		}
		p.mu.Lock()
		refuse := p.mu.blackholed || p.mu.closed
		p.mu.Unlock()
		if refuse {
			in.Close()
			continue
		}
		p.wg.Add(1)
		go p.forward(in)
	}
}

// forward dials the target for one accepted connection and copies both
// ways until either side ends or Blackhole closes them.
func (p *Proxy) forward(in net.Conn) {
	defer p.wg.Done()
	out, err := net.Dial("tcp", p.target)
	if err != nil {
		// The member is down: the dialer sees the connection close, as it
		// would see a refused dial without the proxy.
		in.Close()
		return
	}
	if !p.track(in, out) {
		in.Close()
		out.Close()
		return
	}
	defer p.untrack(in, out)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		// However the copy ends (EOF, a reset, Blackhole closing the
		// sockets), end both sides, as a real broken link would.
		_, _ = io.Copy(dst, src)
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	<-done
}

// track registers a forwarded pair unless the proxy was blackholed or
// closed while the target was being dialed.
func (p *Proxy) track(in, out net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.blackholed || p.mu.closed {
		return false
	}
	p.mu.conns[in] = struct{}{}
	p.mu.conns[out] = struct{}{}
	return true
}

func (p *Proxy) untrack(in, out net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.mu.conns, in)
	delete(p.mu.conns, out)
}
