package strategytest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkEndedKeyWhenSoldOut: a key whose reservation ended is known for
// good, also once its SKU has no unit left. On a SKU of 1 unit, k1 is held
// and released (or expired by the job), k2 of another user takes the unit;
// then k1 sent again by its owner is REPLAY of the ended reservation, by a
// third user KEY_REUSED carrying the owner, and by k2's user, who holds the
// SKU, KEY_REUSED, not USER_LIMIT. The scenarios resend ended keys only
// while their SKU has units and their sender holds nothing of it, where a
// strategy that looks a key up among active reservations alone, and counts
// the stock before it inserts, still meets the key's unique index and
// answers right (outsider round 49's m11 answered SOLD_OUT here).
func checkEndedKeyWhenSoldOut(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "ended-sold-out", 1)
	defer dep.Close()
	node := dep.Node(0)
	first := strategy.Request{Key: "kit-ended-1-" + sku, User: "kit-ended-u1", SKU: sku, TTL: time.Hour}
	holdForCheck(ctx, t, node, first)
	var ended strategy.Status
	rel, releases := node.(strategy.Releaser)
	expirer, expires := node.(strategy.Expirer)
	ager, ages := dep.(strategy.Ager)
	switch {
	case releases:
		if units, err := rel.Release(ctx, first.Key); err != nil || units != 1 {
			t.Fatalf("Release %q: %d, %v; want 1", first.Key, units, err)
		}
		ended = strategy.StatusReleased
	case expires && ages:
		if n, err := ager.MakeDue(ctx, []string{first.Key}); err != nil || n != 1 {
			t.Fatalf("MakeDue %q: %d, %v; want 1", first.Key, n, err)
		}
		if units, err := expirer.ExpireDue(ctx); err != nil || units != 1 {
			t.Fatalf("ExpireDue: %d, %v; want 1", units, err)
		}
		ended = strategy.StatusExpired
	default:
		t.Skip("no Release and no expiry job with MakeDue: no reservation ends")
	}
	holder := strategy.Request{Key: "kit-ended-2-" + sku, User: "kit-ended-u2", SKU: sku, TTL: time.Hour}
	holdForCheck(ctx, t, node, holder)
	for _, c := range []struct {
		who  string
		req  strategy.Request
		want strategy.Outcome
	}{
		{"its owner", first, strategy.OutcomeReplay},
		{"another user", strategy.Request{Key: first.Key, User: "kit-ended-u3", SKU: sku, TTL: time.Hour}, strategy.OutcomeKeyReused},
		{"the user who holds the SKU's unit", strategy.Request{Key: first.Key, User: holder.User, SKU: sku, TTL: time.Hour}, strategy.OutcomeKeyReused},
	} {
		res, err := reserveUnlessBusy(ctx, node, c.req)
		switch {
		case err != nil || res.Outcome != c.want:
			t.Errorf("Reserve of key %q (%s, on SKU %q, sold out), sent again by %s: %s, %v; want %s", first.Key, ended, sku, c.who, res.Outcome, err, c.want)
		case res.Reservation.Key != first.Key || res.Reservation.User != first.User || res.Reservation.Status != ended:
			t.Errorf("Reserve of key %q (%s), sent again by %s: %s carrying %+v; want the key's own reservation, %s, of user %q", first.Key, ended, c.who, res.Outcome, res.Reservation, ended, first.User)
		}
	}
}
