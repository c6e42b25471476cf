package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/pgtest/pgproxy"
	"github.com/reservebench/reservebench/strategy"
)

// checkRestartBeforeAnswer: where survives-restart is claimed, a node that
// restarts after a Release (then an expiry job) of its reservation has
// committed, and before the call has its answer, still sells the unit
// once: the SKU of 1 unit, released, sells 1 more, no more. Whatever the
// call does after its commit (a unit given back to a node's count or to
// Redis) meets a node that recounted the released row as free already. A
// node whose transitions stop holding a restart back once their
// statement is sent gives the unit to the restarted node as well, and it
// sells twice (outsider round 21's translife); every other restart of the
// kit lands before a transition's commit (the tables or its row held) or
// after its error (commit-timeout). The answer is held by a proxy in
// front of the server (pgproxy: Delay at Committed) after the server ran
// the COMMIT; the restart either returns or waits for the call, for at
// most besideWithin, before the answer goes on.
func checkRestartBeforeAnswer(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	if !meta.Claims.Has(strategy.SurvivesRestart) {
		t.Skip("survives-restart is not claimed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, pool, closeBoth, err := poolThroughProxy(ctx, db, "", 8)
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer closeBoth()
	dep, restarter, release, expire := openForRestart(ctx, t, meta, pool, rs, "restart-answer-rel", "restart-answer-exp")
	defer dep.Close()
	// Node 0 as it is now: the first restart below makes it anew.
	held := func(sku string) string {
		req := strategy.Request{Key: "kit-restart-answer-" + sku, User: "kit-restart-answer", SKU: sku, TTL: time.Hour}
		if res, err := reserveUnlessBusy(ctx, dep.Node(0), req); err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Fatalf("Reserve %q on node 0, a fresh SKU of 1: %s, %v; want HELD", req.Key, res.Outcome, err)
		}
		return req.Key
	}
	ran := 0
	if r, ok := dep.Node(0).(strategy.Releaser); ok {
		key := held(release)
		restartBeforeAnswer(ctx, t, p, restarter, dep, release, "Release of "+key, func() (int, error) { return r.Release(ctx, key) })
		ran++
	}
	e, isExpirer := dep.Node(0).(strategy.Expirer)
	ager, isAger := dep.(strategy.Ager)
	if isExpirer && isAger {
		key := held(expire)
		if n, err := ager.MakeDue(ctx, []string{key}); err != nil || n != 1 {
			t.Fatalf("MakeDue %q: %d, %v; want 1", key, n, err)
		}
		e = dep.Node(0).(strategy.Expirer)
		restartBeforeAnswer(ctx, t, p, restarter, dep, expire, "ExpireDue of "+key, func() (int, error) { return e.ExpireDue(ctx) })
		ran++
	}
	if ran == 0 {
		t.Skip("neither Release nor an expiry job (strategy.Releaser, strategy.Expirer with strategy.Ager)")
	}
}

// restartBeforeAnswer runs call on node 0 with the answer to its commit
// held, restarts node 0, lets the answer go, and sells the SKU of 1 unit
// through both nodes: at most 1 more HELD.
func restartBeforeAnswer(ctx context.Context, t tester, p *pgproxy.Proxy, restarter strategy.Restarter, dep strategy.Deployment, sku, what string, call func() (int, error)) {
	t.Helper()
	type answered struct {
		n   int
		err error
	}
	var box panicBox
	defer box.rethrow()
	p.Arm(pgproxy.Fault{Point: pgproxy.Committed, Action: pgproxy.Delay, Hits: 1})
	defer p.Deliver()
	done := make(chan answered, 1)
	go func() {
		var a answered
		defer func() { done <- a }()
		defer box.catch()
		a.n, a.err = call()
	}()
	select {
	case <-p.Hits():
	case <-done:
		p.Arm(pgproxy.Fault{})
		t.Skip("a transition answers without committing a write through the strategy's pool: no answer to hold after its commit")
	case <-ctx.Done():
		t.Fatalf("%s: no commit seen: %v", what, ctx.Err())
	}
	restarted := make(chan error, 1)
	go func() {
		defer box.catch()
		restarted <- restarter.Restart(ctx, 0)
	}()
	// A restart that waits for the call (in the node's memory) is let be
	// for besideWithin; one that returns goes first. Either way the
	// answer then goes on.
	timer := time.NewTimer(besideWithin)
	var rerr error
	restartFirst := false
	select {
	case rerr = <-restarted:
		restartFirst = true
	case <-timer.C:
	}
	timer.Stop()
	p.Deliver()
	a := <-done
	if !restartFirst {
		rerr = <-restarted
	}
	if rerr != nil {
		t.Fatalf("Restart of node 0 while the answer of %s was on its way: %v", what, rerr)
	}
	if a.err == nil && a.n != 1 {
		t.Errorf("%s, committed, its answer held while node 0 restarted: %d; want 1", what, a.n)
	}
	sold := 0
	for i, n := range []int{0, 0, 1} {
		user := fmt.Sprintf("kit-restart-answer-after-%d", i)
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
		t.Errorf("SKU of 1 unit: %s committed, node 0 restarted before the call had its answer (the restart %s), then the answer went on (%d, %v); then 3 new buyers: %d HELD, audit %+v (the unit came back twice: once in the restart's recount, once from the call)",
			what, map[bool]string{true: "returned first", false: "waited for the call"}[restartFirst], a.n, a.err, sold, au)
	}
}

// soleAuditOf is the audit of sku, one of dep's SKUs.
func soleAuditOf(ctx context.Context, dep strategy.Deployment, sku string) (strategy.StockAudit, error) {
	audits, err := dep.Audit(ctx)
	if err != nil {
		return strategy.StockAudit{}, fmt.Errorf("audit: %w", err)
	}
	for _, a := range audits {
		if a.SKU == sku {
			return a, nil
		}
	}
	return strategy.StockAudit{}, fmt.Errorf("audit: no row for %s in %+v", sku, audits)
}
