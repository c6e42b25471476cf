package pgstrategy

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reservebench/reservebench/strategy"
)

// CreateSchema creates a strategy's schema inside tx unless it is already
// complete. It first takes the transaction-level advisory lock lockKey, so
// that concurrent Opens do not run CREATE ... IF NOT EXISTS side by side
// (two can both miss a table and one then fails on the catalog's unique
// index). Then it runs ddl only if the relation last, the last object ddl
// creates, does not exist: ddl runs in one transaction, so last existing
// means all of it does, and an Open over a complete schema runs no DDL
// (CREATE INDEX IF NOT EXISTS takes a SHARE lock on its table even when the
// index exists, and would wait for every write in flight).
func CreateSchema(ctx context.Context, tx pgx.Tx, lockKey int64, last, ddl string) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey); err != nil {
		return fmt.Errorf("schema: lock: %w", err)
	}
	var present bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, last).Scan(&present); err != nil {
		return fmt.Errorf("schema: look up: %w", err)
	}
	if present {
		return nil
	}
	if _, err := tx.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("schema: create: %w", err)
	}
	return nil
}

// Querier is a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// CheckStock is the check Meta.Attach makes before anything else, and it
// writes nothing. totalsSQL takes the SKUs as $1 (text[]) and returns one
// row (sku, total) for each that has stock. A SKU of stock without a row,
// or with another total, is an error matching strategy.ErrConfig; so is a
// database without the strategy's tables (undefined_table, 42P01): nothing
// was ever loaded there.
func CheckStock(ctx context.Context, q Querier, totalsSQL string, stock []strategy.Stock) error {
	skus := make([]string, len(stock))
	for i, s := range stock {
		skus[i] = s.SKU
	}
	rows, err := q.Query(ctx, totalsSQL, skus)
	if err != nil {
		return attachErr(err)
	}
	totals := make(map[string]int, len(stock))
	var sku string
	var total int
	if _, err := pgx.ForEachRow(rows, []any{&sku, &total}, func() error {
		totals[sku] = total
		return nil
	}); err != nil {
		return attachErr(err)
	}
	for _, s := range stock {
		got, ok := totals[s.SKU]
		switch {
		case !ok:
			return fmt.Errorf("attach: %w: sku %q has no stock to attach to", strategy.ErrConfig, s.SKU)
		case got != s.Total:
			return fmt.Errorf("attach: %w: sku %q has total %d in the database, %d in the config", strategy.ErrConfig, s.SKU, got, s.Total)
		}
	}
	return nil
}

func attachErr(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return fmt.Errorf("attach: %w: no stock in this database (%s)", strategy.ErrConfig, pgErr.Message)
	}
	return fmt.Errorf("attach: %w", err)
}
