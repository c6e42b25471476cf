package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/reservebench/reservebench/admission"
	"github.com/reservebench/reservebench/service"
	"github.com/reservebench/reservebench/strategy"
)

// HTTPFront is the strategy node served over HTTP for a trial of ToolHTTP:
// package service's handler, behind its own admission gate, on a real
// loopback socket, with a client whose keep-alive pool has one connection
// per client. Its Node is a strategy.Strategy that sends every call over
// that socket, so the load generator (Drive) runs unchanged and counts the
// answers as it counts the library's. Close stops what StartHTTPFront
// started, whatever state the trial ended in.
type HTTPFront struct {
	// Addr is the listening address (127.0.0.1:port).
	Addr string
	// Service is the handler, for its counters.
	Service *service.Service
	// Gate is the admission the service asks before the strategy.
	Gate *admission.Gate

	srv       *http.Server
	served    chan error
	transport *http.Transport
	node      *httpNode
	accepted  atomic.Int64

	mu       sync.Mutex
	warm     []net.Conn // dialed before the window, handed to the transport's first dials
	closed   bool
	closeErr error
}

// HTTPFrontConfig is what StartHTTPFront needs.
type HTTPFrontConfig struct {
	// Node is the strategy node the service answers with.
	Node strategy.Strategy
	// Name names the strategy on the service's status page.
	Name string
	// Limits of the service's admission gate.
	Limits admission.Limits
	// Conns is the most connections the client keeps to the service (its
	// keep-alive pool; HTTP/1.1 carries one request at a time per
	// connection, so it is the most requests in flight), and Warm how many
	// of them are connected before the window (the library path's pool is
	// connected before the window too, as pgbench's are).
	Conns, Warm int
	// Quiet is how long a warmed connection may wait for its first request,
	// and a kept-alive one for its next: at least the trial's window, or
	// the server would close connections the client is about to use.
	Quiet time.Duration
	// WorkTimeout bounds each admitted request's strategy call
	// (service.Config.WorkTimeout; 0: the service's default). The service
	// finishes what a client that left had asked, so cancelling the client
	// does not end that work: this does.
	WorkTimeout time.Duration
}

// StartHTTPFront serves cfg.Node over HTTP on 127.0.0.1 (a port of the
// kernel's choosing) and connects cfg.Warm client connections to it.
func StartHTTPFront(ctx context.Context, cfg HTTPFrontConfig) (*HTTPFront, error) {
	if cfg.Conns < 1 {
		return nil, fmt.Errorf("bench: http front: %d connections", cfg.Conns)
	}
	gate, err := admission.New(cfg.Node, cfg.Limits)
	if err != nil {
		return nil, fmt.Errorf("bench: http front: %w", err)
	}
	svc, err := service.New(service.Config{Strategy: cfg.Node, Name: cfg.Name, Admission: gate, WorkTimeout: cfg.WorkTimeout})
	if err != nil {
		return nil, fmt.Errorf("bench: http front: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("bench: http front: listen: %w", err)
	}
	// The service's own server and timeouts (the serve command's), except
	// that an idle connection waits as long as the trial may leave it idle.
	t := service.DefaultTimeouts
	t.ReadHeader = max(t.ReadHeader, cfg.Quiet)
	t.Read = max(t.Read, cfg.Quiet)
	t.Idle = max(t.Idle, cfg.Quiet)
	f := &HTTPFront{Addr: ln.Addr().String(), Service: svc, Gate: gate, srv: svc.Server(t), served: make(chan error, 1)}
	f.srv.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			f.accepted.Add(1)
		}
	}
	go func() { f.served <- f.srv.Serve(ln) }()

	dialer := &net.Dialer{}
	f.transport = &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if c := f.takeWarm(); c != nil {
				return c, nil
			}
			return dialer.DialContext(ctx, network, addr)
		},
		// Go's defaults keep 2 idle connections per host: with more clients
		// every answer would close a connection and the next request dial a
		// new one. One kept-alive connection per client, as a client of a
		// real service keeps.
		MaxConnsPerHost:     cfg.Conns,
		MaxIdleConns:        cfg.Conns,
		MaxIdleConnsPerHost: cfg.Conns,
		IdleConnTimeout:     t.Idle,
		DisableCompression:  true,
	}
	f.node = &httpNode{base: "http://" + f.Addr, client: &http.Client{Transport: f.transport}}
	for i := 0; i < min(cfg.Warm, cfg.Conns); i++ {
		c, err := dialer.DialContext(ctx, "tcp", f.Addr)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("bench: http front: warm connection %d: %w", i, err), f.Close())
		}
		f.mu.Lock()
		f.warm = append(f.warm, c)
		f.mu.Unlock()
	}
	return f, nil
}

func (f *HTTPFront) takeWarm() net.Conn {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.warm) == 0 {
		return nil
	}
	c := f.warm[len(f.warm)-1]
	f.warm = f.warm[:len(f.warm)-1]
	return c
}

// Node is the strategy as a client of the service sees it: Reserve is POST
// /reserve, Lookup GET /reservations/{key}.
func (f *HTTPFront) Node() strategy.Strategy { return f.node }

// Accepted is the number of connections the server accepted so far.
func (f *HTTPFront) Accepted() int64 { return f.accepted.Load() }

// Close drains the service (new requests get 503), shuts the server down
// (the listener first, then every connection once its request is
// answered), and closes the client's connections. It can be called more
// than once.
func (f *HTTPFront) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return f.closeErr
	}
	f.closed = true
	warm := f.warm
	f.warm = nil
	f.mu.Unlock()
	var errs []error
	for _, c := range warm {
		errs = append(errs, c.Close())
	}
	f.Service.Drain()
	f.transport.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := f.srv.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("bench: http front: shutdown: %w", err))
	}
	if err := <-f.served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		errs = append(errs, fmt.Errorf("bench: http front: serve: %w", err))
	}
	f.transport.CloseIdleConnections()
	f.mu.Lock()
	f.closeErr = errors.Join(errs...)
	f.mu.Unlock()
	return f.closeErr
}

// httpNode is a client of the service that answers like a strategy node,
// so that Drive classifies its answers as it classifies the library's: a
// 503 is an *admission.RejectedError (shed) or the strategy's BUSY, a 400
// BAD_REQUEST a refusal, a 500 or a broken connection an unknown outcome
// (an error).
type httpNode struct {
	base   string
	client *http.Client
}

// wireAnswer is the part of the service's JSON answer the client reads.
type wireAnswer struct {
	Outcome      string               `json:"outcome"`
	Status       string               `json:"status"`
	Reservation  *service.Reservation `json:"reservation"`
	RetryAfterMs int64                `json:"retry_after_ms"`
	Field        string               `json:"field"`
	Error        string               `json:"error"`
}

func (n *httpNode) do(req *http.Request) (int, http.Header, wireAnswer, error) {
	resp, err := n.client.Do(req)
	if err != nil {
		return 0, nil, wireAnswer{}, fmt.Errorf("bench: %s %s: %w", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	var a wireAnswer
	// Read the body to its end, so that the connection goes back to the
	// keep-alive pool instead of being closed.
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, resp.Header, a, fmt.Errorf("bench: %s %s: read answer %d: %w", req.Method, req.URL.Path, resp.StatusCode, err)
	}
	if err := json.Unmarshal(body, &a); err != nil {
		return resp.StatusCode, resp.Header, a, fmt.Errorf("bench: %s %s: answer %d is not the service's JSON: %w", req.Method, req.URL.Path, resp.StatusCode, err)
	}
	return resp.StatusCode, resp.Header, a, nil
}

func (n *httpNode) Reserve(ctx context.Context, r strategy.Request) (strategy.Result, error) {
	form := url.Values{"request_key": {r.Key}, "user": {r.User}, "sku": {r.SKU}, "ttl_ms": {strconv.FormatInt(r.TTL.Milliseconds(), 10)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.base+"/reserve", strings.NewReader(form.Encode()))
	if err != nil {
		return strategy.Result{}, fmt.Errorf("bench: POST /reserve: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	code, hdr, a, err := n.do(req)
	if err != nil {
		return strategy.Result{}, err
	}
	switch code {
	case http.StatusCreated, http.StatusOK, http.StatusConflict, http.StatusUnprocessableEntity:
		res := strategy.Result{Outcome: strategy.Outcome(a.Outcome)}
		if a.Reservation != nil {
			res.Reservation = reservationOf(a.Reservation)
		}
		return res, nil
	case http.StatusBadRequest:
		return strategy.Result{Outcome: strategy.OutcomeBadRequest}, &strategy.RequestError{Field: a.Field, Reason: a.Error}
	case http.StatusServiceUnavailable:
		if a.Outcome == string(strategy.OutcomeBusy) { // the strategy's BUSY, as a node answers it
			return strategy.Result{Outcome: strategy.OutcomeBusy}, nil
		}
		if rej := rejection(a, hdr); rej != nil {
			return strategy.Result{}, rej
		}
	}
	return strategy.Result{}, fmt.Errorf("bench: POST /reserve: %d %s: %s", code, a.Outcome, a.Error)
}

func (n *httpNode) Lookup(ctx context.Context, key string) (strategy.Reservation, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.base+"/reservations/"+url.PathEscape(key), nil)
	if err != nil {
		return strategy.Reservation{}, fmt.Errorf("bench: GET /reservations: %w", err)
	}
	code, hdr, a, err := n.do(req)
	if err != nil {
		return strategy.Reservation{}, err
	}
	switch {
	case code == http.StatusOK && a.Reservation != nil:
		return reservationOf(a.Reservation), nil
	case code == http.StatusNotFound && a.Status == string(strategy.StatusNotFound):
		return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, nil
	case code == http.StatusServiceUnavailable:
		if rej := rejection(a, hdr); rej != nil {
			return strategy.Reservation{}, rej
		}
	}
	return strategy.Reservation{}, fmt.Errorf("bench: GET /reservations/%s: %d %s: %s", key, code, a.Outcome, a.Error)
}

// rejection turns the service's 503 back into the gate's refusal: nothing
// was written, and the client may send the same request after the pause.
// The body's retry_after_ms is the gate's pause; the Retry-After header
// rounds it up to whole seconds. A 503 for another reason (the service
// drains) is not admission's, and returns nil.
func rejection(a wireAnswer, hdr http.Header) *admission.RejectedError {
	var reason admission.Reason
	switch a.Outcome {
	case service.OutcomeQueueFull:
		reason = admission.QueueFull
	case service.OutcomeWaitTimeout:
		reason = admission.WaitTimeout
	default:
		return nil
	}
	retry := time.Duration(a.RetryAfterMs) * time.Millisecond
	if retry <= 0 {
		if s, err := strconv.Atoi(hdr.Get("Retry-After")); err == nil {
			retry = time.Duration(s) * time.Second
		}
	}
	return &admission.RejectedError{Reason: reason, Retry: retry}
}

func reservationOf(r *service.Reservation) strategy.Reservation {
	return strategy.Reservation{Key: r.RequestKey, User: r.User, SKU: r.SKU, Status: strategy.Status(r.Status), ExpiresAt: r.ExpiresAt}
}
