package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkSessionAcrossRestart: where survives-restart is claimed, two
// attempts held open on node 0 (a cart each, on a SKU of 1 unit each) while
// node 0 restarts, one then rolled back and one committed, leave each SKU
// selling its unit once: the rolled-back cart's unit comes back once, the
// committed one's stays taken (or comes back once, if its commit failed on
// the closed node). A restart recounts a node from what is committed, so
// an attempt in flight is not counted; a cart that then gives its units
// back to the node as it is now, the restarted one, counts them twice
// (outsider round 21's sessionnode). No other check keeps an attempt open
// across a restart. The restart either returns or waits for the carts,
// for at most besideWithin, before they end.
func checkSessionAcrossRestart(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, restarter, rolled, committed := openForRestart(ctx, t, meta, db, rs, "cart-restart-rb", "cart-restart-c")
	defer dep.Close()
	opener, ok := dep.Node(0).(strategy.SessionOpener)
	if !ok {
		t.Skip("no attempt held open (strategy.SessionOpener)")
	}
	req := func(sku string) strategy.Request {
		return strategy.Request{Key: "kit-cart-restart-" + sku, User: "kit-cart-restart", SKU: sku, TTL: time.Hour}
	}
	back, pids := holdInSession(ctx, t, opener, req(rolled), "the cart rolled back after the restart")
	defer func() { _ = back.Rollback(context.Background()) }()
	kept, _ := holdInSession(ctx, t, opener, req(committed), "the cart committed after the restart")
	defer func() { _ = kept.Rollback(context.Background()) }()

	var box panicBox
	defer box.rethrow()
	restarted := make(chan error, 1)
	go func() {
		defer box.catch()
		restarted <- restarter.Restart(ctx, 0)
	}()
	waitCtx, waitCancel := context.WithTimeout(ctx, besideWithin)
	_, err := awaitAnswerOrBlocked(waitCtx, admin, int32(pids[0]), restarted)
	waitCancel()
	if err != nil && ctx.Err() != nil {
		t.Fatalf("Restart of node 0 beside two carts: %v", err)
	}
	rbErr := back.Rollback(ctx)
	cErr := kept.Commit(ctx)
	if err := <-restarted; err != nil {
		t.Fatalf("Restart of node 0 while two carts were open on it: %v", err)
	}
	for _, sku := range []string{rolled, committed} {
		had := 0
		if sku == committed && cErr == nil {
			had = 1
		}
		sold := had
		for i, n := range []int{0, 0, 1} {
			user := fmt.Sprintf("kit-cart-restart-after-%d", i)
			res, err := reserveUnlessBusy(ctx, dep.Node(n), strategy.Request{Key: user + "-" + sku, User: user, SKU: sku, TTL: time.Hour})
			if err == nil && res.Outcome == strategy.OutcomeHeld {
				sold++
			}
		}
		au, err := soleAuditOf(ctx, dep, sku)
		if err != nil {
			t.Fatalf("%v", err)
		}
		if sold > 1 || au.Active > au.Total {
			t.Errorf("SKU of 1 unit, taken by a cart on node 0 that node 0's restart met (then the rollback: %v; the commit of the other cart: %v): %d HELD in all, the cart's included, audit %+v; want at most 1 (a unit the restart recounted came back from the cart too)",
				rbErr, cErr, sold, au)
		}
	}
}
