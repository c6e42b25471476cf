package redislock

import (
	"context"
	"fmt"

	"github.com/reservebench/reservebench/strategy"
)

// The transitions out of HELD take no lock: they only ever give units
// back, each in the statement that moves the row (strategy A's SQL over
// this strategy's tables, pgstrategy.StockRow: tables.moves), so every
// WHERE carries status = 'HELD' and the units come from the rows moved
// (RETURNING).
const (
	sqlMakeDue = `
UPDATE {p}_reservation SET expires_at = now() - interval '400 days'
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
	return n.d.tb.moves.Confirm(ctx, n.d.db, key, n.d.skus, mode)
}

// Release moves the reservation from HELD to RELEASED and gives its unit
// back, in one statement.
func (n *node) Release(ctx context.Context, key string) (int, error) {
	if ok, err := n.CheckKey(key); !ok {
		return 0, err
	}
	return n.d.tb.moves.Release(ctx, n.d.db, key, n.d.skus)
}

// ExpireDue moves every due HELD reservation to EXPIRED and gives the
// units back, in one statement.
func (n *node) ExpireDue(ctx context.Context) (int, error) {
	if err := n.Check(); err != nil {
		return 0, err
	}
	return n.d.tb.moves.ExpireDue(ctx, n.d.db, n.d.skus)
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
