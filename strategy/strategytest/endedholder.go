package strategytest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkEndedHolderWhenSoldOut: a user whose reservation of a SKU of one
// unit ended (released, or expired by the job) asks again after another
// user took the unit: the answer is SOLD_OUT, never USER_LIMIT, since an
// ended hold limits nobody. Outsider round 25's mutants of onetrip and
// combine counted a user's reservations of the SKU whatever their status
// in the reading that explains a refused insert; every other check asks
// that reading only while units remain (the insert then decides), or for
// users who hold the SKU or never did.
func checkEndedHolderWhenSoldOut(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	released, expired := kitSKU("ended-rel"), kitSKU("ended-exp")
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: released, Total: 1}, {SKU: expired, Total: 1}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	node := dep.Node(0)
	ran := 0
	askAgain := func(how, sku string) {
		t.Helper()
		ran++
		holdForCheck(ctx, t, node, strategy.Request{Key: "kit-ended-other-" + sku, User: "kit-ended-other", SKU: sku, TTL: time.Hour})
		req := strategy.Request{Key: "kit-ended-again-" + sku, User: "kit-ended-user", SKU: sku, TTL: time.Hour}
		res, err := reserveUntilAnswered(ctx, node, req)
		if err != nil || res.Outcome != strategy.OutcomeSoldOut {
			t.Errorf("a user whose reservation was %s asks again once another user took the SKU's only unit: %s, %v; want SOLD_OUT (an ended hold is no limit)", how, res.Outcome, err)
		}
	}
	first := func(sku string) string {
		return holdForCheck(ctx, t, node, strategy.Request{Key: "kit-ended-first-" + sku, User: "kit-ended-user", SKU: sku, TTL: time.Hour})
	}
	if r, ok := node.(strategy.Releaser); ok {
		key := first(released)
		if units, err := r.Release(ctx, key); err != nil || units != 1 {
			t.Fatalf("Release %s: %d units, %v; want 1", key, units, err)
		}
		askAgain("released", released)
	}
	ager, ages := dep.(strategy.Ager)
	expirer, expires := node.(strategy.Expirer)
	if ages && expires {
		key := first(expired)
		if n, err := ager.MakeDue(ctx, []string{key}); err != nil || n != 1 {
			t.Fatalf("MakeDue %s: %d, %v; want 1", key, n, err)
		}
		if units, err := expirer.ExpireDue(ctx); err != nil || units < 1 {
			t.Fatalf("ExpireDue with %s due: %d units, %v; want at least 1", key, units, err)
		}
		askAgain("expired by the job", expired)
	}
	if ran == 0 {
		t.Skip("no Release (strategy.Releaser), and no expiry job with a way to age a hold (strategy.Expirer, strategy.Ager)")
	}
}
