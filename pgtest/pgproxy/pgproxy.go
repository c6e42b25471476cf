// Package pgproxy is a TCP proxy between PostgreSQL clients and a server,
// for the partition faults of the test suite: it forwards the wire protocol
// unchanged until told to cut a connection at a chosen point, or to go dark
// for every connection at once.
//
// It listens on loopback TCP and dials the server's Unix socket (the test
// clusters listen on nothing else) or its TCP address. It reads the
// protocol's message framing in both directions, enough to know which SQL a
// client is executing (a simple Query, or the statement a Bind names) and
// where the server's answer to it ends (ReadyForQuery), and which backend
// serves the connection (BackendKeyData). A [Fault] armed with Arm lets the
// matching statement reach the server and be executed, swallows the answer,
// and then either resets the connection (Drop) or leaves it open and silent
// (Blackhole) until Heal: the client cannot tell whether the statement, or
// the COMMIT, took effect; or it holds the end of the answer until Deliver
// (Delay): the client learns late that a statement took effect, as over a
// slow network, while the test does something in between. Dark makes every connection, existing and new,
// silent until Heal, as a network partition would. LoseCancels swallows
// the clients' cancel requests.
//
// Everything runs in goroutines of the test process: when that process
// dies, its sockets close with it and the server ends the backends.
package pgproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"sync"
	"time"
)

// Point says which statement a fault hits.
type Point string

const (
	// Write is the first statement of a transaction that writes (INSERT,
	// UPDATE, DELETE, MERGE, or a WITH that does): it is executed, and the
	// client never learns its outcome. Inside an explicit transaction the
	// server rolls the transaction back when the connection goes; in
	// autocommit the write is committed.
	Write Point = "statement"
	// Commit is a COMMIT: it is executed, and the client never learns that
	// it succeeded.
	Commit Point = "commit"
	// Committed is the end of a transaction that wrote, whatever the
	// statement: the server's ReadyForQuery, idle, after an autocommit
	// write or after the COMMIT of a transaction that wrote. The rest of
	// that answer has reached the client; the ReadyForQuery, which the
	// client waits for before it returns, gets the action.
	Committed Point = "committed"
)

// Action says what happens to a connection once the statement it hit has
// been executed and its answer swallowed.
type Action string

const (
	// Drop resets the connection at once.
	Drop Action = "drop"
	// Blackhole keeps it open and forwards nothing either way until Heal.
	Blackhole Action = "blackhole"
	// Delay holds the end of the answer (its ReadyForQuery) until Deliver,
	// then forwards it, and the connection goes on: the statement took
	// effect, and the client learns it late. At Write and Commit the
	// answer's other messages are forwarded, not swallowed.
	Delay Action = "delay"
)

// Fault is armed with Arm: the next Hits statements at Point, each on a
// connection of its own, get Action.
type Fault struct {
	Point  Point
	Action Action
	Hits   int
}

// Hit is a connection a fault hit, reported once the server had executed
// the statement.
type Hit struct {
	Fault Fault
	// SQL is the statement that was hit.
	SQL string
	// Backend is the server process of the connection, from BackendKeyData.
	Backend uint32
	// At is when the server's answer was swallowed.
	At time.Time
}

// Proxy is a running proxy. Its methods are safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	dial   func(ctx context.Context) (net.Conn, error)
	target string

	mu    sync.Mutex
	links map[*link]struct{}
	armed *Fault
	left  int // hits left of armed
	// delivered is closed by Deliver: the answers a Delay holds go on.
	delivered chan struct{}
	dark      bool
	closed    bool
	// losing: cancel requests are swallowed; lost counts them.
	losing bool
	// keeping: a client's Terminate and close are not passed on (KeepOrphans).
	keeping bool
	lost    int
	// gone: the backends of the connections that have closed.
	gone []uint32
	hits chan Hit
	wg   sync.WaitGroup
}

// Start listens on a free loopback port and proxies to the server at host
// and port as libpq names them: a host that starts with "/" is the
// directory of a Unix socket (.s.PGSQL.<port>), any other a TCP host.
func Start(host string, port uint16) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("pgproxy: listen: %w", err)
	}
	p := &Proxy{ln: ln, links: map[*link]struct{}{}, hits: make(chan Hit, 64)}
	p.SetTarget(host, port)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// SetTarget points new connections at another server (a promoted
// standby, after a failover); connections already open stay where they
// are.
func (p *Proxy) SetTarget(host string, port uint16) {
	network, addr := "tcp", net.JoinHostPort(host, strconv.Itoa(int(port)))
	if len(host) > 0 && host[0] == '/' {
		network, addr = "unix", fmt.Sprintf("%s/.s.PGSQL.%d", host, port)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = network + ":" + addr
	p.dial = func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
}

// Addr is the host and port clients connect to.
func (p *Proxy) Addr() (string, uint16) {
	a := p.ln.Addr().(*net.TCPAddr)
	return a.IP.String(), uint16(a.Port)
}

// Target is where the proxy forwards to, e.g. "unix:/tmp/x/.s.PGSQL.5432".
func (p *Proxy) Target() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.target
}

func (p *Proxy) dialer() func(context.Context) (net.Conn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dial
}

// Arm sets the fault the next matching statements get, replacing any fault
// still armed.
func (p *Proxy) Arm(f Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed, p.left = &f, f.Hits
	if f.Action == Delay {
		p.delivered = make(chan struct{})
	}
}

// Deliver forwards the answers that a Delay fault holds, and those it will
// hold until the next Arm.
func (p *Proxy) Deliver() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.delivered != nil {
		close(p.delivered)
		p.delivered = nil
	}
}

// deliveredChan is what a link that a Delay hit waits on; closed when
// nothing is to be held.
func (p *Proxy) deliveredChan() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.delivered == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return p.delivered
}

// Hits delivers each connection a fault hit, once the server has executed
// the statement.
func (p *Proxy) Hits() <-chan Hit { return p.hits }

// Dark makes every connection silent, those open and those that come: the
// proxy accepts them and forwards nothing either way, until Heal.
func (p *Proxy) Dark() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dark = true
	for l := range p.links {
		l.silence()
	}
}

// LoseCancels makes the proxy swallow every CancelRequest from now on (on
// true) or forward them again (false). A cancel request travels on a
// connection of its own, and a load balancer that routes it elsewhere, or a
// partition, loses it: the server never learns that the client gave up, and
// a statement it was running, or a COMMIT waiting for a standby, goes on.
func (p *Proxy) LoseCancels(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.losing = on
}

// KeepOrphans makes the proxy keep the server side of a connection open
// when its client leaves (on true): the client's Terminate is not passed
// on and its close is not either, as when a client process dies behind a
// load balancer that keeps the server connection, or its FIN is lost. The
// backend finishes what it was running (a COMMIT held by a lock goes
// through when the lock is let go) and stays, idle, in pg_stat_activity
// until EndOrphans, Heal or Close. With LoseCancels, a client that gave up
// on a statement leaves a backend that outlives its answer.
func (p *Proxy) KeepOrphans(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keeping = on
}

// EndOrphans closes the server side of every connection whose client left
// while KeepOrphans was on: their backends end.
func (p *Proxy) EndOrphans() {
	p.mu.Lock()
	var orphans []*link
	for l := range p.links {
		if l.isOrphan() {
			orphans = append(orphans, l)
		}
	}
	p.mu.Unlock()
	for _, l := range orphans {
		l.close()
	}
}

// Orphans are the backends of the connections whose client left while
// KeepOrphans was on, and that are still open.
func (p *Proxy) Orphans() []uint32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []uint32
	for l := range p.links {
		if l.isOrphan() {
			out = append(out, l.backendPID())
		}
	}
	return out
}

func (p *Proxy) keepingOrphans() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.keeping
}

// LostCancels is the number of cancel requests the proxy swallowed.
func (p *Proxy) LostCancels() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lost
}

// Closed is the backend of every connection that has closed, client and
// server side, in the order they closed. The server learns of the close only
// when it next reads from the connection: a backend whose COMMIT waits for a
// standby is still there, and so, for a moment, is one that has finished and
// is on its way out. Wait for these pids to leave pg_stat_activity before
// reading what such a backend did.
func (p *Proxy) Closed() []uint32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]uint32(nil), p.gone...)
}

// loseCancel reports whether a cancel request is to be swallowed, and
// counts it if so.
func (p *Proxy) loseCancel() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.losing {
		p.lost++
	}
	return p.losing
}

// Heal ends every silence: the silent connections are reset (as a
// partition that ends finds them, or a TCP timeout ends them), and new
// connections are forwarded again. A fault still armed stays armed.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.dark = false
	var silent []*link
	for l := range p.links {
		if l.isSilent() {
			silent = append(silent, l)
		}
	}
	p.mu.Unlock()
	for _, l := range silent {
		l.close()
	}
}

// Reset resets the connection of this backend (one a Blackhole fault
// silenced, say) and reports whether there was one.
func (p *Proxy) Reset(backend uint32) bool {
	p.mu.Lock()
	var found *link
	for l := range p.links {
		if l.backendPID() == backend {
			found = l
		}
	}
	p.mu.Unlock()
	if found == nil {
		return false
	}
	found.close()
	return true
}

// Open is the number of connections the proxy holds.
func (p *Proxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Close stops listening, resets every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, l := range links {
		l.close()
	}
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		l := &link{p: p, client: c, gone: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			return
		}
		p.links[l] = struct{}{}
		dark := p.dark
		if dark {
			// Silent before Heal can look: marked only once run began, a
			// link accepted just before a Heal escaped its reset and stayed
			// silent for good (a cancel request on it hung pgx's cleanup of
			// a connection for its whole 15 s).
			l.silence()
		}
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			l.run(dark)
			p.mu.Lock()
			delete(p.links, l)
			if pid := l.backendPID(); pid != 0 {
				p.gone = append(p.gone, pid)
			}
			p.mu.Unlock()
		}()
	}
}

// take reports whether a statement with this SQL gets the armed fault, and
// counts the hit.
func (p *Proxy) take(sql string, inTx bool) (Fault, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.armed == nil || p.left == 0 || !matches(p.armed.Point, sql, inTx) {
		return Fault{}, false
	}
	p.left--
	return *p.armed, true
}

// takeCommitted reports whether the end of a transaction that wrote gets
// the armed fault (Committed), and counts the hit.
func (p *Proxy) takeCommitted() (Fault, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.armed == nil || p.left == 0 || p.armed.Point != Committed {
		return Fault{}, false
	}
	p.left--
	return *p.armed, true
}

func (p *Proxy) report(h Hit) {
	select {
	case p.hits <- h:
	default: // nobody reads them; the hit happened all the same
	}
}

var (
	writeSQL  = regexp.MustCompile(`(?is)^\s*(insert|update|delete|merge)\b|^\s*with\b.*\b(insert|update|delete)\b`)
	commitSQL = regexp.MustCompile(`(?is)^\s*(commit|end)\s*;?\s*$`)
)

// matches reports whether sql is at point. A write matches only as the
// first write of its transaction (inTx: an earlier write of the same
// transaction was already forwarded).
func matches(point Point, sql string, inTx bool) bool {
	switch point {
	case Write:
		return !inTx && writeSQL.MatchString(sql)
	case Commit:
		return commitSQL.MatchString(sql)
	}
	return false
}
