// Package admission is requirement 4 of the reservation contract: a bounded
// number of requests touch the database at once, waiting is bounded, and
// overflow is refused at once, before the database is touched.
//
// [Wrap] puts a [Gate] in front of any strategy.Strategy:
//
//	g := admission.Wrap(node, admission.Limits{InFlight: 4, Queue: 8, Wait: 400 * time.Millisecond})
//	res, err := g.Reserve(ctx, req)
//	var rej *admission.RejectedError
//	if errors.As(err, &rej) {
//		// 503 with Retry-After: rej.RetryAfter(); nothing was sent to the database,
//		// so the client may send the same request (same key) again.
//	}
//
// # What it guarantees
//
//   - At most Limits.InFlight calls run inside the wrapped strategy at once
//     (Stats.MaxInFlight never exceeds it), counted from admission to return.
//   - At most Limits.Queue calls wait for a slot at once. A call that finds
//     every slot taken and the queue full is refused at once with Reason
//     QueueFull. The counter is raised first and lowered again when over the
//     bound, so the bound holds however many calls arrive together.
//   - A waiting call waits at most Limits.Wait (Reason WaitTimeout) and no
//     longer than its context (Reason Canceled; errors.Is(err, ctx.Err())
//     also holds).
//   - A refused call returns a *RejectedError (errors.Is(err, ErrRejected))
//     without calling the wrapped strategy: the outcome is definite, nothing
//     was written, and sending the same request again is safe. This is the
//     503 + Retry-After of seed 000.
//   - A call that finds a free slot takes it at once. A slot freed while
//     calls are blocked waiting goes to the one that blocked first, not to a
//     call that arrives later: the slots are a buffered channel, and the Go
//     runtime hands a freed buffer slot straight to its oldest blocked
//     sender. (A waiter between joining the queue and blocking can still be
//     overtaken; the bounds above do not depend on the order.)
//
// # What it does not do
//
// The bound is per Gate: several processes (or several Gates over one
// database) each admit InFlight, and the database sees their sum. Queues
// outside the Gate (a listener's accept queue, an executor with an unbounded
// queue in front of it) are not counted; put the Gate first. A call the Gate
// admitted runs to its end: the Gate never cancels it.
//
// # Capabilities
//
// A Gate wraps Reserve and Lookup, the two calls every request makes. It
// does not forward the optional interfaces of package strategy (Confirmer,
// Releaser, Expirer, SessionOpener): a wrapper cannot implement exactly the
// subset its strategy has without one type per combination, and they do not
// all belong behind the gate (the expiry job must not be refused as
// overflow, and a session would hold a slot for as long as its caller keeps
// it open). Reach them through [Gate.Unwrap]; to admit one of those calls
// too, run it inside [Gate.Do] or between [Gate.Acquire] and its release.
package admission

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/reservebench/reservebench/strategy"
)

// Limits bound what a Gate lets through.
type Limits struct {
	// InFlight is how many calls may run inside the wrapped strategy at
	// once. It must be at least 1.
	InFlight int
	// Queue is how many calls may wait for a slot at once; 0 refuses every
	// call that finds no free slot.
	Queue int
	// Wait is the longest a call waits for a slot. It must be positive when
	// Queue is.
	Wait time.Duration
	// RetryAfter is the pause a refused client is told to take before it
	// sends the request again (the Retry-After header). 0 means Wait, or 1s
	// when Wait is 0.
	RetryAfter time.Duration
}

func (l Limits) validate() error {
	switch {
	case l.InFlight < 1:
		return fmt.Errorf("admission: InFlight must be at least 1, got %d", l.InFlight)
	case l.Queue < 0:
		return fmt.Errorf("admission: Queue must not be negative, got %d", l.Queue)
	case l.Queue > 0 && l.Wait <= 0:
		return fmt.Errorf("admission: Wait must be positive when Queue is (%d), got %v", l.Queue, l.Wait)
	case l.Wait < 0 || l.RetryAfter < 0:
		return fmt.Errorf("admission: negative duration (Wait %v, RetryAfter %v)", l.Wait, l.RetryAfter)
	}
	return nil
}

// Reason says why a call was refused.
type Reason int

// The reasons a call is refused.
const (
	// QueueFull: every slot was taken and Limits.Queue calls were already
	// waiting. The call was refused without waiting.
	QueueFull Reason = iota + 1
	// WaitTimeout: the call waited Limits.Wait and no slot came free.
	WaitTimeout
	// Canceled: the caller's context ended before a slot came free.
	Canceled
)

func (r Reason) String() string {
	switch r {
	case QueueFull:
		return "QUEUE_FULL"
	case WaitTimeout:
		return "WAIT_TIMEOUT"
	case Canceled:
		return "CANCELED"
	}
	return fmt.Sprintf("Reason(%d)", int(r))
}

// ErrRejected is matched (errors.Is) by every refusal of a Gate: a
// *RejectedError.
var ErrRejected = errors.New("admission: rejected")

// RejectedError is a call the Gate refused before it reached the wrapped
// strategy.
type RejectedError struct {
	Reason Reason
	// Retry is the pause the client should take before sending the same
	// request again.
	Retry time.Duration
	// Err is the context's error for Reason Canceled, else nil.
	Err error
}

func (e *RejectedError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("admission: rejected (%s): %v", e.Reason, e.Err)
	}
	return fmt.Sprintf("admission: rejected (%s), retry after %v", e.Reason, e.Retry)
}

// Is makes errors.Is(err, ErrRejected) true for every *RejectedError.
func (e *RejectedError) Is(target error) bool { return target == ErrRejected }

// Unwrap returns the context's error of a Canceled refusal.
func (e *RejectedError) Unwrap() error { return e.Err }

// RetryAfter is the pause to announce in a Retry-After header.
func (e *RejectedError) RetryAfter() time.Duration { return e.Retry }

// Stats are a Gate's counters since it was made. Admitted + AdmittedAfterWait
// is the number of calls that reached the wrapped strategy; the Rejected
// counters add up to the calls that did not.
type Stats struct {
	Admitted          int64 // admitted at once, a slot was free
	AdmittedAfterWait int64 // admitted after waiting in the queue
	RejectedQueueFull int64
	RejectedTimeout   int64
	RejectedCanceled  int64
	MaxInFlight       int64 // the most calls seen inside the wrapped strategy at once
	MaxWaiting        int64 // the most calls seen waiting at once
}

// Rejected is the number of refused calls, whatever the reason.
func (s Stats) Rejected() int64 { return s.RejectedQueueFull + s.RejectedTimeout + s.RejectedCanceled }

// Gate is a strategy.Strategy that admits calls into another one within
// Limits. Its methods are safe for concurrent use.
type Gate struct {
	inner  strategy.Strategy
	limits Limits
	slots  chan struct{} // a buffered semaphore: a call holds one element while admitted

	inFlight atomic.Int64
	waiting  atomic.Int64

	admitted, afterWait                   atomic.Int64
	rejQueueFull, rejTimeout, rejCanceled atomic.Int64
	maxInFlight, maxWaiting               atomic.Int64

	// Test hooks (export_test.go): onWait runs when a call has joined the
	// queue, just before it blocks; timer makes the wait's deadline.
	onWait func()
	timer  func(d time.Duration) (<-chan time.Time, func() bool)
}

var _ strategy.Strategy = (*Gate)(nil)

// Wrap returns a Gate over s. It panics when the limits are invalid
// (InFlight < 1, Queue < 0, or Queue > 0 without a positive Wait), as a
// programming error, like regexp.MustCompile.
func Wrap(s strategy.Strategy, l Limits) *Gate {
	g, err := New(s, l)
	if err != nil {
		panic(err)
	}
	return g
}

// New is Wrap returning the error instead of panicking.
func New(s strategy.Strategy, l Limits) (*Gate, error) {
	if err := l.validate(); err != nil {
		return nil, err
	}
	if l.RetryAfter == 0 {
		l.RetryAfter = l.Wait
		if l.RetryAfter == 0 {
			l.RetryAfter = time.Second
		}
	}
	return &Gate{inner: s, limits: l, slots: make(chan struct{}, l.InFlight), timer: realTimer}, nil
}

func realTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// Limits returns the gate's limits.
func (g *Gate) Limits() Limits { return g.limits }

// Unwrap returns the wrapped strategy, for the optional interfaces the Gate
// does not forward.
func (g *Gate) Unwrap() strategy.Strategy { return g.inner }

// Reserve admits the call and runs the wrapped strategy's Reserve. A refusal
// returns a zero Result and a *RejectedError; the wrapped strategy was not
// called.
func (g *Gate) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	release, err := g.Acquire(ctx)
	if err != nil {
		return strategy.Result{}, err
	}
	defer release()
	return g.inner.Reserve(ctx, req)
}

// Lookup admits the call and runs the wrapped strategy's Lookup: it reads
// the database too.
func (g *Gate) Lookup(ctx context.Context, key string) (strategy.Reservation, error) {
	release, err := g.Acquire(ctx)
	if err != nil {
		return strategy.Reservation{}, err
	}
	defer release()
	return g.inner.Lookup(ctx, key)
}

// Do admits fn like a Reserve: any other call that should count against
// the limits (a Confirm, a Release).
func (g *Gate) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	release, err := g.Acquire(ctx)
	if err != nil {
		return err
	}
	defer release()
	return fn(ctx)
}

// Acquire waits for a slot within the limits. On success the caller holds
// the slot until it calls release, exactly once. On refusal it returns a
// *RejectedError and no release.
func (g *Gate) Acquire(ctx context.Context) (release func(), err error) {
	if err := ctx.Err(); err != nil {
		g.rejCanceled.Add(1)
		return nil, &RejectedError{Reason: Canceled, Retry: g.limits.RetryAfter, Err: err}
	}
	select {
	case g.slots <- struct{}{}:
		g.admitted.Add(1)
		return g.enter(), nil
	default:
	}
	// Raise first, then compare: concurrent arrivals cannot all see room.
	w := g.waiting.Add(1)
	if w > int64(g.limits.Queue) {
		g.waiting.Add(-1)
		g.rejQueueFull.Add(1)
		return nil, &RejectedError{Reason: QueueFull, Retry: g.limits.RetryAfter}
	}
	raiseMax(&g.maxWaiting, w)
	defer g.waiting.Add(-1)
	deadline, stop := g.timer(g.limits.Wait)
	defer stop()
	if g.onWait != nil {
		g.onWait()
	}
	select {
	case g.slots <- struct{}{}:
		g.afterWait.Add(1)
		return g.enter(), nil
	case <-deadline:
		g.rejTimeout.Add(1)
		return nil, &RejectedError{Reason: WaitTimeout, Retry: g.limits.RetryAfter}
	case <-ctx.Done():
		g.rejCanceled.Add(1)
		return nil, &RejectedError{Reason: Canceled, Retry: g.limits.RetryAfter, Err: ctx.Err()}
	}
}

// enter counts an admitted call in and returns its release.
func (g *Gate) enter() func() {
	raiseMax(&g.maxInFlight, g.inFlight.Add(1))
	var once atomic.Bool
	return func() {
		if !once.CompareAndSwap(false, true) {
			return
		}
		g.inFlight.Add(-1) // before the slot is freed: the count never exceeds InFlight
		<-g.slots
	}
}

// InFlight is the number of calls inside the wrapped strategy now.
func (g *Gate) InFlight() int { return int(g.inFlight.Load()) }

// Waiting is the number of calls waiting for a slot now.
func (g *Gate) Waiting() int { return int(g.waiting.Load()) }

// Stats returns the counters. Each is read atomically; together they are a
// snapshot only when no call is running.
func (g *Gate) Stats() Stats {
	return Stats{
		Admitted:          g.admitted.Load(),
		AdmittedAfterWait: g.afterWait.Load(),
		RejectedQueueFull: g.rejQueueFull.Load(),
		RejectedTimeout:   g.rejTimeout.Load(),
		RejectedCanceled:  g.rejCanceled.Load(),
		MaxInFlight:       g.maxInFlight.Load(),
		MaxWaiting:        g.maxWaiting.Load(),
	}
}

func raiseMax(m *atomic.Int64, v int64) {
	for {
		cur := m.Load()
		if v <= cur || m.CompareAndSwap(cur, v) {
			return
		}
	}
}
