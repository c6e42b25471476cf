package strategytest

import (
	"context"
	"fmt"
	"sync"

	"github.com/reservebench/reservebench/strategy"
)

// runReleaseVsConfirm races, for each HELD reservation, a Release on one
// node against a Confirm on another (a buyer cancelling while the payment
// callback arrives), behind the gate. release-replay races Release against
// Release and confirm-vs-expire Confirm against the expiry job; a Release
// that reads the row, then moves it without "AND status = 'HELD'" in its
// UPDATE, passes both: the guard that stops a second Release is on the
// unit, not on the status. Here exactly one of the two calls may move each
// row, the row must end as the call that moved it says, and units come
// back only for the released rows.
func runReleaseVsConfirm(ctx context.Context, t *trial) error {
	keys, err := t.holdMany(ctx, t.in.Held)
	if err != nil {
		return err
	}
	var mu sync.Mutex
	released, confirmed := map[string]bool{}, map[string]bool{}
	failed := 0
	var gateErr error
	back, err := t.returned(ctx, func() {
		for _, k := range keys {
			if gateErr = t.concurrently(ctx, 2, func(i int) {
				var moved bool
				var err error
				if i == 0 {
					var units int
					units, err = t.release(ctx, "release", 0, k)
					moved = units > 0
				} else {
					moved, err = t.confirm(ctx, "confirm", 1, k, strategy.ConfirmUntilExpired)
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil && !abortedByConflict(err) {
					failed++
				}
				if moved && i == 0 {
					released[k] = true
				} else if moved {
					confirmed[k] = true
				}
			}); gateErr != nil {
				return
			}
		}
	})
	if err != nil {
		return err
	}
	if gateErr != nil {
		return gateErr
	}
	count, durable, err := t.statuses(ctx, keys)
	if err != nil {
		return err
	}
	var both, neither, wrongEnd []string
	for _, k := range keys {
		switch {
		case released[k] && confirmed[k]:
			both = append(both, t.plain(k))
		case !released[k] && !confirmed[k]:
			neither = append(neither, t.plain(k))
		case released[k] && durable[k].Status != strategy.StatusReleased,
			confirmed[k] && durable[k].Status != strategy.StatusConfirmed:
			wrongEnd = append(wrongEnd, fmt.Sprintf("%s %s", t.plain(k), durable[k].Status))
		}
	}
	t.fact("rows moved by exactly one of the two calls", "%d of %d", len(keys)-len(both)-len(neither), len(keys))
	t.vary("released", len(released))
	t.vary("confirmed", len(confirmed))
	t.check(strategy.ReturnOnce, "of a Release and a Confirm racing for a HELD reservation, exactly one moves it", len(both) == 0 && len(neither) == 0,
		fmt.Sprintf("both moved %d (%s); neither %d (%s)", len(both), sample(both), len(neither), sample(neither)))
	t.check(strategy.ReturnOnce, "the row ends as the call that moved it says", len(wrongEnd) == 0,
		fmt.Sprintf("%d rows: %s", len(wrongEnd), sample(wrongEnd)))
	t.check(strategy.ReturnOnce, "units come back only for RELEASED rows", back == count[strategy.StatusReleased] && back == len(released),
		fmt.Sprintf("%d RELEASED, %d releases reported a unit, the stock rose by %d", count[strategy.StatusReleased], len(released), back))
	t.check(strategy.ReturnOnce, "a release or confirm fails only by a conflict abort when no fault is injected", failed == 0, fmt.Sprintf("%d calls failed", failed))
	return nil
}
