package strategytest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
)

// openOneSKU opens, for a check, a deployment of one node with a fresh SKU
// (kitSKU(prefix)) of total units, and returns it with the SKU; the check
// ends when Open fails. The caller closes the deployment.
func openOneSKU(ctx context.Context, t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string, prefix string, total int) (strategy.Deployment, string) {
	t.Helper()
	sku := kitSKU(prefix)
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: total}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return dep, sku
}

// holdForCheck reserves req on s as a check's setup, not its subject, and
// returns its key: HELD, or after an unknown outcome the REPLAY of the send
// that held it (reserveUntilAnswered). Any other answer ends the check.
func holdForCheck(ctx context.Context, t tester, s strategy.Strategy, req strategy.Request) string {
	t.Helper()
	if res, err := reserveUntilAnswered(ctx, s, req); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("Reserve %q on a fresh SKU: %s, %v; want HELD", req.Key, res.Outcome, err)
	}
	return req.Key
}

// openForRestart opens, for a check of what a restart of node 0 keeps, a
// deployment of two nodes with two fresh SKUs of 1 unit each
// (kitSKU(first), kitSKU(second)), both on node 0 (shares [1, 0]), and
// returns it with its Restarter and the two SKUs. The check is skipped
// where survives-restart is not claimed or the deployment cannot restart.
// The caller closes the deployment.
func openForRestart(ctx context.Context, t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string, first, second string) (strategy.Deployment, strategy.Restarter, string, string) {
	t.Helper()
	if !meta.Claims.Has(strategy.SurvivesRestart) {
		t.Skip("survives-restart is not claimed")
	}
	a, b := kitSKU(first), kitSKU(second)
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Nodes: 2, Stock: []strategy.Stock{
		{SKU: a, Total: 1, Shares: []int{1, 0}}, {SKU: b, Total: 1, Shares: []int{1, 0}}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	restarter, ok := dep.(strategy.Restarter)
	if !ok {
		dep.Close()
		t.Skip("no Restart (strategy.Restarter)")
	}
	return dep, restarter, a, b
}

// openOneSKUForSessions is openOneSKU for a check about attempts held
// open: it returns node 0's SessionOpener too, and skips the check for a
// strategy without them. The caller closes the deployment.
func openOneSKUForSessions(ctx context.Context, t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string, prefix string, total int) (strategy.Deployment, strategy.SessionOpener, string) {
	t.Helper()
	sku := kitSKU(prefix)
	dep, opener := openForSessions(ctx, t, meta, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: total}}})
	return dep, opener, sku
}

// openForSessions opens cfg for a check about attempts held open, and
// returns the deployment (the caller closes it) and node 0's SessionOpener;
// it skips the check for a strategy without them.
func openForSessions(ctx context.Context, t tester, meta strategy.Meta, cfg strategy.Config) (strategy.Deployment, strategy.SessionOpener) {
	t.Helper()
	dep, err := meta.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	opener, ok := dep.Node(0).(strategy.SessionOpener)
	if !ok {
		_ = dep.Close()
		t.Skip("no attempt held open (strategy.SessionOpener)")
	}
	return dep, opener
}

// closeKitPool closes a pool the kit made for a check, waiting at most 10 s
// for connections the strategy still holds: a strategy that leaked one on
// an error path is reported by the check that ends its transaction
// (checkLeavesNoTransactionOpen) and by the trial's pool count, and the
// check is not left hanging in pgxpool's Close, which waits for ever
// (outsider round 53's b30 hung the contract in sortedRounds' Close).
func closeKitPool(p *pgxpool.Pool) { _ = pgtest.CloseWithin(p, 10*time.Second) }
