package strategytest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkBlockedCallsFail: a Lookup, Confirm, Release or expiry job that
// could not read or write (its statement waited on a lock until its caller
// gave up) returns an error, never an answer; so do a Restart and an
// Attach that could not read what they start from. Lookup is how a caller
// resolves an unknown outcome: a NOT_FOUND made up from a failed read
// tells it the reservation does not exist while it does; a false or 0 from
// a failed Confirm or Release tells it the reservation was not HELD; an
// expiry job that returns without an error says it moved every due
// reservation, and one is due. No other scenario makes these calls fail:
// the partitions and restarts cut reservations. Here an admin transaction
// holds every table of the strategy in ACCESS EXCLUSIVE mode; each call is
// seen waiting behind it (pg_blocking_pids), then given up on, once by
// cancelling its context and once as its deadline would (giveUpKind). A
// call that answers without waiting (from memory) is not judged.
func checkBlockedCallsFail(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "blocked-calls", 2)
	defer dep.Close()
	node := dep.Node(0)
	key := "kit-blocked-" + sku
	if res, err := reserveUnlessBusy(ctx, node, strategy.Request{Key: key, User: "kit-blocked-user", SKU: sku, TTL: time.Hour}); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("Reserve: %s, %v; want HELD", res.Outcome, err)
	}
	// A due reservation, for the expiry job to have work it cannot do.
	ex, expires := node.(strategy.Expirer)
	ager, ages := dep.(strategy.Ager)
	due := "kit-blocked-due-" + sku
	if expires && ages {
		if res, err := reserveUnlessBusy(ctx, node, strategy.Request{Key: due, User: "kit-blocked-due-user", SKU: sku, TTL: time.Hour}); err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Fatalf("Reserve %q: %s, %v; want HELD", due, res.Outcome, err)
		}
		if n, err := ager.MakeDue(ctx, []string{due}); err != nil || n != 1 {
			t.Fatalf("MakeDue %q: %d, %v; want 1", due, n, err)
		}
	}
	calls := []blockedCall{
		{"Lookup", func(c context.Context) outcome {
			r, err := node.Lookup(c, key)
			return outcome{fmt.Sprintf("%s, %v", r.Status, err), err != nil || r.Status == strategy.StatusHeld}
		}},
	}
	if cf, ok := node.(strategy.Confirmer); ok {
		calls = append(calls, blockedCall{"Confirm", func(c context.Context) outcome {
			moved, err := cf.Confirm(c, key, strategy.ConfirmUntilExpired)
			return outcome{fmt.Sprintf("%v, %v", moved, err), err != nil}
		}})
	}
	if rl, ok := node.(strategy.Releaser); ok {
		calls = append(calls, blockedCall{"Release", func(c context.Context) outcome {
			n, err := rl.Release(c, key)
			return outcome{fmt.Sprintf("%d, %v", n, err), err != nil}
		}})
	}
	if expires && ages {
		calls = append(calls, blockedCall{"ExpireDue, with a reservation due", func(c context.Context) outcome {
			n, err := ex.ExpireDue(c)
			return outcome{fmt.Sprintf("%d units, %v", n, err), err != nil}
		}})
	}
	// Last, as they end the node: a restart and an attach that cannot
	// read what they start from fail; one that starts from a guess (the
	// configured totals) sells again what is sold.
	var starts []blockedCall
	if r, ok := dep.(strategy.Restarter); ok {
		starts = append(starts, blockedCall{"Restart", func(c context.Context) outcome {
			err := r.Restart(c, 0)
			return outcome{fmt.Sprintf("%v", err), err != nil}
		}})
	}
	if meta.Attach != nil {
		starts = append(starts, blockedCall{"Attach", func(c context.Context) outcome {
			other, err := meta.Attach(c, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 2}}})
			if err == nil {
				_ = other.Close()
			}
			return outcome{fmt.Sprintf("%v", err), err != nil}
		}})
	}
	tables := lockTables(ctx, t, admin, nil, func(holder int32) {
		for _, kind := range []giveUpKind{byCancel, byDeadline} {
			for _, c := range calls {
				judgeBlocked(ctx, t, admin, holder, c, kind, "tables locked by another transaction")
			}
		}
		for _, c := range starts {
			judgeBlocked(ctx, t, admin, holder, c, byCancel, "tables locked by another transaction")
		}
	})
	// Then one table at a time: a start that falls back to another table
	// (the configured shares) when the one it counts from is locked is
	// met only when that other table is free.
	if len(tables) > 1 {
		for _, tb := range tables {
			lockTables(ctx, t, admin, []string{tb}, func(holder int32) {
				for _, c := range starts {
					judgeBlocked(ctx, t, admin, holder, c, byCancel, "table "+tb+" locked by another transaction")
				}
			})
		}
	}
	// What the calls that failed do once the lock is gone is unknown to
	// their callers, as the contract says of any error: a node that
	// serves transitions in batches of its own may still do them.
}

type outcome struct {
	answer string
	ok     bool // an error, or what the committed state says
}

type blockedCall struct {
	what string
	call func(context.Context) outcome
}

// lockTables locks these tables of the database (all of them: nil) in
// ACCESS EXCLUSIVE mode in an admin transaction, runs with the holder's pid
// and rolls back; it returns the tables of the database.
func lockTables(ctx context.Context, t tester, admin *pgxpool.Pool, these []string, with func(holder int32)) []string {
	t.Helper()
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
	if these == nil {
		these = tables
	}
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '10s'"); err != nil {
		t.Fatalf("lock_timeout: %v", err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+strings.Join(these, ", ")+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatalf("lock the tables: %v", err)
	}
	var holder int32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&holder); err != nil {
		t.Fatalf("pid: %v", err)
	}
	with(holder)
	return tables
}

// judgeBlocked makes the call, gives up on it (the way kind says) once it
// is seen waiting for holder (pg_blocking_pids), and wants an error from a
// call that waited.
func judgeBlocked(ctx context.Context, t tester, admin *pgxpool.Pool, holder int32, c blockedCall, kind giveUpKind, behind string) {
	t.Helper()
	// The calls given up on before may still wait until their cancel
	// reaches the server: none may be taken for this one's wait.
	if err := awaitNoWaiter(ctx, admin, holder); err != nil {
		t.Fatalf("before %s: %v", c.what, err)
	}
	callCtx, giveUp := withGiveUp(ctx, kind)
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
		t.Fatalf("%s behind %s: %v", c.what, behind, err)
	}
	o := <-done
	box.rethrow()
	if blocked && !o.ok {
		t.Errorf("%s, waiting behind %s until %s (a HELD reservation in them): %s; want an error (a made-up answer tells the caller the reservation is not there, or not HELD, or that no reservation is due; a node started from a guess sells again what is sold)", c.what, behind, kind, o.answer)
	}
}

// awaitNoWaiter returns once no backend waits for a lock holder holds.
func awaitNoWaiter(ctx context.Context, admin *pgxpool.Pool, holder int32) error {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		var n int
		if err := admin.QueryRow(ctx, sqlBlockedBy, holder).Scan(&n); err != nil {
			return fmt.Errorf("read the lock waits: %w", err)
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d backends still wait behind the locked tables: %w", n, ctx.Err())
		case <-tick.C:
		}
	}
}
