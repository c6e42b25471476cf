package onetrip

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

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
	if n.d.confirmGivesUp {
		return confirmGivingUp(ctx, n.d.db, key, n.d.skus, mode)
	}
	if n.d.confirmDeadline {
		short, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		moved, err := moves.Confirm(short, n.d.db, key, n.d.skus, mode)
		if err != nil && short.Err() != nil && ctx.Err() == nil {
			return false, nil
		}
		return moved, err
	}
	return moves.Confirm(ctx, n.d.db, key, n.d.skus, mode)
}

// confirmGivingUp is Options.ConfirmGivesUp's mistake.
func confirmGivingUp(ctx context.Context, db *pgxpool.Pool, key string, skus []string, mode strategy.ConfirmMode) (moved bool, err error) {
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '2s'"); err != nil {
			return err
		}
		moved, err = moves.Confirm(ctx, tx, key, skus, mode)
		return err
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.LockNotAvailable {
		return false, nil
	}
	return moved, err
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
