// Package service is seed 000's HTTP face over any strategy: POST /reserve,
// GET /reservations/{request_key}, confirm and release, and a status page,
// with bounded admission in front of every call that touches the database.
//
// # The API
//
//	POST /reserve                         request_key, user, sku, ttl_ms (form body or JSON)
//	  201 HELD, 200 REPLAY (current status), 409 SOLD_OUT | USER_LIMIT, 422 KEY_REUSED,
//	  400 BAD_REQUEST, 413, 415, 408 (the body), 503 REJECTED_QUEUE_FULL |
//	  REJECTED_WAIT_TIMEOUT | REJECTED_SHUTTING_DOWN | BUSY with Retry-After,
//	  500 UNKNOWN (the outcome is unknown: GET the key or send the same request again)
//	GET  /reservations/{request_key}      200 with the status, 404 NOT_FOUND
//	POST /reservations/{request_key}/confirm   200 moved, 409 not moved (current status)
//	POST /reservations/{request_key}/release   200 unit back, 409 not moved (current status)
//	GET  /status                          the gate and the answers so far (seed 004's /inspect)
//
// Every answer is JSON, also for a path the API does not have (404
// NO_SUCH_ROUTE) or a method its path does not take (405
// METHOD_NOT_ALLOWED, with Allow). A strategy without strategy.Confirmer or
// strategy.Releaser answers its endpoint 404 NOT_SUPPORTED.
//
// # What it guarantees
//
//   - Bad input never reaches the gate or the database: the body is read
//     whole (bounded by Config.MaxBody), decoded strictly and validated
//     first; see decode.go for every refusal.
//   - 503 only when nothing was written: the gate refused the call before
//     the strategy saw it, or the strategy answered BUSY (strategy.OutcomeBusy
//     promises that nothing was written), so the same request (same key) may
//     be sent again without a lookup (RFC 9110 §15.6.4, Retry-After §10.2.3).
//   - Once admitted, a request runs to its end whatever its client does: the
//     strategy gets context.WithoutCancel of the request's context, bounded
//     by Config.WorkTimeout, never the client's cancellation. Stats counts
//     the admitted requests whose client left (ClientLeftRunning).
//   - A request whose client leaves while it waits in the queue is dropped
//     before it touches the database (ClientLeftQueued). Started or dropped
//     is decided once: the gate's wait is a single select between taking a
//     slot and the client's context, so exactly one of the two happens (seed
//     004's QUEUED -> RUNNING / QUEUED -> CANCELLED).
//   - Drain stops admitting: new and queued requests get 503
//     REJECTED_SHUTTING_DOWN; admitted ones run to their end.
//
// The admission bound is the Admission the service is given: an
// *admission.Gate bounds one process (several processes over one database
// each admit their own InFlight, and the database sees the sum);
// package admission/pgslots bounds every process that shares a database.
package service

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/reservebench/reservebench/admission"
	"github.com/reservebench/reservebench/strategy"
)

// Admission is what the service asks before a call touches the database.
// *admission.Gate implements it. Acquire refuses with an
// *admission.RejectedError, and then nothing was started.
type Admission interface {
	Acquire(ctx context.Context) (release func(), err error)
	Stats() admission.Stats
	InFlight() int
	Waiting() int
	Limits() admission.Limits
}

var _ Admission = (*admission.Gate)(nil)

// Config is what New needs.
type Config struct {
	// Strategy is the node that answers. Its optional capabilities
	// (Confirmer, Releaser) are probed once, in New.
	Strategy strategy.Strategy
	// Name names the strategy on the status page.
	Name string
	// Admission admits every call that touches the database.
	Admission Admission
	// WorkTimeout bounds an admitted call, which no client can cancel
	// (default DefaultWorkTimeout). When it expires the outcome is unknown
	// (500 UNKNOWN).
	WorkTimeout time.Duration
	// MaxBody bounds a request body (default DefaultMaxBody); a longer
	// one is 413.
	MaxBody int64
}

// Defaults of Config.
const (
	DefaultWorkTimeout       = 10 * time.Second
	DefaultMaxBody     int64 = 4 << 10 // a valid request is under 500 bytes
)

// ErrConfig is matched by the errors of New.
var ErrConfig = errors.New("service: invalid config")

// Service is the HTTP handler. Its methods are safe for concurrent use.
type Service struct {
	cfg  Config
	caps strategy.Capabilities
	mux  *http.ServeMux

	// drainCtx is canceled by Drain.
	drainCtx context.Context
	drain    context.CancelFunc

	running, finished                  atomic.Int64
	clientLeftRunning, clientLeftQueue atomic.Int64
	refusedDraining                    atomic.Int64
	unknown                            atomic.Int64
	answers                            answerCounts
}

// New returns the service over cfg.Strategy.
func New(cfg Config) (*Service, error) {
	switch {
	case cfg.Strategy == nil:
		return nil, fmt.Errorf("%w: no strategy", ErrConfig)
	case cfg.Admission == nil:
		return nil, fmt.Errorf("%w: no admission (use admission.New)", ErrConfig)
	case cfg.WorkTimeout < 0 || cfg.MaxBody < 0:
		return nil, fmt.Errorf("%w: negative WorkTimeout or MaxBody", ErrConfig)
	}
	if cfg.WorkTimeout == 0 {
		cfg.WorkTimeout = DefaultWorkTimeout
	}
	if cfg.MaxBody == 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	s := &Service{cfg: cfg, caps: strategy.ProbeNode(cfg.Strategy)}
	s.drainCtx, s.drain = context.WithCancel(context.Background())
	s.answers.init()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /reserve", s.reserve)
	mux.HandleFunc("GET /reservations/{request_key}", s.lookup)
	mux.HandleFunc("POST /reservations/{request_key}/confirm", s.confirm)
	mux.HandleFunc("POST /reservations/{request_key}/release", s.release)
	mux.HandleFunc("GET /status", s.status)
	s.mux = mux
	return s, nil
}

// ServeHTTP answers one request. A path the API does not have, or a
// method its path does not take, is answered in JSON too (NO_SUCH_ROUTE
// 404, METHOD_NOT_ALLOWED 405 with Allow), not in ServeMux's plain text:
// a client parses every answer the same way.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h, pattern := s.mux.Handler(r)
	if pattern != "" {
		s.mux.ServeHTTP(w, r) // the mux, not h: it sets the path values
		return
	}
	seen := &headerOnly{header: http.Header{}}
	h.ServeHTTP(seen, r) // ServeMux's own answer: which status, and Allow
	switch seen.code {
	case http.StatusMethodNotAllowed:
		w.Header().Set("Allow", seen.header.Get("Allow"))
		s.write(w, seen.code, answer{Outcome: OutcomeMethodNotAllowed,
			Error: fmt.Sprintf("%s %s: this path takes only %s", r.Method, r.URL.Path, seen.header.Get("Allow"))})
	case http.StatusNotFound:
		s.write(w, seen.code, answer{Outcome: OutcomeNoSuchRoute,
			Error: fmt.Sprintf("%s %s: no such endpoint; the API is POST /reserve, GET /reservations/{request_key}, POST /reservations/{request_key}/confirm and /release, GET /status", r.Method, r.URL.Path)})
	default: // a redirect to the cleaned path
		h.ServeHTTP(w, r)
	}
}

// headerOnly keeps the status and headers a handler writes and drops its
// body.
type headerOnly struct {
	header http.Header
	code   int
}

func (h *headerOnly) Header() http.Header         { return h.header }
func (h *headerOnly) Write(b []byte) (int, error) { return len(b), nil }
func (h *headerOnly) WriteHeader(code int)        { h.code = code }

// Drain stops admitting: requests that arrive or still wait in the queue
// get 503 REJECTED_SHUTTING_DOWN; admitted ones run to their end. Call it
// before http.Server.Shutdown, which then waits for them.
func (s *Service) Drain() { s.drain() }

// Capabilities are the strategy's node capabilities, probed once.
func (s *Service) Capabilities() strategy.Capabilities { return s.caps }
