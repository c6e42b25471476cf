package strategy

import (
	"context"
	"sync/atomic"
)

// A LockWait lets the caller of a Reserve see the call wait for a lock that
// PostgreSQL does not hold (a LockTaker's lock in Redis), as it sees a
// backend wait in pg_blocking_pids. The caller puts one in the call's
// context (WithLockWait); a LockTaker sets it while the call sleeps after
// finding the lock held by another and clears it when the call stops
// waiting (net/http/httptrace carries its hooks in a context the same way).
// Without it, the harness cannot tell a call that waits for the lock from
// one still at work, and gives each such call a bound of seconds before it
// goes on; with it, it goes on as soon as the call waits, behind the
// attempt it holds open, and the call then takes the lock when that
// attempt ends instead of giving up at its wait bound. A strategy that
// takes no lock outside PostgreSQL has nothing to do.
type LockWait struct{ waiting atomic.Bool }

type lockWaitKey struct{}

// WithLockWait returns ctx carrying w.
func WithLockWait(ctx context.Context, w *LockWait) context.Context {
	return context.WithValue(ctx, lockWaitKey{}, w)
}

// LockWaitOf is the LockWait ctx carries, or nil; its methods accept nil.
func LockWaitOf(ctx context.Context) *LockWait {
	w, _ := ctx.Value(lockWaitKey{}).(*LockWait)
	return w
}

// Set records whether the call waits for a lock another holds.
func (w *LockWait) Set(waiting bool) {
	if w != nil {
		w.waiting.Store(waiting)
	}
}

// Waiting reports whether the call waits for a lock another holds now.
func (w *LockWait) Waiting() bool { return w != nil && w.waiting.Load() }
