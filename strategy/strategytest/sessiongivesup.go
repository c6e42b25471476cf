package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest/internal/pgcontrol"
)

// sqlBackendBusy counts the backend $1 if it is still there and not idle.
const sqlBackendBusy = `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state IS DISTINCT FROM 'idle'`

// checkSessionInsertGivenUp: an attempt held open reserves one unit of a
// SKU of 2, then a second whose caller gives up while its write waits (the
// naming trigger holds it, seen in pg_locks); the attempt then rolls back.
// Nothing was committed, so both units sell again: two new users are
// HELD. A failed write inside a transaction can never commit, whatever the
// error says; a strategy that counts units in memory and keeps the unit of
// a failed write "in doubt" as it must for a plain request (its row may
// have committed) loses it until a restart (outsider round 25's
// mqsessleak). The kit gave up plain requests mid-write only.
func checkSessionInsertGivenUp(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "session-gives-up", 2)
	defer dep.Close()
	node := dep.Node(0)
	opener, ok := node.(strategy.SessionOpener)
	if !ok {
		t.Skip("no attempts held open (strategy.SessionOpener)")
	}
	req := func(i string) strategy.Request {
		return strategy.Request{Key: "kit-session-gives-up-" + i + "-" + sku, User: "kit-session-gives-up-" + i, SKU: sku, TTL: time.Hour}
	}
	second := req("2")
	// The trigger goes on before the attempt opens: installing it waits
	// for every transaction that wrote to the table.
	hold := holdWritesOrSkip(ctx, t, admin, second.Key)
	defer hold.removeOrReport(t)
	session, err := opener.OpenSession(ctx)
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	defer func() { _ = session.Rollback(context.Background()) }()
	// Before the Rollback: a write that ignores its caller's give-up waits
	// for the hold, and the attempt's Rollback for that write.
	defer hold.release()
	if res, err := session.Reserve(ctx, req("1")); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("Session.Reserve on a fresh SKU of 2: %s, %v; want HELD", res.Outcome, err)
	}
	var box panicBox
	defer box.rethrow()
	callerCtx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	done := reserveAsync(callerCtx, &box, session, second)
	pid, err := awaitWaiter(ctx, hold, done, resendSeenWithin)
	if err != nil {
		t.Fatalf("Session.Reserve %q with its row held: %v", second.Key, err)
	}
	if pid == 0 {
		hold.release()
		<-done
		t.Skip("an attempt's request writes no row naming its key, as it was sent, before it answers: nothing to hold it by")
	}
	giveUp()
	gaveUp := givenUpAnswer(t, done, fmt.Sprintf("Session.Reserve %q, its write held", second.Key))
	hold.release()
	// The give-up closed the attempt's connection (pgx's answer to a
	// cancelled statement): its Rollback may fail, and the server rolls the
	// attempt back when its backend notices, which may be after the write
	// it held went in. Until then the attempt's rows stay locked, and a
	// strategy that skips locked rows rightly finds no unit (slotrows did,
	// in a CI run): the requests go once that backend is gone or idle.
	_ = session.Rollback(ctx)
	if err := pgcontrol.WaitNone(ctx, admin, "backends of the attempt whose caller gave up, still in a transaction", sqlBackendBusy, pid); err != nil {
		t.Fatalf("%v", err)
	}
	for _, r := range []strategy.Request{req("3"), req("4")} {
		if res, err := reserveUntilAnswered(ctx, node, r); err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Errorf("an attempt held open reserved a unit of a SKU of 2, then a second whose caller gave up while its write waited (%s, %v), and rolled back; a new user's request then: %s, %v; want HELD (nothing was committed: both units sell again)",
				gaveUp.res.Outcome, gaveUp.err, res.Outcome, err)
		}
	}
}
