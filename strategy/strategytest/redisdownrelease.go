package strategytest

import (
	"context"
	"fmt"
	"strings"

	"github.com/reservebench/reservebench/strategy"
)

// releaseAcrossStop is redis-restart's release sent while Redis is stopped:
// a design that moves the row in PostgreSQL and then gives the unit back
// in Redis has moved the row when the give-back fails, so its answer is
// unknown (an error), and the client sends the release again once Redis
// is back. The resend gives the unit it still owes back, but it moved
// nothing: it must say 0. A design that counts the units it gives back,
// not the rows it moves, says 1, and the audit balances all the same, so
// only the answers show it. The pause of Redis (redisstall.go) does not:
// the paused give-back runs once Redis answers again.
type releaseAcrossStop struct {
	calls []stoppedRelease
}

type stoppedRelease struct {
	key   string
	units int
	err   error
}

// pick keeps the keys that are HELD, while Redis is still up.
func (r *releaseAcrossStop) pick(ctx context.Context, t *trial, keys []string) error {
	if _, ok := t.node(0).(strategy.Releaser); !ok {
		return nil
	}
	held, err := t.lookupAll(ctx, keys)
	if err != nil {
		return fmt.Errorf("releases across a stop of Redis: %w", err)
	}
	for _, k := range keys {
		if held[k].Status == strategy.StatusHeld {
			r.calls = append(r.calls, stoppedRelease{key: k})
		}
	}
	return nil
}

// whileStopped releases each picked key once, Redis stopped.
func (r *releaseAcrossStop) whileStopped(ctx context.Context, t *trial) {
	for i := range r.calls {
		c := &r.calls[i]
		c.units, c.err = t.release(ctx, "release-redis-down", 0, c.key)
	}
}

// onceBack reads what each release moved, sends the unknown ones again
// until they answer, and judges every answer.
func (r *releaseAcrossStop) onceBack(ctx context.Context, t *trial) error {
	if len(r.calls) == 0 {
		return nil
	}
	keys := make([]string, len(r.calls))
	for i, c := range r.calls {
		keys[i] = c.key
	}
	// Nothing else moves these rows: what they are now, the releases sent
	// while Redis was stopped made them.
	before, err := t.lookupAll(ctx, keys)
	if err != nil {
		return fmt.Errorf("releases across a stop of Redis: %w", err)
	}
	var answers, wrong, resendWrong []string
	for _, c := range r.calls {
		moved := before[c.key].Status == strategy.StatusReleased
		if c.err == nil {
			answers = append(answers, fmt.Sprintf("%d", c.units))
			if (c.units == 1) != moved || c.units > 1 {
				wrong = append(wrong, fmt.Sprintf("Release of %s answered %d, and the row is %s", t.plain(c.key), c.units, before[c.key].Status))
			}
			continue
		}
		var again int
		var aerr error
		for try := 0; try < resendTries; try++ {
			again, aerr = t.release(ctx, fmt.Sprintf("release-redis-back%d", try), 0, c.key)
			if aerr == nil {
				break
			}
		}
		after, err := t.lookupAll(ctx, []string{c.key})
		if err != nil {
			return fmt.Errorf("releases across a stop of Redis: %w", err)
		}
		switch {
		case aerr != nil:
			answers = append(answers, "error, then errors")
			resendWrong = append(resendWrong, fmt.Sprintf("Release of %s sent again %d times once Redis was back, still failing: %v", t.plain(c.key), resendTries, aerr))
			continue
		case after[c.key].Status != strategy.StatusReleased:
			resendWrong = append(resendWrong, fmt.Sprintf("Release of %s sent again answered %d, and the row is %s", t.plain(c.key), again, after[c.key].Status))
		case moved && again != 0:
			resendWrong = append(resendWrong, fmt.Sprintf("Release of %s sent again once Redis was back answered %d unit(s), but the one sent while it was stopped had moved the row", t.plain(c.key), again))
		case !moved && again != 1:
			resendWrong = append(resendWrong, fmt.Sprintf("Release of %s sent again once Redis was back moved the row and answered %d unit(s)", t.plain(c.key), again))
		}
		answers = append(answers, fmt.Sprintf("error (the row %s), then %d", before[c.key].Status, again))
	}
	t.fact("while Redis is stopped: releases of HELD reservations, and again once it is back", "%s", strings.Join(answers, "; "))
	t.check(Base, "a Release sent while Redis is stopped ends unknown or with its true answer (1 iff it moved the row)", len(wrong) == 0,
		sample(wrong), keys...)
	t.check(Base, "a Release that ended unknown while Redis was stopped, sent again once it is back, moves the row, and reports nothing moved when the first had moved it", len(resendWrong) == 0,
		sample(resendWrong), keys...)
	return nil
}
