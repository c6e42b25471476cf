package onetrip

import (
	"context"
	"fmt"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// moves are the transitions out of HELD: hotrow's statements over onetrip's
// tables, each one statement in autocommit (pgstrategy.StockRow).
var moves = pgstrategy.NewStockRow(Name, "onetrip")

// Confirm moves the reservation from HELD to CONFIRMED and reports whether
// this call moved it.
func (n *node) Confirm(ctx context.Context, key string, mode strategy.ConfirmMode) (bool, error) {
	if ok, err := n.CheckKey(key); !ok {
		return false, err
	}
	return moves.Confirm(ctx, n.d.db, key, n.d.skus, mode)
}

// Release moves the reservation from HELD to RELEASED and gives its unit
// back, in one statement; it returns 1 if this call moved the row, else 0.
func (n *node) Release(ctx context.Context, key string) (int, error) {
	if ok, err := n.CheckKey(key); !ok {
		return 0, err
	}
	units, err := moves.Release(ctx, n.d.db, key, n.d.skus)
	n.forgetSoldOut(units)
	return units, err
}

// ExpireDue moves every due HELD reservation of the deployment's SKUs to
// EXPIRED and returns the units it gave back, in one statement.
func (n *node) ExpireDue(ctx context.Context) (int, error) {
	if err := n.Check(); err != nil {
		return 0, err
	}
	units, err := moves.ExpireDue(ctx, n.d.db, n.d.skus)
	n.forgetSoldOut(units)
	if err == nil && n.d.expiryHealsCount {
		if _, err := n.d.db.Exec(ctx, sqlHealCount, n.d.skus); err != nil {
			return units, fmt.Errorf("%s: expire due: heal the count: %w", Name, err)
		}
	}
	return units, err
}

// sqlHealCount is Options.ExpiryHealsCount's mistake.
const sqlHealCount = `
UPDATE onetrip_stock s
SET available = s.total - (SELECT count(*) FROM onetrip_reservation r
                           WHERE r.sku = s.sku AND r.status IN ('HELD', 'CONFIRMED'))
WHERE s.sku = ANY($1)`

// forgetSoldOut clears the node's sold-out hints after it gave units back,
// under Options.SoldOutFromMemory only: the correct node clears a hint when
// sqlWhyNot reads a unit, whichever node gave it back.
func (n *node) forgetSoldOut(units int) {
	if !n.d.soldOutFromMemory || units == 0 {
		return
	}
	for _, h := range n.soldOut {
		h.Store(false)
	}
}
