package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// freshDatabase: state a strategy keeps outside PostgreSQL belongs to the
// database it was made for. A database dropped and made again (or
// restored, or a staging run against the production Redis) meets the
// counters and markers of its earlier life under the same SKU names; an
// Open that keeps a counter Redis already has ("a second app server must
// not reset the stock the first is selling from": that is Attach's work,
// not Open's, which is for SKUs new to the database) sells the new stock
// from the old count. Every Open of the kit uses SKU names no deployment
// used before. Here a SKU opened with 5 units and sold twice in the
// trial's database is opened again, with 1 unit, in a fresh database on
// the same resources: it must sell 1; and a SKU of 1 unit sold out there,
// opened with 3 units, must sell 3.
type freshDatabase struct{ twoClaims }

func (f *freshDatabase) run(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	if len(rs) == 0 {
		t.Skip("keeps nothing outside PostgreSQL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	more, fewer := kitSKU("fresh-db-was-5"), kitSKU("fresh-db-was-1")
	req := func(sku string, i int) strategy.Request {
		return strategy.Request{Key: fmt.Sprintf("kit-fresh-%d-%s", i, sku), User: fmt.Sprintf("kit-fresh-%d", i), SKU: sku, TTL: time.Hour}
	}
	held := func(dep strategy.Deployment, sku string, from, n int) int {
		t.Helper()
		got := 0
		for i := from; i < from+n; i++ {
			res, err := reserveUnlessBusy(ctx, dep.Node(0), req(sku, i))
			if err != nil {
				t.Fatalf("Reserve: %v", err)
			}
			if res.Outcome == strategy.OutcomeHeld {
				got++
			}
		}
		return got
	}
	// The earlier life: more (5 units) sells 2, fewer (1 unit) sells out.
	old, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: more, Total: 5}, {SKU: fewer, Total: 1}}})
	if err != nil {
		t.Fatalf("Open in the trial's database: %v", err)
	}
	if n := held(old, more, 0, 2); n != 2 {
		t.Fatalf("the earlier life: %d of 2 HELD", n)
	}
	if n := held(old, fewer, 0, 1); n != 1 {
		t.Fatalf("the earlier life: %d of 1 HELD", n)
	}
	if err := old.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	cfg, drop := emptyDatabase(ctx, t, admin, "kit_fresh", "a fresh database on the same resources is")
	defer drop()
	fresh, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect to the fresh database: %v", err)
	}
	defer closeKitPool(fresh)
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: fresh, Stock: []strategy.Stock{{SKU: more, Total: 1}, {SKU: fewer, Total: 3}}})
	if err != nil {
		t.Fatalf("Open in a fresh database on the same resources: %v", err)
	}
	defer dep.Close()
	f.ran = true
	if n := held(dep, more, 10, 4); n > 1 {
		f.oversold = append(f.oversold, fmt.Sprintf("%d of 4 requests HELD for a SKU of 1 unit (5 in the earlier database, 2 sold there)", n))
	}
	if n := held(dep, fewer, 10, 3); n != 3 {
		f.unconserved = append(f.unconserved, fmt.Sprintf("%d of 3 requests HELD for a SKU of 3 units (1 in the earlier database, sold out there)", n))
	}
	list, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	f.audit(list, " in the fresh database")
}
