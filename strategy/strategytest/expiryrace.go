package strategytest

import (
	"context"
	"fmt"
	"sync"

	"github.com/reservebench/reservebench/strategy"
)

// runExpiryRace runs waves of concurrent expiry jobs: each wave makes
// wave_due rows due at once and starts `workers` jobs together (behind the
// gate when the scenario asks for it). Every wave must return exactly the
// rows that became due, each once, with no run failing. Most rows stay HELD
// the whole time, so a job that returns a unit twice raises the stock
// visibly instead of hitting a CHECK on available <= total and failing.
func runExpiryRace(ctx context.Context, t *trial) error {
	in := t.in
	keys, err := t.holdMany(ctx, in.Held)
	if err != nil {
		return err
	}
	wrongWaves, failedRuns := 0, 0
	var firstWrong string
	for w := 0; w < in.Waves; w++ {
		due := keys[w*in.WaveDue : (w+1)*in.WaveDue]
		if err := t.makeDue(ctx, due); err != nil {
			return err
		}
		var mu sync.Mutex
		reported := 0
		var gateErr error
		back, err := t.returned(ctx, func() {
			gateErr = t.concurrently(ctx, in.Workers, func(i int) {
				op := t.expire(ctx, fmt.Sprintf("w%d.job%d", w, i), i)
				mu.Lock()
				defer mu.Unlock()
				if op.Type == OpInfo {
					if !op.Aborted {
						failedRuns++
					}
					return
				}
				reported += op.Units
			})
		})
		if err != nil {
			return err
		}
		if gateErr != nil {
			return gateErr
		}
		count, _, err := t.statuses(ctx, due)
		if err != nil {
			return err
		}
		if back != len(due) || reported != back || count[strategy.StatusExpired] != len(due) {
			wrongWaves++
			if firstWrong == "" {
				firstWrong = fmt.Sprintf("wave %d: %d rows due, the stock rose by %d, the jobs reported %d, statuses %v", w+1, len(due), back, reported, count)
			}
		}
	}
	t.fact(fmt.Sprintf("%d waves of %d due rows, %d jobs each", in.Waves, in.WaveDue, in.Workers), "%d waves returned exactly their due rows", in.Waves-wrongWaves)
	t.check(strategy.ReturnOnce, "concurrent expiry jobs return each due unit exactly once", wrongWaves == 0,
		fmt.Sprintf("%d of %d waves wrong; first: %s", wrongWaves, in.Waves, firstWrong))
	t.check(strategy.ReturnOnce, "the expiry job fails only by a conflict abort when no fault is injected", failedRuns == 0,
		fmt.Sprintf("%d of %d runs failed other than by a serialization failure or deadlock", failedRuns, in.Waves*in.Workers),
		"") // the jobs' operations carry no key: show them
	rest := keys[in.Waves*in.WaveDue:]
	if len(rest) > 0 {
		hs, _, err := t.statuses(ctx, rest)
		if err != nil {
			return err
		}
		t.check(strategy.ReturnOnce, "a reservation that is not due stays HELD", hs[strategy.StatusHeld] == len(rest), fmt.Sprintf("statuses %v", hs))
	}
	return nil
}
