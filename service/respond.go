package service

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/reservebench/reservebench/strategy"
)

// answer is the JSON body of every answer.
type answer struct {
	// Outcome of a POST /reserve, or the refusal of any call.
	Outcome string `json:"outcome,omitempty"`
	// Status of a reservation (GET, confirm, release).
	Status      string       `json:"status,omitempty"`
	Reservation *Reservation `json:"reservation,omitempty"`
	// Confirmed or Units: what a confirm or release call moved.
	Confirmed *bool `json:"confirmed,omitempty"`
	Units     *int  `json:"units,omitempty"`
	// RetryAfterMs repeats the Retry-After header of a 503, in milliseconds.
	RetryAfterMs int64  `json:"retry_after_ms,omitempty"`
	Field        string `json:"field,omitempty"`
	Error        string `json:"error,omitempty"`
}

// Reservation is a reservation in an answer.
type Reservation struct {
	RequestKey string    `json:"request_key"`
	User       string    `json:"user"`
	SKU        string    `json:"sku"`
	Status     string    `json:"status"`
	ExpiresAt  time.Time `json:"expires_at"`
}

func reservationOf(r strategy.Reservation) *Reservation {
	return &Reservation{RequestKey: r.Key, User: r.User, SKU: r.SKU, Status: string(r.Status), ExpiresAt: r.ExpiresAt.UTC()}
}

func (s *Service) write(w http.ResponseWriter, code int, body answer) {
	if body.Outcome != "" {
		s.answers.add(body.Outcome)
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body) // a client that left cannot be told anyway
}

// refuse answers 503 with Retry-After: nothing touched the database.
func (s *Service) refuse(w http.ResponseWriter, outcome string) {
	s.unavailable(w, outcome, "not admitted, nothing was written: send the same request again after Retry-After")
}

// refuseBusy answers the strategy's BUSY (its lock was not granted within
// its wait bound, or a component it needs is down) as seed 000 answers a
// request the service could not take: 503 with Retry-After, the same key
// safe to send again, because BUSY promises that nothing was written. It
// is not UNKNOWN (500), which would send the client to look the key up
// first.
func (s *Service) refuseBusy(w http.ResponseWriter) {
	s.unavailable(w, string(strategy.OutcomeBusy), "the strategy could not decide now (a lock not granted within its wait bound, or a component it needs down); nothing was written: send the same request again after Retry-After")
}

func (s *Service) unavailable(w http.ResponseWriter, outcome, why string) {
	retry := s.cfg.Admission.Limits().RetryAfter
	if retry <= 0 {
		retry = time.Second
	}
	// Retry-After is whole seconds (RFC 9110 §10.2.3); round up, never 0.
	secs := max(1, int64(math.Ceil(retry.Seconds())))
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	s.write(w, http.StatusServiceUnavailable, answer{Outcome: outcome, RetryAfterMs: retry.Milliseconds(), Error: why})
}

func (s *Service) refuseInput(w http.ResponseWriter, err error) {
	var ie *InputError
	if !errors.As(err, &ie) {
		ie = &InputError{Status: http.StatusBadRequest, Reason: err.Error()}
	}
	if ie.Status == http.StatusRequestTimeout || ie.Status == http.StatusRequestEntityTooLarge {
		// The rest of the body is not worth reading: close the connection.
		w.Header().Set("Connection", "close")
	}
	s.write(w, ie.Status, answer{Outcome: ie.Outcome(), Field: ie.Field, Error: ie.Error()})
}

func (s *Service) unknownOutcome(w http.ResponseWriter, why string) {
	s.unknown.Add(1)
	s.write(w, http.StatusInternalServerError, answer{Outcome: OutcomeUnknown,
		Error: "the outcome is unknown (" + why + "): GET /reservations/{request_key}, or send the same request again"})
}

// answerCounts counts the answers by outcome, lock-free: the set of
// outcomes is fixed, so the map is built once and only read afterwards.
type answerCounts struct{ m map[string]*atomic.Int64 }

// answerOutcomes are every outcome an answer can carry, in display order.
var answerOutcomes = func() []string {
	var out []string
	for _, o := range strategy.Outcomes {
		out = append(out, string(o))
	}
	return append(out, OutcomeQueueFull, OutcomeWaitTimeout, OutcomeShuttingDown, OutcomeClientGone,
		OutcomeUnknown, OutcomeNotFound, OutcomeNotSupported, OutcomeNoSuchRoute, OutcomeMethodNotAllowed, "BODY_TOO_LARGE", "UNSUPPORTED_MEDIA_TYPE", "REQUEST_TIMEOUT", "OTHER")
}()

func (a *answerCounts) init() {
	a.m = make(map[string]*atomic.Int64, len(answerOutcomes))
	for _, o := range answerOutcomes {
		a.m[o] = new(atomic.Int64)
	}
}

func (a *answerCounts) add(outcome string) {
	c, ok := a.m[outcome]
	if !ok {
		c = a.m["OTHER"]
	}
	c.Add(1)
}

func (a *answerCounts) snapshot() map[string]int64 {
	out := make(map[string]int64, len(a.m))
	for o, c := range a.m {
		if n := c.Load(); n > 0 {
			out[o] = n
		}
	}
	return out
}
