package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkExpiredByOtherNodeThenRestart: a unit sold by one node and expired by
// the job on another goes back to the stock once, however the nodes count
// it: then the seller restarts, and the SKU sells no more than its total. A
// node that keeps a share in memory and gives an expired unit to the node
// that ran the job, not to the one that sold it, keeps the total right
// (the audit balances) with the unit in the wrong counter; the seller's
// recount on restart frees the same unit again (outsider round 36's
// m2mqexpireownnode, memquota-recover): no scenario sold on one node,
// expired on another and restarted the seller. Two nodes, a SKU of 2
// units, shares [1, 1]: node 1 holds one; MakeDue; node 0 runs the job;
// node 1 restarts; then new users ask on both nodes in turn, six in all:
// at most 2 HELD.
func checkExpiredByOtherNodeThenRestart(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	if !meta.Claims.Has(strategy.SurvivesRestart) {
		t.Skip("survives-restart is not claimed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("expired-elsewhere")
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: sku, Total: 2, Shares: []int{1, 1}}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	restarter, ok := dep.(strategy.Restarter)
	if !ok {
		t.Skip("no Restart (strategy.Restarter)")
	}
	ager, ok := dep.(strategy.Ager)
	if !ok {
		t.Skip("no MakeDue (strategy.Ager)")
	}
	expirer, ok := dep.Node(0).(strategy.Expirer)
	if !ok {
		t.Skip("no expiry job (strategy.Expirer)")
	}
	sold := strategy.Request{Key: "kit-eo-sold-" + sku, User: "kit-eo-sold", SKU: sku, TTL: time.Hour}
	holdForCheck(ctx, t, dep.Node(1), sold)
	if n, err := ager.MakeDue(ctx, []string{sold.Key}); err != nil || n != 1 {
		t.Fatalf("MakeDue: %d, %v; want 1", n, err)
	}
	if units, err := expirer.ExpireDue(ctx); err != nil || units != 1 {
		t.Fatalf("ExpireDue on node 0 of node 1's due reservation: %d, %v; want 1", units, err)
	}
	if err := restarter.Restart(ctx, 1); err != nil {
		t.Fatalf("Restart of node 1: %v", err)
	}
	held := 0
	var answers []string
	for i := 0; i < 6; i++ {
		req := strategy.Request{Key: fmt.Sprintf("kit-eo-%d-%s", i, sku), User: fmt.Sprintf("kit-eo-%d", i), SKU: sku, TTL: time.Hour}
		res, err := reserveUntilAnswered(ctx, dep.Node(i%2), req)
		answers = append(answers, fmt.Sprintf("node %d: %s", i%2, res.Outcome))
		if err == nil && res.Outcome == strategy.OutcomeHeld {
			held++
		}
	}
	if held > 2 {
		t.Errorf("a SKU of 2 units (shares [1, 1]), a unit sold on node 1 and expired by the job on node 0, node 1 restarted: %d new users HELD %v; want at most 2", held, answers)
	}
}
