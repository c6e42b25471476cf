package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// userCartSKUs is how many SKUs one user holds a unit of at once in
// checkOneUserManySKUs: past the carts of 10, 20 or 50 items a shop might
// cap, which the contract does not (one active reservation per user and
// SKU, none across SKUs).
const userCartSKUs = 64

// checkOneUserManySKUs: one user reserves a unit of each of userCartSKUs
// SKUs, and each must be HELD. The scenarios' users hold one or two SKUs, so
// a cap on a user's reservations across SKUs ("a cart of 10") answers
// USER_LIMIT nowhere else.
func checkOneUserManySKUs(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, stock := openOneUnitSKUs(ctx, t, meta, db, rs, "cart", userCartSKUs)
	defer dep.Close()
	node := dep.Node(0)
	user := "kit-cart-user-" + stock[0].SKU
	var refused []string
	for i, st := range stock {
		req := strategy.Request{Key: fmt.Sprintf("kit-cart-%d-%s", i, st.SKU), User: user, SKU: st.SKU, TTL: time.Hour}
		res, err := reserveUnlessBusy(ctx, node, req)
		if err != nil || res.Outcome != strategy.OutcomeHeld {
			refused = append(refused, fmt.Sprintf("SKU %d of %d: %s, %v", i+1, len(stock), res.Outcome, err))
		}
	}
	if len(refused) > 0 {
		t.Errorf("one user reserving one unit of each of %d SKUs (one active reservation per user and SKU, none across SKUs): %d not HELD (%s)",
			len(stock), len(refused), sample(refused))
	}
}
