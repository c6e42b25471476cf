package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// bigTotal is above what 16-bit counters hold (signed and unsigned): a
// strategy that stores stock as smallint cannot open it, one that counts
// in an int16 wraps. The scenarios' totals are at most a few hundred. It
// is one past a multiple of every round chunk size (1,000, 5,000, 10,000),
// so a strategy that loads a big SKU in chunks and drops the last, short
// one shows it (a slotrows that loaded 10,000 slots at a time with the
// wrong bound passed with 70,000).
const bigTotal = 70_001

// checkBigTotal: a SKU of bigTotal units opens, sells one unit, and gives
// it back, and the audit counts them exactly.
func checkBigTotal(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("big-total")
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: bigTotal}}})
	if err != nil {
		t.Fatalf("Open of a SKU with %d units (Config allows up to %d): %v", bigTotal, strategy.MaxTotal, err)
	}
	defer dep.Close()
	audit := func(when string, available, active int) {
		t.Helper()
		list, err := dep.Audit(ctx)
		if err != nil || len(list) != 1 {
			t.Fatalf("Audit %s: %+v, %v", when, list, err)
		}
		if a := list[0]; a.Total != bigTotal || a.Available != available || a.Active != active {
			t.Errorf("Audit of a SKU of %d units %s: total %d, available %d, active %d; want %d, %d, %d", bigTotal, when, a.Total, a.Available, a.Active, bigTotal, available, active)
		}
	}
	audit("after Open", bigTotal, 0)
	req := strategy.Request{Key: "kit-big-" + sku, User: "kit-big-user", SKU: sku, TTL: time.Hour}
	if res, err := reserveUnlessBusy(ctx, dep.Node(0), req); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("Reserve of a SKU with %d units: %s, %v; want HELD", bigTotal, res.Outcome, err)
	}
	audit("after one reservation", bigTotal-1, 1)
	if r, ok := dep.Node(0).(strategy.Releaser); ok {
		if n, err := r.Release(ctx, req.Key); err != nil || n != 1 {
			t.Fatalf("Release: %d, %v; want 1", n, err)
		}
		audit("after its release", bigTotal, 0)
	}
}

// evenSplits are (nodes, total) pairs whose even split leaves a remainder:
// node i gets strategy.ShareOf(total, nodes, i), which rounds down and
// gives the first total % nodes nodes one more. "Each node but the last
// gets ceil(total/nodes), the last the rest" agrees with it on 2 nodes
// (every other check's) and sells more than the total on 3 or more.
var evenSplits = [][2]int{{3, 1}, {4, 5}, {5, 4}, {3, 4}}

// checkEvenSplit: where nodes split the stock evenly (Stock.Shares nil),
// each node's configured share is strategy.Stock.Share, and requests on
// every node until each answers SOLD_OUT sell at most the total.
func checkEvenSplit(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, split := range evenSplits {
		nodes, total := split[0], split[1]
		st := strategy.Stock{SKU: kitSKU(fmt.Sprintf("even-%d-%d", nodes, total)), Total: total}
		dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Nodes: nodes, Stock: []strategy.Stock{st}})
		if err != nil {
			t.Fatalf("Open of %d units on %d nodes: %v", total, nodes, err)
		}
		held := 0
		for i := 0; i < (total+1)*nodes; i++ {
			req := strategy.Request{Key: fmt.Sprintf("kit-even-%d-%s", i, st.SKU), User: fmt.Sprintf("kit-even-%d", i), SKU: st.SKU, TTL: time.Hour}
			res, err := reserveUnlessBusy(ctx, dep.Node(i%nodes), req)
			if err != nil {
				_ = dep.Close()
				t.Fatalf("Reserve on node %d of %d: %v", i%nodes, nodes, err)
			}
			if res.Outcome == strategy.OutcomeHeld {
				held++
			}
		}
		list, err := dep.Audit(ctx)
		_ = dep.Close()
		if err != nil || len(list) != 1 {
			t.Fatalf("Audit: %+v, %v", list, err)
		}
		a := list[0]
		if held > total || a.Active > total || a.Drift() != 0 {
			t.Errorf("%d units split evenly over %d nodes, %d requests on each: %d HELD, audit total %d, available %d, active %d; want at most %d, drift 0",
				total, nodes, total+1, held, a.Total, a.Available, a.Active, total)
		}
		for _, n := range a.Nodes {
			if want := st.Share(nodes, n.Node); n.Share != want {
				t.Errorf("%d units split evenly over %d nodes: node %d's share is %d, want %d (strategy.ShareOf)", total, nodes, n.Node, n.Share, want)
			}
		}
	}
}
