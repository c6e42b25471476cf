package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkCrashedResentDuringRestart: a request for the one unit of a SKU dies
// on node 0 between its effect in memory and its write (CrashMidReserve).
// Its client sends it again through node 1, and that resend's write waits
// (the harness holds the strategy's tables in SHARE mode) while node 0
// restarts; then the write goes through, and new users ask for the SKU.
// The unit is the resend's now: node 0's restart, which gives back what
// its dead requests took, must not give it back too. A strategy that keeps
// a note of which node took a unit for a key (rediscounter's markers) and
// does not move the note to the node of the resend has node 0's recount
// find a unit of its own with no row yet, give it back, and the SKU sells
// it a second time once the resend commits (outsider round 19). node-death
// restarts after its dead requests but never resends them elsewhere, and
// restart-in-flight's requests in flight never died first.
//
// For a strategy that claims survives-restart and counts in a node's
// memory (ReserveCrasher, Restarter). The resend is seen waiting on the
// harness's lock (pg_stat_activity) or has answered before the restart
// begins; a restart that waits for the tables is let go after
// restartWaitMax, as in restart-in-flight.
func checkCrashedResentDuringRestart(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	if !meta.Claims.Has(strategy.SurvivesRestart) {
		t.Skip("survives-restart not claimed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("crash-resend")
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: sku, Total: 1}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	crasher, crashes := dep.(strategy.ReserveCrasher)
	restarter, restarts := dep.(strategy.Restarter)
	if !crashes || !restarts {
		t.Skip("nothing in a node's memory to lose mid-reserve (strategy.ReserveCrasher), or no Restart")
	}
	req := strategy.Request{Key: "kit-cr-1-" + sku, User: "kit-cr-u1", SKU: sku, TTL: time.Hour}
	_ = crasher.CrashMidReserve(ctx, 0, req) // an error either way: the request died

	release := holdTablesOrSkip(ctx, t, admin)
	defer func() { release() }()
	var box panicBox
	defer box.rethrow()
	resend := reserveAsync(ctx, &box, dep.Node(1), req)
	if err := awaitLockWaiters(ctx, admin, 1, resend); err != nil {
		t.Fatalf("the resend of %q through node 1: %v", req.Key, err)
	}
	restarted := restartLettingGo(ctx, &box, restarter, 0, release)
	release = func() {}
	a := <-resend
	if err := restarted(); err != nil {
		t.Fatalf("Restart node 0 while the resend waited: %v", err)
	}
	if held, st := sellAfterRestart(ctx, t, dep, sku, "kit-cr"); st.Active > st.Total {
		t.Errorf("SKU of 1 unit: a request died mid-reserve on node 0 and was sent again through node 1, whose write waited while node 0 restarted (answered %s, %v); then %d of 3 new users HELD it; audit: %d active for %d (node 0's restart gave back the resend's unit)",
			a.res.Outcome, a.err, held, st.Active, st.Total)
	}
}

// holdTablesOrSkip holds the strategy's tables in SHARE mode (holdTables)
// until release is called, and skips a strategy that keeps no tables in
// PostgreSQL: its writes cannot be made to wait.
func holdTablesOrSkip(ctx context.Context, t tester, admin *pgxpool.Pool) (release func()) {
	t.Helper()
	skipWithoutTables(ctx, t, admin)
	release, err := holdTables(ctx, admin, "SHARE")
	if err != nil {
		t.Fatalf("%v", err)
	}
	return release
}

// skipWithoutTables skips a strategy that keeps no tables in PostgreSQL.
func skipWithoutTables(ctx context.Context, t tester, admin *pgxpool.Pool) {
	t.Helper()
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatalf("list the strategy's tables: %v", err)
	}
	tables, err := gateTables(ctx, tx)
	_ = tx.Rollback(ctx)
	if err != nil {
		t.Fatalf("list the strategy's tables: %v", err)
	}
	if len(tables) == 0 {
		t.Skip("the strategy keeps no tables in PostgreSQL: nothing to lock")
	}
}

// awaitLockWaiters waits until n backends of the database wait for a
// heavyweight lock, or done has an answer (left in it), or its call waits
// for a lock outside PostgreSQL (lockWaiting), for at most
// resendSeenWithin: a request that waits outside PostgreSQL in a way the
// strategy does not report is not seen, and the check goes on without it.
func awaitLockWaiters(ctx context.Context, admin *pgxpool.Pool, n int, done chan answer) error {
	return awaitLockWaitersWithin(ctx, admin, n, done, resendSeenWithin)
}

// awaitLockWaitersWithin is awaitLockWaiters for at most within.
func awaitLockWaitersWithin(ctx context.Context, admin *pgxpool.Pool, n int, done chan answer, within time.Duration) error {
	seenCtx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	err := awaitAnswerOr(seenCtx, done, func() (bool, error) {
		if lockWaiting(done) {
			return true, nil
		}
		var got int
		err := admin.QueryRow(seenCtx, sqlWaitingOnLock).Scan(&got)
		return got >= n, err
	})
	if ctx.Err() != nil {
		return err
	}
	return nil
}

// restartLettingGo restarts node i while the harness holds the tables, and
// lets them go (release) once the restart has returned or after
// restartWaitMax, as restart-in-flight does: a restart that waits for the
// node's requests in flight cannot return while they are held. The
// returned function waits for the restart's end.
func restartLettingGo(ctx context.Context, box *panicBox, r strategy.Restarter, i int, release func()) func() error {
	restarted := make(chan error, 1)
	go func() {
		err := fmt.Errorf("restart panicked")
		defer func() { restarted <- err }()
		defer box.catch()
		err = r.Restart(ctx, i)
	}()
	bound := time.NewTimer(restartWaitMax)
	defer bound.Stop()
	select {
	case err := <-restarted:
		restarted <- err
	case <-bound.C: // it waits for the tables (or is slow): let them go
	}
	release()
	return func() error { return <-restarted }
}

// sellAfterRestart sends three requests of new users for sku, over nodes 0
// and 1, and returns how many were HELD and the SKU's audit after them.
func sellAfterRestart(ctx context.Context, t tester, dep strategy.Deployment, sku, prefix string) (int, strategy.StockAudit) {
	t.Helper()
	held := 0
	for i := 2; i <= 4; i++ {
		r := strategy.Request{Key: fmt.Sprintf("%s-%d-%s", prefix, i, sku), User: fmt.Sprintf("%s-u%d", prefix, i), SKU: sku, TTL: time.Hour}
		res, err := reserveUnlessBusy(ctx, dep.Node(i%2), r)
		if err != nil {
			t.Fatalf("Reserve %q after the restart: %v", r.Key, err)
		}
		if res.Outcome == strategy.OutcomeHeld {
			held++
		}
	}
	list, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	for _, st := range list {
		if st.SKU == sku {
			return held, st
		}
	}
	t.Fatalf("Audit: no line for %s", sku)
	return held, strategy.StockAudit{}
}

// sqlWaitingOnLock counts the backends of the database, other than the one
// asking, that wait for a heavyweight lock.
const sqlWaitingOnLock = `
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'`

// checkResendGivenUpThenRestarted is the other order: the first attempt
// for the one unit of a SKU is in flight on node 0 (its write waits on the
// harness's SHARE lock), its client gives up and sends it again through
// node 1, gives up on that too while its write waits, and node 1 restarts;
// then the first attempt's write goes through, and new users ask for the
// SKU. Node 1's restart gives back what its own dead requests took: the
// resend took nothing of its own, and the first attempt's unit must stay
// out. rediscounter marked a resent key as the resend's node alone, and
// node 1's recount gave the unit back (outsider round 19).
func checkResendGivenUpThenRestarted(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	if !meta.Claims.Has(strategy.SurvivesRestart) {
		t.Skip("survives-restart not claimed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("resend-restart")
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: sku, Total: 1}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	restarter, restarts := dep.(strategy.Restarter)
	if !restarts {
		t.Skip("no Restart (strategy.Restarter)")
	}
	release := holdTablesOrSkip(ctx, t, admin)
	defer func() { release() }()
	var box panicBox
	defer box.rethrow()
	req := strategy.Request{Key: "kit-rr-1-" + sku, User: "kit-rr-u1", SKU: sku, TTL: time.Hour}
	first := reserveAsync(ctx, &box, dep.Node(0), req)
	if err := awaitLockWaiters(ctx, admin, 1, first); err != nil {
		t.Fatalf("Reserve %q while the tables are held: %v", req.Key, err)
	}
	resendCtx, giveUp := context.WithCancel(ctx)
	resend := reserveAsync(resendCtx, &box, dep.Node(1), req)
	if err := awaitLockWaiters(ctx, admin, 2, resend); err != nil {
		t.Fatalf("the resend of %q through node 1 while the tables are held: %v", req.Key, err)
	}
	giveUp()
	r := givenUpAnswer(t, resend, fmt.Sprintf("the resend of %q through node 1", req.Key))
	restarted := restartLettingGo(ctx, &box, restarter, 1, release)
	release = func() {}
	a := <-first
	if err := restarted(); err != nil {
		t.Fatalf("Restart node 1 after its resend was given up: %v", err)
	}
	if held, st := sellAfterRestart(ctx, t, dep, sku, "kit-rr"); st.Active > st.Total {
		t.Errorf("SKU of 1 unit: a request in flight on node 0 (answered %s, %v) was sent again through node 1 and given up (%s, %v), and node 1 restarted before the first was written; then %d of 3 new users HELD it; audit: %d active for %d (node 1's restart gave back the first attempt's unit)",
			a.res.Outcome, a.err, r.res.Outcome, r.err, held, st.Active, st.Total)
	}
}
