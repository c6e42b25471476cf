package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
)

// outlastAtLeast is the shortest hold of checkWaitOutlastsTimeouts: past a
// timeout a strategy keeps in its own code (a context deadline of a few
// seconds) as well as the 1 s and 2 s of a lock_timeout, which the
// pool's tracer reads anyway (pgtest.LongestTimeoutSet).
const outlastAtLeast = 6 * time.Second

// outlastAtMost caps the hold: a timeout longer than this is the caller's
// business, not a lock wait's.
const outlastAtMost = 40 * time.Second

// checkWaitOutlastsTimeouts: a request that waits behind an attempt held
// open on its SKU (strategy.SessionOpener), or, for a strategy without
// them, behind rows another transaction holds (the way an UPDATE in flight
// holds them), for longer than
// any lock_timeout or statement_timeout the strategy set on its pool's
// connections and at least outlastAtLeast, is not answered SOLD_OUT while
// its SKU has units. A strategy may give up at a timeout of its own: it
// then answers BUSY (nothing written) or an error (unknown), never an
// answer that says it tried. The kit's other lock waits last about a
// second: an advisorylock that bounded its wait for the SKU's lock with a
// 5 s lock_timeout and answered SOLD_OUT passed every scenario before
// (ctl-lock-timeout-sold-out, 500 ms, is caught in contention already).
// The wait is read from the server (pg_blocking_pids); the hold's length
// is what is checked, not a synchronisation. A strategy whose request does
// not wait here passes.
func checkWaitOutlastsTimeouts(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), outlastAtMost+time.Minute)
	defer cancel()
	sku := kitSKU("outlast")
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 3}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	node := dep.Node(0)
	// A reservation first, so that the strategy's reservation rows are
	// among the rows held, not only its stock rows (and so that a
	// strategy that sets its timeouts on its requests has set them once).
	first := strategy.Request{Key: "kit-outlast-1-" + sku, User: "kit-outlast-1", SKU: sku, TTL: time.Hour}
	if res, err := reserveUnlessBusy(ctx, node, first); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("Reserve %q on a fresh SKU of 3: %s, %v; want HELD", first.Key, res.Outcome, err)
	}
	req := func(i int) strategy.Request {
		return strategy.Request{Key: fmt.Sprintf("kit-outlast-%d-%s", i, sku), User: fmt.Sprintf("kit-outlast-%d", i), SKU: sku, TTL: time.Hour}
	}

	// Behind an attempt where the strategy has them: it holds the rows its
	// reservation wrote and whatever the strategy locks outside them (an
	// advisory lock); else behind every row of the database's tables.
	if opener, ok := node.(strategy.SessionOpener); ok {
		session, pids := holdInSession(ctx, t, opener, req(2), "an attempt held open on the SKU")
		defer func() { _ = session.Rollback(context.Background()) }()
		outlastOne(ctx, t, db, admin, node, req(3), "an attempt held open on the SKU", int32(pids[0]), func() error { return session.Rollback(context.Background()) })
		return
	}
	tx, holder := holdAllRows(ctx, t, admin)
	defer tx.Rollback(context.Background()) //nolint:errcheck // rolled back in outlastOne
	outlastOne(ctx, t, db, admin, node, req(2), "the transaction that held the rows", holder, func() error { return tx.Rollback(context.Background()) })
}

// outlastOne sends req and, once it waits for holder, keeps holder for the
// hold before let go; a SOLD_OUT answer is the failure.
func outlastOne(ctx context.Context, t tester, db, admin *pgxpool.Pool, node strategy.Strategy, req strategy.Request, behind string, holder int32, letGo func() error) {
	t.Helper()
	var box panicBox
	defer box.rethrow()
	done := reserveAsync(ctx, &box, node, req)
	waited, probeErr := awaitAnswerOrBlocked(ctx, admin, holder, done)
	hold := min(max(outlastAtLeast, pgtest.LongestTimeoutSet(db)+time.Second), outlastAtMost)
	answeredInHold := false
	if probeErr == nil && waited {
		select {
		case a := <-done:
			done <- a
			answeredInHold = true
		case <-time.After(hold):
		}
	}
	if err := letGo(); err != nil {
		t.Errorf("let go of %s: %v", behind, err)
	}
	a := <-done
	if probeErr != nil {
		t.Fatalf("read the lock waits behind %s: %v", behind, probeErr)
	}
	if !waited || a.err != nil || a.res.Outcome != strategy.OutcomeSoldOut {
		return
	}
	when := "after it let go"
	if answeredInHold {
		when = "before it let go"
	}
	t.Errorf("Reserve %q (new key and user, units left) waited for %s (pg_blocking_pids), which held on for %s, and was answered SOLD_OUT %s: a request that gave up at a timeout of its own must answer BUSY or an error (unknown), not that the SKU has no unit (the longest timeout the strategy's queries set: %s)",
		req.Key, behind, hold, when, pgtest.LongestTimeoutSet(db))
}
