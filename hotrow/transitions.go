package hotrow

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/reservebench/reservebench/strategy"
)

// The transitions out of HELD. Every WHERE carries status = 'HELD': of
// several racing transitions on one row, the first to commit moves it and the
// others, re-evaluating the WHERE on the newest version (READ COMMITTED) or
// failing with 40001 and retrying (REPEATABLE READ, SERIALIZABLE), move
// nothing. Units come back only for rows the statement itself moved
// (RETURNING), in the same statement, so the same transaction.
// Each strategy keeps its own SQL over its own tables; where the contract's
// steps are alike, so are the statements.
const (
	// sqlConfirmBeforeExpiry: HELD -> CONFIRMED while expires_at has not
	// passed (seed 000, figure 28-1).
	sqlConfirmBeforeExpiry = `
UPDATE reservation SET status = 'CONFIRMED', updated_at = now()
WHERE request_key = $1 AND sku = ANY($2) AND status = 'HELD' AND expires_at >= now()`

	// sqlConfirmUntilExpired: HELD -> CONFIRMED as long as no expiry moved
	// the row, whatever expires_at says: the late payment callback of
	// C28-08 (the seed's confirmHeldInTx), racing the expiry job.
	sqlConfirmUntilExpired = `
UPDATE reservation SET status = 'CONFIRMED', updated_at = now()
WHERE request_key = $1 AND sku = ANY($2) AND status = 'HELD'`

	// sqlRelease: HELD -> RELEASED and the unit back, one statement.
	sqlRelease = `
WITH moved AS (
    UPDATE reservation SET status = 'RELEASED', updated_at = now()
    WHERE request_key = $1 AND sku = ANY($2) AND status = 'HELD'
    RETURNING sku
), back AS (
    UPDATE sku_stock s SET available = s.available + 1
    FROM moved WHERE s.sku = moved.sku
    RETURNING 1
)
SELECT count(*)::int FROM back`

	// sqlExpireDue is seed 000's EXPIRE_SQL, restricted to the deployment's
	// SKUs. The sub-statements of WITH share one snapshot and see each
	// other's work only through RETURNING (docs 7.8.4): the units come from
	// moved, the rows this run turned HELD -> EXPIRED, and from nothing read
	// before. A replay finds no HELD due row and returns 0; a concurrent run
	// waits on the row locks and, after the first commits, no longer finds
	// status = 'HELD'.
	sqlExpireDue = `
WITH moved AS (
    UPDATE reservation SET status = 'EXPIRED', updated_at = now()
    WHERE sku = ANY($1) AND status = 'HELD' AND expires_at < now()
    RETURNING sku
), per AS (
    SELECT sku, count(*)::int AS n FROM moved GROUP BY sku
), back AS (
    UPDATE sku_stock s SET available = s.available + per.n
    FROM per WHERE s.sku = per.sku
    RETURNING per.n
)
SELECT coalesce(sum(n), 0)::int FROM back`
)

// Confirm moves the reservation from HELD to CONFIRMED and reports whether
// this call moved it. ConfirmBeforeExpiry also requires expires_at >= now();
// ConfirmUntilExpired only that no expiry or release has moved it. A key of
// another deployment's SKU is not confirmed here.
func (n *node) Confirm(ctx context.Context, key string, mode strategy.ConfirmMode) (bool, error) {
	if ok, err := n.CheckKey(key); !ok {
		return false, err
	}
	query := sqlConfirmBeforeExpiry
	if mode == strategy.ConfirmUntilExpired {
		query = sqlConfirmUntilExpired
	}
	var moved bool
	err := n.d.inTx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, query, key, n.d.skus)
		moved = tag.RowsAffected() == 1
		return err
	})
	if err != nil {
		return false, fmt.Errorf("hotrow: confirm %q: %w", key, err)
	}
	n.d.answered.Delete(key)
	return moved, nil
}

// Release moves the reservation from HELD to RELEASED and gives its unit
// back, in one statement; it returns 1 if this call moved the row, else 0.
func (n *node) Release(ctx context.Context, key string) (int, error) {
	if ok, err := n.CheckKey(key); !ok {
		return 0, err
	}
	var units int
	err := n.d.inTx(ctx, func(tx pgx.Tx) error {
		return n.d.scanUnits(tx.QueryRow(ctx, sqlRelease, key, n.d.skus), &units)
	})
	if err != nil {
		return 0, fmt.Errorf("hotrow: release %q: %w", key, err)
	}
	n.d.answered.Delete(key)
	return units, nil
}

// ExpireDue moves every due HELD reservation of the deployment's SKUs to
// EXPIRED and returns the units it gave back, in one statement.
func (n *node) ExpireDue(ctx context.Context) (int, error) {
	if err := n.Check(); err != nil {
		return 0, err
	}
	var units int
	err := n.d.inTx(ctx, func(tx pgx.Tx) error {
		return n.d.scanUnits(tx.QueryRow(ctx, sqlExpireDue, n.d.skus), &units)
	})
	if err != nil {
		return 0, fmt.Errorf("hotrow: expire due: %w", err)
	}
	return units, nil
}

// scanUnits reads an attempt's units into units: the attempt's alone, or,
// with Options.UnitsSummedOverRetries' mistake, added to the attempts'
// before it.
func (d *Deployment) scanUnits(row pgx.Row, units *int) error {
	if !d.sumUnits {
		return row.Scan(units)
	}
	var u int
	err := row.Scan(&u)
	*units += u // the mistake
	return err
}
