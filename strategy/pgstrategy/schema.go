package pgstrategy

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reservebench/reservebench/strategy"
)

// Schema is what a strategy's Open and Meta.Attach need to know of its
// tables.
type Schema struct {
	// DDL creates the tables idempotently (CREATE ... IF NOT EXISTS), in one
	// transaction.
	DDL string
	// Last is the last object DDL creates: when it exists, all of DDL ran.
	Last string
	// LockKey is the pg_advisory_xact_lock key that serialises creation.
	LockKey int64
	// Totals takes SKUs as $1 (text[]) and returns one (sku, total) row for
	// each that has stock.
	Totals string
	// Grants are the privileges the runtime role needs on each table DDL
	// creates, for Setup (least privilege); USAGE on the tables' own
	// sequences is granted with them.
	Grants []Grant
}

// Load is the body of a strategy's Open: it validates cfg, then, in one
// transaction, creates the schema unless it is complete and runs load,
// which inserts cfg.Stock and fails (with strategy.ErrStockExists when a
// SKU has stock already) to roll everything back.
//
// Creation runs under the advisory lock LockKey, so that concurrent Opens do
// not run CREATE ... IF NOT EXISTS side by side (two can both miss a table
// and one then fails on the catalog's unique index), and it runs DDL only
// when Last does not exist: an Open over a complete schema runs no DDL
// (CREATE INDEX IF NOT EXISTS takes a SHARE lock on its table even when the
// index exists, and would wait for every write in flight).
func (s Schema) Load(ctx context.Context, cfg strategy.Config, load func(tx pgx.Tx) error) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, cfg.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, s.LockKey); err != nil {
			return fmt.Errorf("schema: lock: %w", err)
		}
		var present bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.Last).Scan(&present); err != nil {
			return fmt.Errorf("schema: look up: %w", err)
		}
		if !present {
			if _, err := tx.Exec(ctx, s.DDL); err != nil {
				return fmt.Errorf("schema: create: %w", err)
			}
		}
		return load(tx)
	})
}

// Attach is the check of a strategy's Meta.Attach, and it writes nothing:
// it validates cfg, then reads Totals. A SKU of cfg without stock, or with
// another total, is an error matching strategy.ErrConfig; so is a database
// without the strategy's tables (undefined_table, 42P01): nothing was ever
// loaded there.
func (s Schema) Attach(ctx context.Context, cfg strategy.Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	rows, err := cfg.DB.Query(ctx, s.Totals, cfg.SKUs())
	if err != nil {
		return attachErr(err)
	}
	totals := make(map[string]int, len(cfg.Stock))
	var sku string
	var total int
	if _, err := pgx.ForEachRow(rows, []any{&sku, &total}, func() error {
		totals[sku] = total
		return nil
	}); err != nil {
		return attachErr(err)
	}
	for _, st := range cfg.Stock {
		got, ok := totals[st.SKU]
		switch {
		case !ok:
			return fmt.Errorf("attach: %w: sku %q has no stock to attach to", strategy.ErrConfig, st.SKU)
		case got != st.Total:
			return fmt.Errorf("attach: %w: sku %q has total %d in the database, %d in the config", strategy.ErrConfig, st.SKU, got, st.Total)
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

// Querier is a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// AllInserted reads the SKUs that an INSERT ... ON CONFLICT (sku) DO NOTHING
// RETURNING sku inserted, and fails with an error matching
// strategy.ErrStockExists, naming the others, unless it inserted every SKU
// of skus: the caller's transaction then rolls everything back.
func AllInserted(rows pgx.Rows, skus []string) error {
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("stock: insert: %w", err)
	}
	if len(inserted) == len(skus) {
		return nil
	}
	fresh := make(map[string]bool, len(inserted))
	for _, s := range inserted {
		fresh[s] = true
	}
	var existing []string
	for _, s := range skus {
		if !fresh[s] {
			existing = append(existing, s)
		}
	}
	return fmt.Errorf("%w: %s", strategy.ErrStockExists, strings.Join(existing, ", "))
}
