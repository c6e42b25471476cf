package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest/internal/pgcontrol"
)

// sqlBlockedPIDs lists the backends waiting for backend $1.
const sqlBlockedPIDs = `SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity WHERE pid <> $1 AND $1 = ANY(pg_blocking_pids(pid))`

// checkTwinUnknown: a request whose outcome is unknown is resolved by its
// own attempt, not by its key. The same request is sent to two nodes: on
// node 1 it is an attempt held open; on node 0 it waits behind that
// attempt (seen in pg_blocking_pids) and its client gives up, so node 0
// never learns what its insert did. Its backend ends (it wrote nothing),
// then the attempt on node 1 commits: the key now has a row, made by the
// other attempt. A strategy that keeps a unit aside for a request in doubt
// and settles it by looking for a row with the key finds that row, keeps
// node 0's unit, and loses it for good: the SKU is then sold out around it
// and the audit shows one unit in no reservation. Every other scenario's
// unknown outcomes had no second attempt of their key, so a key told as
// much as an attempt would. Where survives-restart is claimed, a second
// pass restarts node 0 with its request in doubt before the attempt
// commits.
func checkTwinUnknown(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	twinUnknown(t, meta, db, admin, rs, false)
	if meta.Claims.Has(strategy.SurvivesRestart) {
		twinUnknown(t, meta, db, admin, rs, true)
	}
}

// twinUnknown is one pass of checkTwinUnknown; with restart, node 0
// restarts with its request in doubt before the twin commits. The pass
// without it comes first: a restart's recount settles the doubt, and so
// hides a Settle that is wrong (ctl-settle-by-key).
func twinUnknown(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string, restart bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("twin-unknown")
	const total = 6 // 3 a node where nodes split the stock
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: sku, Total: total}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	opener, ok := dep.Node(1).(strategy.SessionOpener)
	if !ok {
		t.Skip("no attempt held open (strategy.SessionOpener): a request cannot be made to wait behind its own twin")
	}
	req := strategy.Request{Key: "kit-twin-" + sku, User: "kit-twin-user", SKU: sku, TTL: time.Hour}
	session, holder := holdInSession(ctx, t, opener, req, "the request as an attempt held open on node 1")
	defer func() { _ = session.Rollback(ctx) }()

	var box panicBox
	defer box.rethrow()
	reqCtx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	twin := reserveAsync(reqCtx, &box, dep.Node(0), req)
	blocked, err := awaitAnswerOrBlocked(ctx, admin, int32(holder[0]), twin)
	if err != nil {
		t.Fatalf("the same request on node 0: %v", err)
	}
	if !blocked {
		a := <-twin
		t.Logf("the same request on node 0 did not wait behind the attempt held open on node 1 (%s, %v): no outcome in doubt to resolve", a.res.Outcome, a.err)
		return
	}
	var waiting []int32
	if err := admin.QueryRow(ctx, sqlBlockedPIDs, int32(holder[0])).Scan(&waiting); err != nil {
		t.Fatalf("backends waiting for the attempt: %v", err)
	}
	giveUp()
	a := givenUpAnswer(t, twin, "the same request on node 0, waiting behind the attempt on node 1")
	if a.err == nil && a.res.Outcome == strategy.OutcomeHeld {
		t.Errorf("the same request on node 0, its client gone while it waited behind the attempt on node 1: HELD, want an error or a refusal")
	}
	// Where survives-restart is claimed, node 0 restarts with its request
	// in doubt, once that request's backends are gone: what the restart
	// recounts already settles the doubt (the insert wrote nothing), so a
	// restart that carries the doubt over to the new node and settles it
	// again later gives the unit back twice (outsider round 21's
	// doubtcarry).
	// A backend still at work under a deadline of the strategy's own (a
	// batch serving other requests) waits for the twin: the restart goes
	// ahead after besideWithin, and that backend meets the twin's row.
	if r, ok := dep.(strategy.Restarter); ok && restart {
		goneCtx, goneCancel := context.WithTimeout(ctx, besideWithin)
		err := pgcontrol.WaitNone(goneCtx, admin, "backends of node 0's request", goneBackendsSQL, waiting)
		goneCancel()
		if err != nil && ctx.Err() != nil {
			t.Fatalf("node 0's request's backends, before node 0 restarts: %v", err)
		}
		if err := r.Restart(ctx, 0); err != nil {
			t.Fatalf("Restart of node 0 with its request in doubt: %v", err)
		}
	}
	if err := session.Commit(ctx); err != nil {
		t.Fatalf("Commit of the attempt held open on node 1: %v", err)
	}
	// What node 0's backend does now is the strategy's: gone with its
	// client, or still at work under a deadline of the strategy's own (a
	// batch serving other requests too), in which case it meets the
	// committed row. Either way it ends its statement.
	if err := pgcontrol.WaitNone(ctx, admin, "busy backends of node 0's request", sqlStillBusy, waiting); err != nil {
		t.Fatalf("node 0's request's backends: %v", err)
	}
	// Sell the rest on both nodes, so that any unit kept aside for node 0's
	// request shows: every unit is then in a reservation or available.
	sold := 0
	for i := 0; i < 2*total; i++ {
		r := strategy.Request{Key: fmt.Sprintf("kit-twin-after-%d-%s", i, sku), User: fmt.Sprintf("kit-twin-after-%d", i), SKU: sku, TTL: time.Hour}
		res, err := reserveUnlessBusy(ctx, dep.Node(i%2), r)
		if err != nil {
			t.Fatalf("Reserve %d after the attempt committed: %v", i, err)
		}
		if res.Outcome == strategy.OutcomeHeld {
			sold++
		}
	}
	audit := func() strategy.StockAudit {
		t.Helper()
		list, err := dep.Audit(ctx)
		if err != nil || len(list) != 1 {
			t.Fatalf("Audit: %+v, %v", list, err)
		}
		return list[0]
	}
	au := audit()
	if au.Drift() != 0 {
		// A unit in doubt may rightly wait until the backend that ran its
		// insert is gone (its transaction could, for all the strategy can
		// see, still be running), and a backend whose client left may be
		// idle a moment before it exits. Once it is gone, one more request
		// lets the strategy settle.
		if err := pgcontrol.WaitNone(ctx, admin, "backends of node 0's request", goneBackendsSQL, waiting); err != nil {
			t.Fatalf("node 0's request's backends, with the audit off by %d: %v", au.Drift(), err)
		}
		r := strategy.Request{Key: "kit-twin-settle-" + sku, User: "kit-twin-settle", SKU: sku, TTL: time.Hour}
		if res, err := reserveUnlessBusy(ctx, dep.Node(0), r); err != nil {
			t.Fatalf("Reserve once node 0's request's backends were gone: %v", err)
		} else if res.Outcome == strategy.OutcomeHeld {
			sold++
		}
		au = audit()
	}
	if au.Drift() != 0 || au.Active != 1+sold {
		t.Errorf("after the same request's attempt on node 1 committed and node 0's, in doubt, wrote nothing, then %d more were HELD: audit %+v (drift %d); want every unit in a reservation or available (node 0's doubt resolved by its own attempt, not by the key's row)",
			sold, au, au.Drift())
	}
}

// sqlStillBusy counts the backends among these pids that are still there
// and not idle.
const sqlStillBusy = `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int4[]) AND state IS DISTINCT FROM 'idle'`
