package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkAuditIsWhatSells: an Audit's Available is what the strategy still
// counts as free, so it is exactly what then sells. A SKU of 4 on one node
// sells a unit; for a strategy that counts stock in a node's memory
// (strategy.ReserveCrasher) a request then dies mid-reserve, losing a unit
// from memory; Audit; then requests until SOLD_OUT must hold as many units
// as the audit said were available. An Audit that derives Available from
// the durable rows (share minus active) rather than reading the counter
// shows the lost unit as available and no drift: every audit the
// scenarios take runs where the two agree.
func checkAuditIsWhatSells(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("audit-sells")
	const total = 4
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: total}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	node := dep.Node(0)
	req := func(i int) strategy.Request {
		return strategy.Request{Key: fmt.Sprintf("kit-audit-sells-%d-%s", i, sku), User: fmt.Sprintf("kit-audit-sells-%d", i), SKU: sku, TTL: time.Hour}
	}
	if res, err := reserveUnlessBusy(ctx, node, req(0)); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("Reserve on a fresh SKU of %d: %s, %v; want HELD", total, res.Outcome, err)
	}
	crashed := ""
	if c, ok := dep.(strategy.ReserveCrasher); ok {
		_ = c.CrashMidReserve(ctx, 0, req(1)) // an error either way: the request died
		crashed = ", a request that died mid-reserve"
	}
	list, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	available := -1
	for _, a := range list {
		if a.SKU == sku {
			available = a.Available
		}
	}
	if available < 0 {
		t.Fatalf("Audit has no row for %s", sku)
	}
	held := 0
	for i := 2; i < total+4; i++ {
		res, err := reserveUnlessBusy(ctx, node, req(i))
		if err != nil {
			t.Fatalf("Reserve %q: %v", req(i).Key, err)
		}
		if res.Outcome == strategy.OutcomeHeld {
			held++
		}
	}
	if held != available {
		t.Errorf("after a sale%s, Audit said %d of %d available; then %d sold before SOLD_OUT (Available must be what the strategy still counts as free)", crashed, available, total, held)
	}
}
