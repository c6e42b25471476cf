package strategytest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkBlockedCallsFail: a Lookup, Confirm or Release that could not read
// or write (its statement waited on a lock until its caller gave up)
// returns an error, never an answer. Lookup is how a caller resolves an
// unknown outcome: a NOT_FOUND made up from a failed read tells it the
// reservation does not exist while it does; a false or 0 from a failed
// Confirm or Release tells it the reservation was not HELD. No other
// scenario makes these calls fail: the partitions and restarts cut
// reservations. Here an admin transaction holds every table of the
// strategy in ACCESS EXCLUSIVE mode; each call is seen waiting behind it
// (pg_blocking_pids), then its context is cancelled. A call that answers
// without waiting (from memory) is not judged.
func checkBlockedCallsFail(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("blocked-calls")
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 2}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	node := dep.Node(0)
	key := "kit-blocked-" + sku
	if res, err := reserveUnlessBusy(ctx, node, strategy.Request{Key: key, User: "kit-blocked-user", SKU: sku, TTL: time.Hour}); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("Reserve: %s, %v; want HELD", res.Outcome, err)
	}
	type outcome struct {
		answer string
		ok     bool // an error, or what the committed state says
	}
	calls := []struct {
		what string
		call func(context.Context) outcome
	}{
		{"Lookup", func(c context.Context) outcome {
			r, err := node.Lookup(c, key)
			return outcome{fmt.Sprintf("%s, %v", r.Status, err), err != nil || r.Status == strategy.StatusHeld}
		}},
	}
	if cf, ok := node.(strategy.Confirmer); ok {
		calls = append(calls, struct {
			what string
			call func(context.Context) outcome
		}{"Confirm", func(c context.Context) outcome {
			moved, err := cf.Confirm(c, key, strategy.ConfirmUntilExpired)
			return outcome{fmt.Sprintf("%v, %v", moved, err), err != nil}
		}})
	}
	if rl, ok := node.(strategy.Releaser); ok {
		calls = append(calls, struct {
			what string
			call func(context.Context) outcome
		}{"Release", func(c context.Context) outcome {
			n, err := rl.Release(c, key)
			return outcome{fmt.Sprintf("%d, %v", n, err), err != nil}
		}})
	}
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatalf("begin the transaction that locks the tables: %v", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	tables, err := gateTables(ctx, tx)
	if err != nil {
		t.Fatalf("list the tables: %v", err)
	}
	if len(tables) == 0 {
		t.Skip("the strategy keeps no tables in PostgreSQL: nothing to lock")
	}
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '10s'"); err != nil {
		t.Fatalf("lock_timeout: %v", err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+strings.Join(tables, ", ")+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatalf("lock the tables: %v", err)
	}
	var holder int32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&holder); err != nil {
		t.Fatalf("pid: %v", err)
	}
	for _, c := range calls {
		callCtx, giveUp := context.WithCancel(ctx)
		done := make(chan outcome, 1)
		var box panicBox
		go func() {
			var o outcome
			defer func() { done <- o }()
			defer box.catch()
			o = c.call(callCtx)
		}()
		blocked, err := awaitAnswerOrBlocked(ctx, admin, holder, done)
		giveUp()
		if err != nil {
			t.Fatalf("%s behind the locked tables: %v", c.what, err)
		}
		o := <-done
		box.rethrow()
		if blocked && !o.ok {
			t.Errorf("%s of a HELD reservation, waiting behind tables locked by another transaction until its caller gave up: %s; want an error (a made-up answer tells the caller the reservation is not there, or not HELD)", c.what, o.answer)
		}
	}
	// What the calls that failed do once the lock is gone is unknown to
	// their callers, as the contract says of any error: a node that
	// serves transitions in batches of its own may still do them.
}
