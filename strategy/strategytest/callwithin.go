package strategytest

import (
	"context"
	"fmt"
	"time"
)

// returnGrace is how long the kit waits for a call whose caller has given
// up (its context is done) before it goes on without the answer. A
// strategy must honour its caller's deadline: one that runs its statements
// under context.Background(), or waits on a channel without the caller's
// context, hung the kit in commit-timeout until go test's own timeout
// (outsider rounds 52, 53 and 54: m26, b29, m24), naming nothing.
const returnGrace = 20 * time.Second

// errOutlivedGiveUp is the error callWithin returns for a call still
// running returnGrace after its context ended.
var errOutlivedGiveUp = fmt.Errorf("no answer %v after the caller gave up: the call ignores its context", returnGrace)

// callWithin runs call and returns what it returns, or errOutlivedGiveUp
// once ctx has been done for grace (the call goes on, unwatched). A panic
// of call is rethrown in the caller's goroutine.
func callWithin[R any](ctx context.Context, grace time.Duration, call func() (R, error)) (R, error) {
	if ctx.Done() == nil {
		return call()
	}
	type result struct {
		r        R
		err      error
		panicked any
	}
	done := make(chan result, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- result{panicked: p}
			}
		}()
		r, err := call()
		done <- result{r: r, err: err}
	}()
	var got result
	select {
	case got = <-done:
	case <-ctx.Done():
		timer := time.NewTimer(grace)
		defer timer.Stop()
		select {
		case got = <-done:
		case <-timer.C:
			var zero R
			return zero, errOutlivedGiveUp
		}
	}
	if got.panicked != nil {
		panic(got.panicked)
	}
	return got.r, got.err
}

// waitWithin is callWithin's wait for a call already running, whose
// answer done delivers, given up on through ctx.
func waitWithin(ctx context.Context, grace time.Duration, done <-chan error) error {
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		return errOutlivedGiveUp
	}
}

// lateGrace is how long the trial still waits for a call given up on: no
// time once one call has outlived returnGrace, since the trial fails
// already and each further wait would only add returnGrace to it.
func (t *trial) lateGrace() time.Duration {
	t.panicMu.Lock()
	defer t.panicMu.Unlock()
	if len(t.late) > 0 {
		return 0
	}
	return returnGrace
}

// givenUpAnswer is the answer on done of a call whose caller has just
// given up on it, waited for at most returnGrace: a call that ignores its
// context would otherwise hold the check, and the contract with it, until
// the cell's own deadline minutes later (outsider round 55's m17, an
// insert sent without its caller's cancellation, held by the kit's
// trigger, hung checkSessionInsertGivenUp). Past that the check fails;
// the call is left where it hangs.
func givenUpAnswer[A any](t tester, done <-chan A, what string) A {
	t.Helper()
	timer := time.NewTimer(returnGrace)
	defer timer.Stop()
	select {
	case a := <-done:
		return a
	case <-timer.C:
		t.Fatalf("%s: still running %v after its caller gave up (its context cancelled); a call returns once its caller gives up", what, returnGrace)
		panic("unreachable: Fatalf ends the check")
	}
}
