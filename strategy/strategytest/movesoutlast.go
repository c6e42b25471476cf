package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
)

// checkMovesOutlastTimeouts: a Confirm and a Release of HELD reservations
// whose rows another transaction holds (every row of the strategy's
// tables, as an UPDATE in flight holds the rows it changes) for at least
// outlastAtLeast, and 1 s past the longest lock or statement timeout the
// pool's queries set, wait for it, or give up with an error; when it
// rolls back, nobody has moved the reservations, so an answer of false or
// 0 ("another call moved it first") is wrong. checkTransitionsWaitForLockedRows
// lets the rows go as soon as the calls are seen waiting, so a Confirm
// that bounds its wait with a deadline of its own (a context of 2 s, which
// the pool's tracer cannot see) and answers false passed it. The calls
// wait side by side, so the check holds once; it runs after every other,
// beside checkWaitOutlastsTimeouts, so that a control caught earlier does
// not pay the hold.
func checkMovesOutlastTimeouts(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), outlastAtMost+time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "moves-outlast", 3)
	defer dep.Close()
	node := dep.Node(0)
	confirmer, canConfirm := node.(strategy.Confirmer)
	releaser, canRelease := node.(strategy.Releaser)
	if !canConfirm && !canRelease {
		t.Skip("neither Confirm nor Release")
	}
	held := func(name string) string {
		return holdForCheck(ctx, t, node, strategy.Request{Key: "kit-moves-outlast-" + name + "-" + sku, User: "kit-moves-outlast-" + name, SKU: sku, TTL: time.Hour})
	}
	type call struct {
		what string
		key  string
		run  func(key string) (bool, string, error) // moved, the answer as text
		done chan answerMoved
	}
	var calls []*call
	if canConfirm {
		calls = append(calls, &call{what: "Confirm", key: held("confirm"), run: func(key string) (bool, string, error) {
			ok, err := confirmer.Confirm(ctx, key, strategy.ConfirmBeforeExpiry)
			return ok, fmt.Sprint(ok), err
		}})
	}
	if canRelease {
		calls = append(calls, &call{what: "Release", key: held("release"), run: func(key string) (bool, string, error) {
			units, err := releaser.Release(ctx, key)
			return units == 1, fmt.Sprint(units), err
		}})
	}

	tx, holder := holdAllRows(ctx, t, admin)
	defer tx.Rollback(context.Background()) //nolint:errcheck // rolled back below on every path that gets there
	var box panicBox
	for _, c := range calls {
		c.done = make(chan answerMoved, 1)
		go func() {
			var a answerMoved
			defer func() { c.done <- a }()
			defer box.catch()
			a.moved, a.text, a.err = c.run(c.key)
		}()
	}
	// Every call waits for the rows (pg_blocking_pids) or has answered;
	// one that waits outside PostgreSQL is not seen, and the hold goes on
	// after resendSeenWithin all the same.
	seenCtx, seenCancel := context.WithTimeout(ctx, resendSeenWithin)
	waited, probeErr := awaitEachBlockedOrAnswered(seenCtx, admin, holder, calls, func(c *call) chan answerMoved { return c.done })
	seenCancel()
	if probeErr != nil && ctx.Err() != nil {
		_ = tx.Rollback(context.Background())
		t.Fatalf("read the lock waits behind the rows held: %v", probeErr)
	}
	hold := min(max(outlastAtLeast, pgtest.LongestTimeoutSet(db)+time.Second), outlastAtMost)
	if waited {
		timer := time.NewTimer(hold)
	holding:
		for _, c := range calls {
			select {
			case a := <-c.done:
				c.done <- a
			case <-timer.C:
				break holding
			}
		}
		timer.Stop()
	}
	if err := tx.Rollback(context.Background()); err != nil {
		t.Errorf("release the rows: %v", err)
	}
	for _, c := range calls {
		a := <-c.done
		if a.err == nil && !a.moved {
			t.Errorf("%s of HELD %s while another transaction held its row for %s (the call seen waiting: %v), which then rolled back: %s, nil; want it moved, or an error if the call gave up (nobody moved the reservation)",
				c.what, c.key, hold, waited, a.text)
		}
	}
	box.rethrow()
}

// answerMoved is a transition's answer.
type answerMoved struct {
	moved bool
	text  string
	err   error
}

// awaitEachBlockedOrAnswered polls until as many backends wait for holder
// as there are calls not yet answered (each call's answer is left in its
// channel), and reports whether any waited; it gives up at ctx's end.
func awaitEachBlockedOrAnswered[C any, A any](ctx context.Context, admin *pgxpool.Pool, holder int32, calls []C, done func(C) chan A) (bool, error) {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		var blocked int
		if err := admin.QueryRow(ctx, sqlBlockedBy, holder).Scan(&blocked); err != nil {
			return false, err
		}
		open := 0
		for _, c := range calls {
			if len(done(c)) == 0 {
				open++
			}
		}
		if blocked >= open {
			return blocked > 0, nil
		}
		select {
		case <-ctx.Done():
			return blocked > 0, ctx.Err()
		case <-tick.C:
		}
	}
}
