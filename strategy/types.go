package strategy

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Outcome is the answer to one Reserve call.
type Outcome string

// The outcomes of Reserve. Only OutcomeHeld creates a reservation. A
// request whose key is known is answered about that key (REPLAY or
// KEY_REUSED) whatever else holds: the SKU sold out, or its user at the
// limit under another key.
const (
	OutcomeHeld       Outcome = "HELD"        // a new reservation holds one unit
	OutcomeReplay     Outcome = "REPLAY"      // the key was already known; Result.Reservation is its current state
	OutcomeSoldOut    Outcome = "SOLD_OUT"    // no unit could be handed out; nothing was written
	OutcomeUserLimit  Outcome = "USER_LIMIT"  // the user already holds an active reservation for the SKU; nothing was written
	OutcomeKeyReused  Outcome = "KEY_REUSED"  // the key is known with another user or SKU; nothing was written
	OutcomeBadRequest Outcome = "BAD_REQUEST" // a field is missing or invalid, or the SKU is unknown; nothing was written
	// OutcomeBusy: the strategy could not decide now (its lock was not
	// granted within its wait bound, or a component it needs is down);
	// nothing was written, and sending the same request again is safe. It
	// is a definite refusal, like SOLD_OUT, not an unknown outcome: an
	// HTTP service answers it 429 or 503 with Retry-After.
	OutcomeBusy Outcome = "BUSY"
)

// Outcomes lists every outcome in a fixed order, for tables and counters.
var Outcomes = []Outcome{OutcomeHeld, OutcomeReplay, OutcomeSoldOut, OutcomeUserLimit, OutcomeKeyReused, OutcomeBadRequest, OutcomeBusy}

// Status is the state of a reservation.
type Status string

// The statuses of a reservation. HELD and CONFIRMED are active: they hold a unit.
const (
	StatusHeld      Status = "HELD"
	StatusConfirmed Status = "CONFIRMED"
	StatusReleased  Status = "RELEASED"
	StatusExpired   Status = "EXPIRED"
	StatusNotFound  Status = "NOT_FOUND" // no committed reservation has this key
)

// Active reports whether a reservation in this status holds a unit.
func (s Status) Active() bool { return s == StatusHeld || s == StatusConfirmed }

// Limits on request fields. They keep keys indexable and make oversized input a
// BAD_REQUEST instead of a database error.
const (
	MaxKeyLen  = 128 // bytes
	MaxUserLen = 64  // bytes
	MaxSKULen  = 64  // bytes
	MaxTTL     = 24 * time.Hour
)

// Request asks for one unit of SKU for User. Key identifies the request: sending
// the same Request again, also concurrently, must never create a second
// reservation.
type Request struct {
	Key  string
	User string
	SKU  string
	// TTL is how long the reservation is held before it may expire: a HELD
	// reservation's ExpiresAt is TTL after the moment it was made. For a
	// reservation made in an attempt held open (Session), that moment may
	// be the attempt's start, as now() in its transaction reads it, or the
	// call's: every strategy here takes the attempt's start, and an attempt
	// held open long before its Reserve gets a reservation that much
	// shorter.
	TTL time.Duration
}

// Reservation is the state of one reservation as committed in the database.
type Reservation struct {
	Key       string
	User      string
	SKU       string
	Status    Status
	ExpiresAt time.Time
}

// Result is the answer to a Reserve call whose outcome is known.
type Result struct {
	Outcome Outcome
	// Reservation is set for HELD and REPLAY (for REPLAY: the existing
	// reservation in its current status). For KEY_REUSED it is the reservation
	// that owns the key.
	Reservation Reservation
}

// ErrBadRequest is matched (errors.Is) by every error that rejects a request
// before anything is written: a *RequestError.
var ErrBadRequest = errors.New("bad request")

// RequestError says which field of a Request is invalid. Reserve returns it
// together with a Result whose Outcome is OutcomeBadRequest.
type RequestError struct {
	Field  string // "key", "user", "sku" or "ttl"
	Reason string
}

func (e *RequestError) Error() string {
	return fmt.Sprintf("bad request: %s: %s", e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrBadRequest) true for every *RequestError.
func (e *RequestError) Is(target error) bool { return target == ErrBadRequest }

// UnknownSKU is the error a strategy returns when the request names a SKU that
// has no stock in its deployment. It is a BAD_REQUEST: nothing is written.
func UnknownSKU(sku string) *RequestError {
	return &RequestError{Field: "sku", Reason: fmt.Sprintf("unknown sku %q", sku)}
}

// Validate checks the fields of r that need no database: presence, length,
// UTF-8 and TTL range. Whether the SKU exists is the strategy's to check (see
// UnknownSKU). Every strategy calls Validate before touching the database.
func (r Request) Validate() error {
	if err := checkText("key", r.Key, MaxKeyLen); err != nil {
		return err
	}
	if err := checkText("user", r.User, MaxUserLen); err != nil {
		return err
	}
	if err := checkText("sku", r.SKU, MaxSKULen); err != nil {
		return err
	}
	if r.TTL <= 0 {
		return &RequestError{Field: "ttl", Reason: fmt.Sprintf("must be positive, got %v", r.TTL)}
	}
	if r.TTL > MaxTTL {
		return &RequestError{Field: "ttl", Reason: fmt.Sprintf("must be at most %v, got %v", MaxTTL, r.TTL)}
	}
	return nil
}

// Storable reports whether PostgreSQL text can hold key: valid UTF-8 without
// NUL. A key it cannot hold was never stored, so Lookup of such a key answers
// NOT_FOUND without querying, and Confirm and Release move nothing: no query
// fails on the encoding. (Validate refuses such keys in a Request; Lookup and
// the transitions take a bare key.)
func Storable(key string) bool {
	return utf8.ValidString(key) && !strings.ContainsRune(key, 0)
}

// BadRequest is the Result and error a strategy returns for an invalid request.
func BadRequest(err error) (Result, error) {
	return Result{Outcome: OutcomeBadRequest}, err
}

func checkText(field, v string, max int) error {
	switch {
	case v == "":
		return &RequestError{Field: field, Reason: "missing"}
	case len(v) > max:
		return &RequestError{Field: field, Reason: fmt.Sprintf("longer than %d bytes (%d)", max, len(v))}
	case !utf8.ValidString(v):
		return &RequestError{Field: field, Reason: "not valid UTF-8"}
	}
	for _, c := range v {
		// PostgreSQL text cannot hold NUL, and control characters in keys are
		// always a client bug.
		if c < 0x20 || c == 0x7f {
			return &RequestError{Field: field, Reason: fmt.Sprintf("control character %U", c)}
		}
	}
	return nil
}
