package redislock

import (
	"context"
	"fmt"

	"github.com/reservebench/reservebench/strategy"
)

// The transitions out of HELD take no lock: they only ever give units
// back, each in the statement that moves the row (strategy A's SQL over
// this strategy's tables), so every WHERE carries status = 'HELD' and the
// units come from the rows moved (RETURNING).
const (
	sqlConfirm = `
UPDATE {p}_reservation SET status = 'CONFIRMED', updated_at = now()
WHERE request_key = $1 AND sku = ANY($2) AND status = 'HELD' AND ($3 OR expires_at >= now())`

	sqlRelease = `
WITH moved AS (
    UPDATE {p}_reservation SET status = 'RELEASED', updated_at = now()
    WHERE request_key = $1 AND sku = ANY($2) AND status = 'HELD'
    RETURNING sku
), back AS (
    UPDATE {p}_stock s SET available = s.available + 1
    FROM moved WHERE s.sku = moved.sku
    RETURNING 1
)
SELECT count(*)::int FROM back`

	sqlExpireDue = `
WITH moved AS (
    UPDATE {p}_reservation SET status = 'EXPIRED', updated_at = now()
    WHERE sku = ANY($1) AND status = 'HELD' AND expires_at < now()
    RETURNING sku
), per AS (
    SELECT sku, count(*)::int AS n FROM moved GROUP BY sku
), back AS (
    UPDATE {p}_stock s SET available = s.available + per.n
    FROM per WHERE s.sku = per.sku
    RETURNING per.n
)
SELECT coalesce(sum(n), 0)::int FROM back`

	sqlMakeDue = `
UPDATE {p}_reservation SET expires_at = now() - interval '1 second'
WHERE request_key = ANY($1) AND sku = ANY($2) AND status = 'HELD'`

	sqlAudit = `
SELECT s.sku, s.total, s.available,
       (SELECT count(*)::int FROM {p}_reservation r WHERE r.sku = s.sku AND r.status IN ('HELD','CONFIRMED'))
FROM {p}_stock s WHERE s.sku = ANY($1) ORDER BY s.sku`
)

// Confirm moves the reservation from HELD to CONFIRMED.
func (n *node) Confirm(ctx context.Context, key string, mode strategy.ConfirmMode) (bool, error) {
	if ok, err := n.CheckKey(key); !ok {
		return false, err
	}
	tag, err := n.d.db.Exec(ctx, n.d.tb.q(sqlConfirm), key, n.d.skus, mode == strategy.ConfirmUntilExpired)
	if err != nil {
		return false, wrap("confirm", key, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Release moves the reservation from HELD to RELEASED and gives its unit
// back, in one statement.
func (n *node) Release(ctx context.Context, key string) (int, error) {
	if ok, err := n.CheckKey(key); !ok {
		return 0, err
	}
	var units int
	if err := n.d.db.QueryRow(ctx, n.d.tb.q(sqlRelease), key, n.d.skus).Scan(&units); err != nil {
		return 0, wrap("release", key, err)
	}
	return units, nil
}

// ExpireDue moves every due HELD reservation to EXPIRED and gives the
// units back, in one statement.
func (n *node) ExpireDue(ctx context.Context) (int, error) {
	if err := n.Check(); err != nil {
		return 0, err
	}
	var units int
	if err := n.d.db.QueryRow(ctx, n.d.tb.q(sqlExpireDue), n.d.skus).Scan(&units); err != nil {
		return 0, fmt.Errorf("%s: expire due: %w", Name, err)
	}
	return units, nil
}

// MakeDue moves expires_at of these HELD reservations into the past.
func (d *Deployment) MakeDue(ctx context.Context, keys []string) (int, error) {
	tag, err := d.db.Exec(ctx, d.tb.q(sqlMakeDue), keys, d.skus)
	if err != nil {
		return 0, fmt.Errorf("%s: make due: %w", Name, err)
	}
	return int(tag.RowsAffected()), nil
}

// Audit reports total, available and active of each SKU, from PostgreSQL:
// Redis holds only locks.
func (d *Deployment) Audit(ctx context.Context) ([]strategy.StockAudit, error) {
	rows, err := d.db.Query(ctx, d.tb.q(sqlAudit), d.skus)
	if err != nil {
		return nil, fmt.Errorf("%s: audit: %w", Name, err)
	}
	var out []strategy.StockAudit
	for rows.Next() {
		var a strategy.StockAudit
		if err := rows.Scan(&a.SKU, &a.Total, &a.Available, &a.Active); err != nil {
			rows.Close()
			return nil, fmt.Errorf("%s: audit: %w", Name, err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: audit: %w", Name, err)
	}
	return out, nil
}
