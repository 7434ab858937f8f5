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
// A blackholed proxy cuts the links other members dial to this one. The
// member's own dials to its peers go through their proxies: to cut those
// too, each of them must refuse connections from this member, which a
// proxy tells apart by the dialing process (SetSourceOf, BlockSource).
// Cluster.Isolate does both. Blackhole alone is an asymmetric partition:
// with strata's transport, where each member dials the streams it sends
// on, the member can still send but hears no answer; with etcd's, which
// also reads on connections it dialed, less is cut.
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
		conns      map[net.Conn]forwarded // both sides of every forwarded connection
		blocked    map[string]bool        // sources refused (BlockSource)
		sourceOf   func(accepted net.Conn) string
	}
}

// forwarded is one side of a forwarded connection: who dialed it and from
// where, so that a source not named at accept can be named later.
type forwarded struct {
	source   string   // the dialer's name, "" while unknown
	accepted net.Conn // the proxy's end of the dialer's connection
}

// NewProxy listens on a free loopback port and forwards to target
// ("127.0.0.1:port"). Call Start to begin accepting.
func NewProxy(target string) (*Proxy, error) {
	// The port must be one FreePorts has not handed to a process that has
	// not bound it yet, or that process would find it taken.
	var ln net.Listener
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("proxy for %s: listen: %w", target, err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		usedPorts.Lock()
		fresh := !usedPorts.m[port]
		usedPorts.m[port] = true
		usedPorts.Unlock()
		if fresh {
			ln = l
			break
		}
		l.Close()
	}
	p := &Proxy{ln: ln, target: target}
	p.mu.conns = map[net.Conn]forwarded{}
	p.mu.blocked = map[string]bool{}
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

// SetSourceOf names the dialer of each accepted connection (e.g. the
// member whose process holds the other end); BlockSource uses the names.
// Without it every source is "".
func (p *Proxy) SetSourceOf(f func(accepted net.Conn) string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mu.sourceOf = f
}

// BlockSource closes the forwarded connections dialed by source and
// refuses its new ones until UnblockSource.
//
// While any source is blocked the proxy fails closed: a connection whose
// dialer cannot be named is cut and refused as if it were the blocked one.
// A connection whose dialer could not be named when it was accepted is
// looked up again here first, but a lookup can miss a socket at any time
// (one read of /proc/net/tcp skips entries while the table changes), and a
// connection let through unnamed would survive the block: with etcd, whose
// members read their peers' messages on connections they dialed, an
// isolated member would keep hearing its leader. A member that is not
// blocked and was refused this way redials, and is named the next time.
func (p *Proxy) BlockSource(source string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mu.blocked[source] = true
	for c, f := range p.mu.conns {
		if f.source == "" && p.mu.sourceOf != nil {
			f.source = p.mu.sourceOf(f.accepted)
			p.mu.conns[c] = f
		}
		if f.source == source || f.source == "" {
			c.Close()
		}
	}
}

// UnblockSource lets source's connections through again.
func (p *Proxy) UnblockSource(source string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.mu.blocked, source)
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
		sourceOf := p.mu.sourceOf
		p.mu.Unlock()
		if refuse {
			in.Close()
			continue
		}
		p.wg.Add(1)
		go p.forward(in, sourceOf)
	}
}

// forward dials the target for one accepted connection and copies both
// ways until either side ends or Blackhole closes them.
func (p *Proxy) forward(in net.Conn, sourceOf func(net.Conn) string) {
	defer p.wg.Done()
	source := ""
	if sourceOf != nil {
		source = sourceOf(in)
	}
	out, err := net.Dial("tcp", p.target)
	if err != nil {
		// The member is down: the dialer sees the connection close, as it
		// would see a refused dial without the proxy.
		in.Close()
		return
	}
	if !p.track(in, out, source) {
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
// closed, or its source blocked, meanwhile (or before: the source is known
// only after accepting). An unnamed source is refused while any source is
// blocked (BlockSource says why).
func (p *Proxy) track(in, out net.Conn, source string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	unnamedWhileBlocking := source == "" && len(p.mu.blocked) > 0
	if p.mu.blackholed || p.mu.closed || p.mu.blocked[source] || unnamedWhileBlocking {
		return false
	}
	f := forwarded{source: source, accepted: in}
	p.mu.conns[in] = f
	p.mu.conns[out] = f
	return true
}

func (p *Proxy) untrack(in, out net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.mu.conns, in)
	delete(p.mu.conns, out)
}
