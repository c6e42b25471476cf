package strategytest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// skuMarkGroups are SKU suffixes that differ only in a mark a store's key
// scheme is often made to rewrite: a separator (':' to '_', a space, a
// dash, a dot, a slash, or nothing) and a Redis hash tag's braces. Each is
// a SKU of its own.
var skuMarkGroups = [][]string{
	{":m", "_m", "-m", " m", ".m", "/m", "m"},
	{"{b}", "b", "{b", "b}"},
}

// checkSKUsApartByMarks: SKUs that differ only in such a mark are separate
// stock. checkOddText sends such marks in one SKU, and checkDistinctText
// pairs a SKU with its case and width variants; a strategy that rewrites
// ':' to '_', or strips the braces, to keep its own key scheme passes both,
// and two SKUs that meet after the rewrite share one counter (outsider
// round 54's m13 and m14, rediscounter: the last SKU loaded set the shared
// count, and a SKU of 1 unit sold 3). Here one node serves every SKU of
// the groups, each with its own total (1, 2, 3 ... in its group), and each
// must sell exactly its total, and its audit count it.
func checkSKUsApartByMarks(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := kitSKU("marks")
	var stock []strategy.Stock
	for _, group := range skuMarkGroups {
		for i, suffix := range group {
			stock = append(stock, strategy.Stock{SKU: base + suffix, Total: i + 1})
		}
	}
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: stock})
	if err != nil {
		t.Fatalf("Open with %d SKUs that differ only in a separator or braces: %v", len(stock), err)
	}
	defer dep.Close()
	sold := &seller{t: t, dep: dep, nodes: 1, prefix: "kit-marks"}
	for _, st := range stock {
		if held := sold.sellOut(ctx, st.SKU, st.Total+2); len(held) != st.Total {
			t.Errorf("SKU %q of %d units: %d HELD before SOLD_OUT; want %d (SKUs that differ only in a separator or braces are separate stock)", st.SKU, st.Total, len(held), st.Total)
		}
	}
	list, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	by := map[string]strategy.StockAudit{}
	for _, a := range list {
		by[a.SKU] = a
	}
	for _, st := range stock {
		if a := by[st.SKU]; a.Total != st.Total || a.Active != st.Total || a.Drift() != 0 {
			t.Errorf("Audit of SKU %q, sold out: total %d, available %d, active %d; want %d, 0, %d", st.SKU, a.Total, a.Available, a.Active, st.Total, st.Total)
		}
	}
}
