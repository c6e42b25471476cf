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

	release, err := holdTables(ctx, admin, "SHARE")
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer func() { release() }()
	var box panicBox
	defer box.rethrow()
	resend := reserveAsync(ctx, &box, dep.Node(1), req)
	seenCtx, seenCancel := context.WithTimeout(ctx, resendSeenWithin)
	err = awaitAnswerOr(seenCtx, resend, func() (bool, error) {
		var n int
		err := admin.QueryRow(seenCtx, sqlWaitingOnLock).Scan(&n)
		return n > 0, err
	})
	seenCancel()
	if err != nil && ctx.Err() != nil {
		t.Fatalf("the resend of %q through node 1: %v", req.Key, err)
	}
	restarted := make(chan error, 1)
	go func() {
		err := fmt.Errorf("restart panicked")
		defer func() { restarted <- err }()
		defer box.catch()
		err = restarter.Restart(ctx, 0)
	}()
	bound := time.NewTimer(restartWaitMax)
	select {
	case err := <-restarted:
		restarted <- err
	case <-bound.C: // it waits for the tables (or is slow): let them go
	}
	bound.Stop()
	release()
	release = func() {}
	a := <-resend
	if err := <-restarted; err != nil {
		t.Fatalf("Restart node 0 while the resend waited: %v", err)
	}
	held := 0
	for i := 2; i <= 4; i++ {
		r := strategy.Request{Key: fmt.Sprintf("kit-cr-%d-%s", i, sku), User: fmt.Sprintf("kit-cr-u%d", i), SKU: sku, TTL: time.Hour}
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
		if st.SKU == sku && st.Active > st.Total {
			t.Errorf("SKU of 1 unit: a request died mid-reserve on node 0 and was sent again through node 1, whose write waited while node 0 restarted (answered %s, %v); then %d of 3 new users HELD it; audit: %d active for %d (node 0's restart gave back the resend's unit)",
				a.res.Outcome, a.err, held, st.Active, st.Total)
		}
	}
}

// sqlWaitingOnLock counts the backends of the database, other than the one
// asking, that wait for a heavyweight lock.
const sqlWaitingOnLock = `
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'`
