package strategytest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/reservebench/reservebench/strategy"
)

// answer is what a Reserve made in a goroutine returned.
type answer struct {
	res strategy.Result
	err error
}

// reserver is a node or an attempt held open.
type reserver interface {
	Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error)
}

// reserveAsync makes req on s in a goroutine, so that the check can watch
// it wait in PostgreSQL's lock table; the answer arrives on the channel
// (buffered: nobody has to read it). A panic in the call is caught in box,
// which the check rethrows.
//
// It returns once the goroutine has begun the call, so that requests sent
// one after another reach a queue in memory in that order: a goroutine
// that merely exists may run after one started later (Go runs the newest
// first), and a busy runtime may not run it until the check has moved on.
//
// The call's context carries a strategy.LockWait, so that the check sees
// it wait for a lock outside PostgreSQL too (lockWaiting).
func reserveAsync(ctx context.Context, box *panicBox, s reserver, req strategy.Request) chan answer {
	done := make(chan answer, 1)
	started := make(chan struct{})
	w := new(strategy.LockWait)
	lockWaits.Store(done, w)
	go func() {
		var a answer
		defer func() { done <- a }()
		defer lockWaits.Delete(done)
		defer box.catch()
		close(started)
		a.res, a.err = s.Reserve(strategy.WithLockWait(ctx, w), req)
	}()
	<-started
	return done
}

// lockWaits holds the strategy.LockWait of each call reserveAsync has
// under way, by the channel its answer arrives on.
var lockWaits sync.Map

// lockWaitOf is the strategy.LockWait of the call whose answer arrives on
// done, while it is under way (nil once it has answered).
func lockWaitOf[A any](done chan A) *strategy.LockWait {
	w, _ := lockWaits.Load(done)
	lw, _ := w.(*strategy.LockWait)
	return lw
}

// lockWaiting reports whether the call whose answer arrives on done waits
// for a lock outside PostgreSQL now (a LockTaker's, strategy.LockWait): it
// waits behind that lock's holder as a backend in pg_blocking_pids does.
func lockWaiting[A any](done chan A) bool { return lockWaitOf(done).Waiting() }

// sessionOn opens an attempt held open on node, where the strategy has
// them (ok false where it has not); the caller rolls it back.
func sessionOn(ctx context.Context, t tester, node strategy.Strategy) (s strategy.Session, ok bool) {
	t.Helper()
	opener, ok := node.(strategy.SessionOpener)
	if !ok {
		return nil, false
	}
	s, err := opener.OpenSession(ctx)
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	return s, true
}

// holdInSession opens an attempt held open and reserves req in it, which
// must be HELD, and returns the attempt and its backends; the caller rolls
// it back. A check that needs to see a wait behind the attempt in
// PostgreSQL skips when the attempt reports no backend.
func holdInSession(ctx context.Context, t tester, opener strategy.SessionOpener, req strategy.Request, what string) (strategy.Session, []uint32) {
	t.Helper()
	s, err := opener.OpenSession(ctx)
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	res, err := s.Reserve(ctx, req)
	if err != nil || res.Outcome != strategy.OutcomeHeld {
		_ = s.Rollback(ctx)
		t.Fatalf("%s: %s, %v; want HELD", what, res.Outcome, err)
	}
	pids := s.Backends()
	if len(pids) == 0 {
		_ = s.Rollback(ctx)
		t.Skip("the attempt held open reports no backend: a wait behind it cannot be seen in PostgreSQL")
	}
	return s, pids
}

// awaitQueued waits until node holds n requests for sku in its memory
// (strategy.Queuer), or one of done has answered (the answer is left in
// it), so that the requests a check sent are queued together, and in the
// order sent, before the step that lets their batch begin. reserveAsync
// only knows that a call has begun; a node that batches may not have
// queued it yet when the batch before it ends (ctl-combine-take-by-
// candidates was missed once in a CI run that way). A node that queues
// nothing in memory returns at once: its requests are on their way to the
// database, where the check sees them wait.
func awaitQueued(ctx context.Context, node strategy.Strategy, sku string, n int, done ...chan answer) error {
	q, ok := node.(strategy.Queuer)
	if !ok {
		return nil
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		if q.Queued(sku) >= n {
			return nil
		}
		for _, d := range done {
			select {
			case a := <-d:
				d <- a
				return nil
			default:
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d requests for %s queued in the node: %w", q.Queued(sku), n, sku, ctx.Err())
		case <-tick.C:
		}
	}
}
