package pgstrategy

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reservebench/reservebench/strategy"
)

// StockRow is the transitions out of HELD, the audit and MakeDue of a
// design with one stock row per SKU ({p}_stock: sku, available) and its reservation rows
// ({p}_reservation: request_key, sku, status, expires_at): hotrow's
// statements, shared by the designs that keep its tables and change only
// how a unit is taken (onetrip, combine). Each is one statement. Every
// WHERE carries status = 'HELD': of several racing transitions on one row
// the first to commit moves it, and the others, re-evaluating the WHERE on
// the newest version (READ COMMITTED), move nothing. Units come back only
// for rows the statement itself moved (RETURNING), in the same statement.
type StockRow struct {
	name                                        string
	confirm, release, expireDue, audit, makeDue string
}

const (
	// sqlStockRowConfirm: HELD -> CONFIRMED; $3 true is ConfirmUntilExpired
	// (a late payment that races the expiry job, C28-08), false also
	// requires that expires_at has not passed.
	sqlStockRowConfirm = `
UPDATE {p}_reservation SET status = 'CONFIRMED', updated_at = now()
WHERE request_key = $1 AND sku = ANY($2) AND status = 'HELD' AND ($3 OR expires_at >= now())`

	// sqlStockRowRelease: HELD -> RELEASED and the unit back.
	sqlStockRowRelease = `
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

	// sqlStockRowExpireDue: every due HELD row of the SKUs to EXPIRED, and
	// the units it moved back, counted from moved only (docs 7.8.4).
	sqlStockRowExpireDue = `
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

	// sqlStockRowAudit reads stock and active reservations in one
	// statement, so one snapshot: the three numbers belong together.
	sqlStockRowAudit = `
SELECT s.sku, s.total, s.available,
       (SELECT count(*) FROM {p}_reservation r
         WHERE r.sku = s.sku AND r.status IN ('HELD', 'CONFIRMED'))::int AS active
FROM {p}_stock s
WHERE s.sku = ANY($1)
ORDER BY array_position($1, s.sku)`

	// sqlStockRowMakeDue moves expires_at of HELD rows into the past, as
	// seed 000 does to simulate expiry.
	sqlStockRowMakeDue = `
UPDATE {p}_reservation SET expires_at = now() - interval '400 days', updated_at = now()
WHERE request_key = ANY($1) AND sku = ANY($2) AND status = 'HELD'`
)

// NewStockRow is the transitions of strategy name over the tables named
// prefix_stock and prefix_reservation.
func NewStockRow(name, prefix string) StockRow {
	p := func(sql string) string { return strings.ReplaceAll(sql, "{p}", prefix) }
	return StockRow{name: name, confirm: p(sqlStockRowConfirm), release: p(sqlStockRowRelease), expireDue: p(sqlStockRowExpireDue),
		audit: p(sqlStockRowAudit), makeDue: p(sqlStockRowMakeDue)}
}

// Execer runs a statement without rows: a pool, a connection or a
// transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Confirm moves the reservation with key (of skus) from HELD to CONFIRMED
// and reports whether this call moved it.
func (s StockRow) Confirm(ctx context.Context, q Execer, key string, skus []string, mode strategy.ConfirmMode) (bool, error) {
	tag, err := q.Exec(ctx, s.confirm, key, skus, mode == strategy.ConfirmUntilExpired)
	if err != nil {
		return false, fmt.Errorf("%s: confirm %q: %w", s.name, key, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Release moves the reservation from HELD to RELEASED and gives its unit
// back; it returns 1 if this call moved the row, else 0.
func (s StockRow) Release(ctx context.Context, q Querier, key string, skus []string) (int, error) {
	var units int
	if err := q.QueryRow(ctx, s.release, key, skus).Scan(&units); err != nil {
		return 0, fmt.Errorf("%s: release %q: %w", s.name, key, err)
	}
	return units, nil
}

// ExpireDue moves every due HELD reservation of skus to EXPIRED and returns
// the units it gave back.
func (s StockRow) ExpireDue(ctx context.Context, q Querier, skus []string) (int, error) {
	var units int
	if err := q.QueryRow(ctx, s.expireDue, skus).Scan(&units); err != nil {
		return 0, fmt.Errorf("%s: expire due: %w", s.name, err)
	}
	return units, nil
}

// Audit reports total, the available column and the HELD and CONFIRMED rows
// of each of skus, in that order.
func (s StockRow) Audit(ctx context.Context, q Querier, skus []string) ([]strategy.StockAudit, error) {
	rows, err := q.Query(ctx, s.audit, skus)
	if err != nil {
		return nil, fmt.Errorf("%s: audit: %w", s.name, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (strategy.StockAudit, error) {
		var a strategy.StockAudit
		err := row.Scan(&a.SKU, &a.Total, &a.Available, &a.Active)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: audit: %w", s.name, err)
	}
	return out, nil
}

// MakeDue makes the HELD reservations with these keys (of skus) due and
// returns how many it moved.
func (s StockRow) MakeDue(ctx context.Context, q Execer, keys, skus []string) (int, error) {
	tag, err := q.Exec(ctx, s.makeDue, keys, skus)
	if err != nil {
		return 0, fmt.Errorf("%s: make due: %w", s.name, err)
	}
	return int(tag.RowsAffected()), nil
}
