package strategytest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/reservebench/reservebench/admission"
	"github.com/reservebench/reservebench/service"
	"github.com/reservebench/reservebench/strategy"
)

// The http-* scenarios put package service in front of the strategy, on a
// loopback socket, and talk to it over real connections. Between the
// service and the strategy the harness inserts work: the seed's extra work
// per request and the latch that holds admitted requests, both test hooks
// of the front, never code in the strategy. work also counts, on its own,
// what reaches the strategy, so the checks do not rest on the gate's word.

// work wraps the strategy node the service calls.
type work struct {
	inner strategy.Strategy
	// delay is extra work per Reserve, after the latch, before the
	// strategy. The service's context bounds it.
	delay time.Duration
	// latch, when set, holds every Reserve until it is closed.
	latch chan struct{}

	inFlight, maxInFlight atomic.Int64
	mu                    sync.Mutex
	entered, returned     map[string]int // Reserve calls by key
}

func newWork(inner strategy.Strategy, delay time.Duration, latched bool) *work {
	w := &work{inner: inner, delay: delay, entered: map[string]int{}, returned: map[string]int{}}
	if latched {
		w.latch = make(chan struct{})
	}
	return w
}

func (w *work) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	raiseMax(&w.maxInFlight, w.inFlight.Add(1))
	defer w.inFlight.Add(-1)
	w.mu.Lock()
	w.entered[req.Key]++
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.returned[req.Key]++
		w.mu.Unlock()
	}()
	if w.latch != nil {
		select {
		case <-w.latch:
		case <-ctx.Done():
			return strategy.Result{}, fmt.Errorf("held on the latch: %w", ctx.Err())
		}
	}
	if w.delay > 0 {
		t := time.NewTimer(w.delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return strategy.Result{}, fmt.Errorf("during the extra work: %w", ctx.Err())
		}
	}
	return w.inner.Reserve(ctx, req)
}

func (w *work) Lookup(ctx context.Context, key string) (strategy.Reservation, error) {
	return w.inner.Lookup(ctx, key)
}

// calls returns the Reserve calls that entered and returned for key.
func (w *work) calls(key string) (entered, returned int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.entered[key], w.returned[key]
}

// total is the number of Reserve calls that reached the wrapper.
func (w *work) total() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, c := range w.entered {
		n += c
	}
	return n
}

func raiseMax(m *atomic.Int64, v int64) {
	for {
		cur := m.Load()
		if v <= cur || m.CompareAndSwap(cur, v) {
			return
		}
	}
}

// front is the service listening on a loopback port.
type front struct {
	addr   string
	svc    *service.Service
	gate   service.Admission
	work   *work
	srv    *http.Server
	ln     net.Listener
	served chan error
	client *http.Client

	closeOnce sync.Once
	closeErr  error
}

// frontOptions shape a front.
type frontOptions struct {
	limits  admission.Limits
	delay   time.Duration
	latched bool
	read    time.Duration // the server's read timeouts (default 5s)
	clients int           // connections to keep alive (default 8)
}

// startFront starts the service over node 0 of the trial's deployment.
// Env.Admission, when set, makes the gate.
func (t *trial) startFront(o frontOptions) (*front, error) {
	w := newWork(t.node(0), o.delay, o.latched)
	var gate service.Admission
	var err error
	if t.env.Admission != nil {
		gate, err = t.env.Admission(w, o.limits)
	} else {
		gate, err = admission.New(w, o.limits)
	}
	if err != nil {
		return nil, fmt.Errorf("front: %w", err)
	}
	svc, err := service.New(service.Config{Strategy: w, Name: t.env.Meta.Name, Admission: gate, WorkTimeout: 30 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("front: %w", err)
	}
	read := o.read
	if read == 0 {
		read = 5 * time.Second
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("front: %w", err)
	}
	srv := svc.Server(service.Timeouts{ReadHeader: read, Read: read, Idle: time.Minute})
	f := &front{addr: ln.Addr().String(), svc: svc, gate: gate, work: w, srv: srv, ln: ln, served: make(chan error, 1)}
	go func() { f.served <- srv.Serve(ln) }()
	conns := max(o.clients, 8)
	f.client = &http.Client{
		Transport: &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns, IdleConnTimeout: time.Minute},
		Timeout:   time.Minute, // a bound, never reached by a working front
	}
	return f, nil
}

// close stops the front, waiting for what it admitted, and checks that
// nothing listens on its port afterwards. Calls after the first return the
// first's error.
func (f *front) close() error {
	f.closeOnce.Do(func() { f.closeErr = f.shutdown() })
	return f.closeErr
}

func (f *front) shutdown() error {
	if f.work.latch != nil {
		select {
		case <-f.work.latch:
		default:
			close(f.work.latch)
		}
	}
	f.svc.Drain()
	// The client's idle connections first: a connection its transport
	// dialled for a request that then went out on another one never sent a
	// byte, and Shutdown counts such a connection as busy until it is 5 s
	// old (net/http, golang/go#22682): half the http-admission trials
	// waited 3.7 s for it.
	f.client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := f.srv.Shutdown(ctx)
	if serr := <-f.served; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	f.client.CloseIdleConnections()
	// Our own listener must be closed. (Dialling the address would test
	// the port, which another process may have bound since: on a busy
	// machine ephemeral ports come round again.)
	if tl, ok := f.ln.(*net.TCPListener); ok {
		if derr := tl.SetDeadline(time.Now()); !errors.Is(derr, net.ErrClosed) && err == nil {
			err = fmt.Errorf("front: the listener on %s is still open after shutdown", f.addr)
		}
	}
	return err
}

// httpAnswer is an answer of the service, as a client reads it.
type httpAnswer struct {
	code       int
	retryAfter string
	Outcome    string `json:"outcome"`
	Status     string `json:"status"`
	Field      string `json:"field"`
	Error      string `json:"error"`
	// Reservation is the reservation the answer carries, if any.
	Reservation *struct {
		RequestKey string    `json:"request_key"`
		User       string    `json:"user"`
		SKU        string    `json:"sku"`
		Status     string    `json:"status"`
		ExpiresAt  time.Time `json:"expires_at"`
	} `json:"reservation"`
}

func (a httpAnswer) String() string {
	s := strconv.Itoa(a.code) + " " + a.Outcome + a.Status
	if a.Field != "" {
		s += " (" + a.Field + ")"
	}
	return s
}

func readAnswer(resp *http.Response) (httpAnswer, error) {
	defer resp.Body.Close()
	a := httpAnswer{code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return a, err
	}
	if len(b) > 0 && resp.Header.Get("Content-Type") == "application/json; charset=utf-8" {
		if err := json.Unmarshal(b, &a); err != nil {
			return a, fmt.Errorf("answer %d: %v: %q", a.code, err, b)
		}
	}
	return a, nil
}

// formBody is the seed's form body of a POST /reserve.
func formBody(req strategy.Request) string {
	v := url.Values{"request_key": {req.Key}, "user": {req.User}, "sku": {req.SKU}, "ttl_ms": {strconv.FormatInt(req.TTL.Milliseconds(), 10)}}
	return v.Encode()
}

// reserve sends POST /reserve with a form body.
func (f *front) reserve(ctx context.Context, req strategy.Request) (httpAnswer, error) {
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+f.addr+"/reserve", bytes.NewBufferString(formBody(req)))
	if err != nil {
		return httpAnswer{}, err
	}
	hr.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	// The request is idempotent by its key, and saying so lets the client
	// send it again on a new connection when the one it took from its idle
	// pool turns out closed: a connection dialled for a request that then
	// went out on another sat unused, and the server closes such a
	// connection after its ReadHeaderTimeout (5 s). A POST sent on it as the
	// server closed it was lost with "connection reset by peer" (CI, under
	// the race detector: 2 of http-admission's 120 clients, 5.1 and 7.7 s
	// into the trial); net/http resends only what it knows is replayable.
	hr.Header.Set("Idempotency-Key", req.Key)
	resp, err := f.client.Do(hr)
	if err != nil {
		return httpAnswer{}, err
	}
	return readAnswer(resp)
}

// get sends GET /reservations/{key}.
func (f *front) get(ctx context.Context, key string) (httpAnswer, error) {
	hr, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+f.addr+"/reservations/"+url.PathEscape(key), nil)
	if err != nil {
		return httpAnswer{}, err
	}
	resp, err := f.client.Do(hr)
	if err != nil {
		return httpAnswer{}, err
	}
	return readAnswer(resp)
}

// raw sends bytes on a connection of its own and reads the answer, or
// reports that the server closed the connection without one (code 0).
// halfClose closes the client's sending side after the bytes.
func (f *front) raw(data []byte, halfClose bool) (httpAnswer, error) {
	conn, err := net.DialTimeout("tcp", f.addr, 5*time.Second)
	if err != nil {
		return httpAnswer{}, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Minute)) // a bound, never reached by a working front
	if _, err := conn.Write(data); err != nil {
		return httpAnswer{}, err
	}
	if halfClose {
		if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
			return httpAnswer{}, err
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err) {
			return httpAnswer{}, nil // closed without an answer
		}
		return httpAnswer{}, err
	}
	return readAnswer(resp)
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "read"
}

// rawPost builds a POST /reserve with the given content type and body;
// contentLength < 0 uses the body's length.
func rawPost(contentType string, body []byte, contentLength int) []byte {
	var b bytes.Buffer
	b.WriteString("POST /reserve HTTP/1.1\r\nHost: front\r\n")
	if contentType != "" {
		b.WriteString("Content-Type: " + contentType + "\r\n")
	}
	if contentLength < 0 {
		contentLength = len(body)
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\nConnection: close\r\n\r\n", contentLength)
	b.Write(body)
	return b.Bytes()
}

// until polls cond every millisecond until it holds, for at most limit:
// the harness waits for states it can read (the gate's counters, the work
// wrapper's), never for time to pass.
func until(ctx context.Context, limit time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not reached within %v", what, limit)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// httpOp records an HTTP answer to a reserve as an operation of the
// history: 201/200 took effect, 409/422/400 did not, anything else (a 500,
// a connection lost) is unknown.
func httpOp(op Op, a httpAnswer, err error) Op {
	op.Kind = "reserve"
	op.Outcome = strategy.Outcome(a.Outcome)
	switch {
	case err != nil:
		op.Type, op.Err = OpInfo, err.Error()
	case a.code == http.StatusCreated || a.code == http.StatusOK:
		op.Type = OpOK
	case a.code == http.StatusConflict || a.code == http.StatusUnprocessableEntity || a.code == http.StatusBadRequest:
		op.Type = OpFail
	default:
		op.Type, op.Err = OpInfo, a.String()+": "+a.Error
	}
	if r := a.Reservation; err == nil && r != nil {
		op.Answer = strategy.Reservation{Key: r.RequestKey, User: r.User, SKU: r.SKU, Status: strategy.Status(r.Status), ExpiresAt: r.ExpiresAt}
	}
	return op
}
