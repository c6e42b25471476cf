// Package redisproxy is a TCP proxy in front of a Redis server that can
// hold one command: armed with a marker (a request key), it holds the
// first chunk a client sends that contains the marker until the caller
// lets it go, and forwards everything else unchanged. The kit uses it to
// put a call of one client between two of another's: a release between an
// expiry job's UPDATE in PostgreSQL and the job's give-back in Redis.
//
// It is ours rather than a library's: toxiproxy and its kin delay or cut a
// whole link, and what is needed here is one command held, picked by its
// content, on whichever connection of a pool it travels.
package redisproxy

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
)

// Proxy is a running proxy. Its methods are safe for concurrent use.
type Proxy struct {
	ln      net.Listener
	network string // of the server: "unix" or "tcp"
	addr    string
	url     string

	mu     sync.Mutex
	marker []byte
	held   chan struct{} // closed when the marked chunk is held
	let    chan struct{} // closed to let it go, by letGo
	letGo  func()
	// drop: every chunk that contains it is not forwarded, and its
	// connection closes, until the Drop is stopped.
	drop    []byte
	dropped chan struct{}
	closed  bool
	conns   []net.Conn
	wg      sync.WaitGroup
}

// Start proxies to the server at redisURL ("redis://[:password@]host:port/db"
// or "unix:///path/redis.sock[?db=N&password=P]") and returns the proxy,
// whose URL clients use instead.
func Start(redisURL string) (*Proxy, error) {
	u, err := url.Parse(redisURL)
	if err != nil {
		return nil, fmt.Errorf("redisproxy: %w", err)
	}
	p := &Proxy{}
	front := url.URL{Scheme: "redis", User: u.User, Path: u.Path}
	switch u.Scheme {
	case "unix":
		p.network, p.addr = "unix", u.Path
		front.Path = "/" + u.Query().Get("db")
		if pw := u.Query().Get("password"); pw != "" {
			front.User = url.UserPassword("", pw)
		}
	case "redis":
		p.network, p.addr = "tcp", u.Host
	default:
		return nil, fmt.Errorf("redisproxy: %q: a redis:// or unix:// address", redisURL)
	}
	if p.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("redisproxy: %w", err)
	}
	front.Host = p.ln.Addr().String()
	p.url = strings.TrimSuffix(front.String(), "/")
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// URL is the address clients connect to.
func (p *Proxy) URL() string { return p.url }

// Hold arms the proxy: the next chunk a client sends that contains marker
// is held until let is called (at most once; Close lets it go too). held
// is closed once such a chunk is held. A new Hold replaces one that held
// nothing yet.
func (p *Proxy) Hold(marker string) (held <-chan struct{}, let func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h, l := make(chan struct{}), make(chan struct{})
	var once sync.Once
	p.marker, p.held, p.let = []byte(marker), h, l
	p.letGo = func() { once.Do(func() { close(l) }) }
	return h, p.letGo
}

// Drop arms the proxy until stop is called: every chunk a client sends
// that contains marker is not forwarded, and its connection is closed, so
// the client sees its command fail and the server never runs it (a client
// that retries on a new connection meets the same). dropped is closed
// once a chunk has been dropped.
func (p *Proxy) Drop(marker string) (dropped <-chan struct{}, stop func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := make(chan struct{})
	p.drop, p.dropped = []byte(marker), d
	return d, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.dropped == d {
			p.drop = nil
		}
	}
}

// dropping reports whether chunk is to be dropped, and says it was.
func (p *Proxy) dropping(chunk []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drop == nil || !bytes.Contains(chunk, p.drop) {
		return false
	}
	select {
	case <-p.dropped:
	default:
		close(p.dropped)
	}
	return true
}

// Close stops the proxy: its listener and every connection close, a held
// chunk is dropped, and its goroutines have ended when Close returns.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		_ = c.Close()
	}
	if p.letGo != nil {
		p.letGo()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial(p.network, p.addr)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			_ = s.Close()
			return
		}
		p.conns = append(p.conns, c, s)
		p.wg.Add(2)
		p.mu.Unlock()
		go p.up(c, s)
		go p.down(c, s)
	}
}

// take disarms the proxy and returns its channels when chunk carries the
// marker.
func (p *Proxy) take(chunk []byte) (held, let chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.marker == nil || !bytes.Contains(chunk, p.marker) {
		return nil, nil
	}
	p.marker = nil
	return p.held, p.let
}

// up forwards what the client sends, holding the marked chunk, or
// dropping it with its connection.
func (p *Proxy) up(c, s net.Conn) {
	defer p.wg.Done()
	defer s.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		if p.dropping(buf[:n]) {
			_ = c.Close()
			return
		}
		if held, let := p.take(buf[:n]); held != nil {
			close(held)
			<-let
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return
			}
		}
		if _, err := s.Write(buf[:n]); err != nil {
			return
		}
	}
}

// down forwards what the server answers.
func (p *Proxy) down(c, s net.Conn) {
	defer p.wg.Done()
	defer c.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := s.Read(buf)
		if err != nil {
			return
		}
		if _, err := c.Write(buf[:n]); err != nil {
			return
		}
	}
}
