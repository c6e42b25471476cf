package strategytest

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reservebench/reservebench/strategy"
)

// OpType says how an operation completed, in Jepsen's terms.
type OpType string

const (
	// OpOK: the operation definitely took effect (HELD, REPLAY, a transition
	// that moved its row, a commit that returned).
	OpOK OpType = "ok"
	// OpFail: the operation definitely did not take effect (SOLD_OUT,
	// USER_LIMIT, KEY_REUSED, BAD_REQUEST, a rollback).
	OpFail OpType = "fail"
	// OpInfo: the outcome is unknown (an error, a timeout, a connection lost
	// at commit). The check resolves it from the durable state.
	OpInfo OpType = "info"
)

// Op is one operation in a history.
type Op struct {
	Process  string // the client that ran it, e.g. "c17" or "t1"
	Kind     string // reserve, confirm, release, expire, commit, rollback
	Node     int    // the node it was sent to
	Req      strategy.Request
	Invoke   time.Duration // since the history started
	Complete time.Duration
	Type     OpType
	Outcome  strategy.Outcome // reserve
	Units    int              // release, expire: units the call reported
	Moved    bool             // confirm: the call reports it moved the row
	// Answer is the reservation a reserve answer carries (HELD, REPLAY,
	// KEY_REUSED), as the client reads it.
	Answer strategy.Reservation
	Err    string
	// Aborted: the call failed because PostgreSQL aborted its transaction
	// to resolve a conflict with a concurrent one (40001, 40P01): the
	// transaction did nothing, and running it again is the remedy.
	Aborted bool
}

func (o Op) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%8.3fms..%8.3fms %-5s %-4s node%d %-8s", ms(o.Invoke), ms(o.Complete), o.Process, o.Type, o.Node, o.Kind)
	if o.Req.Key != "" {
		fmt.Fprintf(&b, " key=%s user=%s sku=%s", o.Req.Key, o.Req.User, o.Req.SKU)
	}
	if o.Outcome != "" {
		fmt.Fprintf(&b, " -> %s", o.Outcome)
	}
	if o.Kind == "release" || o.Kind == "expire" {
		fmt.Fprintf(&b, " -> units=%d", o.Units)
	}
	if o.Kind == "confirm" {
		fmt.Fprintf(&b, " -> moved=%v", o.Moved)
	}
	if o.Err != "" {
		fmt.Fprintf(&b, " err=%q", o.Err)
	}
	if o.Aborted {
		b.WriteString(" (aborted by a conflict)")
	}
	return b.String()
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// History records operations from many goroutines.
type History struct {
	start time.Time
	mu    sync.Mutex
	ops   []Op
}

// NewHistory starts an empty history.
func NewHistory() *History { return &History{start: time.Now()} }

// Wall returns the wall-clock time of an offset of the history, to compare
// with times the strategy reports (ExpiresAt).
func (h *History) Wall(d time.Duration) time.Time { return h.start.Add(d) }

// WallStep is how far the wall clock has been stepped since the history
// began (by NTP, or a virtual machine's clock catching up): offsets are
// monotonic, while PostgreSQL stamps the wall clock, so a reported time
// can be off from Wall by this much.
func (h *History) WallStep() time.Duration {
	now := time.Now()
	return now.Round(0).Sub(h.start.Round(0)) - now.Sub(h.start)
}

// Begin notes the invocation time of an operation; pass it to End.
func (h *History) Begin() time.Duration { return time.Since(h.start) }

// End completes op (whose Invoke is set) and records it.
func (h *History) End(op Op) Op {
	op.Complete = time.Since(h.start)
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
	return op
}

// Ops returns the operations sorted by invocation time.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := append([]Op(nil), h.ops...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Invoke < out[j].Invoke })
	return out
}

// reserveOp classifies a Reserve result.
func reserveOp(op Op, res strategy.Result, err error) Op {
	op.Kind = "reserve"
	op.Outcome = res.Outcome
	switch {
	case err != nil && errors.Is(err, strategy.ErrBadRequest):
		op.Type, op.Err = OpFail, err.Error()
		if op.Outcome == "" {
			op.Outcome = strategy.OutcomeBadRequest
		}
	case err != nil:
		// An error leaves the outcome unknown, whatever Result came with
		// it: nothing in it is an answer.
		op.Type, op.Err, op.Outcome = OpInfo, err.Error(), ""
	case res.Outcome == strategy.OutcomeHeld || res.Outcome == strategy.OutcomeReplay:
		op.Type, op.Answer = OpOK, res.Reservation
	default:
		op.Type, op.Answer = OpFail, res.Reservation
	}
	return op
}

// abortedByConflict reports whether err is PostgreSQL aborting the
// transaction to resolve a conflict with a concurrent one: a serialization
// failure or a deadlock. Such a run did nothing, and a rerun is the remedy;
// any other failure of a transition, with no fault injected, is evidence
// that its count and the database disagree (a CHECK caught it).
func abortedByConflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// Excerpt returns the operations that touch one of keys (all, when keys is
// empty), at most max lines, for failure messages.
func Excerpt(ops []Op, keys []string, max int) string {
	want := map[string]bool{}
	for _, k := range keys {
		want[k] = true
	}
	var lines []string
	for _, op := range ops {
		if len(want) > 0 && !want[op.Req.Key] {
			continue
		}
		lines = append(lines, op.String())
	}
	if len(lines) > max {
		lines = append(lines[:max], fmt.Sprintf("... %d more", len(lines)-max))
	}
	return strings.Join(lines, "\n")
}
