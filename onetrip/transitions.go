package onetrip

import (
	"context"
	"fmt"

	"github.com/reservebench/reservebench/strategy"
)

// The transitions out of HELD, each one statement in autocommit. Every
// WHERE carries status = 'HELD': of several racing transitions on one row
// the first to commit moves it, and the others, re-evaluating the WHERE on
// the newest version (READ COMMITTED), move nothing. Units come back only
// for rows the statement itself moved (RETURNING), in the same statement.
// They are hotrow's statements over onetrip's tables.
const (
	// sqlConfirm: HELD -> CONFIRMED; $3 true is ConfirmUntilExpired (a late
	// payment that races the expiry job, C28-08), false also requires that
	// expires_at has not passed.
	sqlConfirm = `
UPDATE onetrip_reservation SET status = 'CONFIRMED', updated_at = now()
WHERE request_key = $1 AND sku = ANY($2) AND status = 'HELD' AND ($3 OR expires_at >= now())`

	// sqlRelease: HELD -> RELEASED and the unit back, one statement.
	sqlRelease = `
WITH moved AS (
    UPDATE onetrip_reservation SET status = 'RELEASED', updated_at = now()
    WHERE request_key = $1 AND sku = ANY($2) AND status = 'HELD'
    RETURNING sku
), back AS (
    UPDATE onetrip_stock s SET available = s.available + 1
    FROM moved WHERE s.sku = moved.sku
    RETURNING 1
)
SELECT count(*)::int FROM back`

	// sqlExpireDue: every due HELD row of the deployment's SKUs to EXPIRED,
	// and the units it moved back, counted from moved only (docs 7.8.4).
	sqlExpireDue = `
WITH moved AS (
    UPDATE onetrip_reservation SET status = 'EXPIRED', updated_at = now()
    WHERE sku = ANY($1) AND status = 'HELD' AND expires_at < now()
    RETURNING sku
), per AS (
    SELECT sku, count(*)::int AS n FROM moved GROUP BY sku
), back AS (
    UPDATE onetrip_stock s SET available = s.available + per.n
    FROM per WHERE s.sku = per.sku
    RETURNING per.n
)
SELECT coalesce(sum(n), 0)::int FROM back`
)

// Confirm moves the reservation from HELD to CONFIRMED and reports whether
// this call moved it.
func (n *node) Confirm(ctx context.Context, key string, mode strategy.ConfirmMode) (bool, error) {
	if ok, err := n.CheckKey(key); !ok {
		return false, err
	}
	tag, err := n.d.db.Exec(ctx, sqlConfirm, key, n.d.skus, mode == strategy.ConfirmUntilExpired)
	if err != nil {
		return false, fmt.Errorf("onetrip: confirm %q: %w", key, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Release moves the reservation from HELD to RELEASED and gives its unit
// back, in one statement; it returns 1 if this call moved the row, else 0.
func (n *node) Release(ctx context.Context, key string) (int, error) {
	if ok, err := n.CheckKey(key); !ok {
		return 0, err
	}
	var units int
	if err := n.d.db.QueryRow(ctx, sqlRelease, key, n.d.skus).Scan(&units); err != nil {
		return 0, fmt.Errorf("onetrip: release %q: %w", key, err)
	}
	return units, nil
}

// ExpireDue moves every due HELD reservation of the deployment's SKUs to
// EXPIRED and returns the units it gave back, in one statement.
func (n *node) ExpireDue(ctx context.Context) (int, error) {
	if err := n.Check(); err != nil {
		return 0, err
	}
	var units int
	if err := n.d.db.QueryRow(ctx, sqlExpireDue, n.d.skus).Scan(&units); err != nil {
		return 0, fmt.Errorf("onetrip: expire due: %w", err)
	}
	return units, nil
}
