package pgstrategy

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/reservebench/reservebench/strategy"
)

// Grant is what the runtime role may do with one table: e.g. {"sku_stock",
// "SELECT, INSERT, UPDATE"}. Never DELETE or TRUNCATE without a reason in
// the strategy's documentation.
type Grant struct {
	Table      string
	Privileges string
}

// Setup is the body of a strategy's Meta.Setup: it validates cfg, then, as
// the owner role and in one transaction under the advisory lock LockKey,
// creates the schema unless it is complete (as Load does), and grants the
// runtime role the privileges of Grants and USAGE on the sequences those
// tables' defaults draw from (bigserial; an identity needs none). It
// writes no stock: Open does that, as the runtime role.
func (s Schema) Setup(ctx context.Context, cfg strategy.SetupConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if len(s.Grants) == 0 {
		return fmt.Errorf("%w: setup: the schema lists no grants", strategy.ErrConfig)
	}
	role := pgx.Identifier{cfg.Runtime}.Sanitize()
	return pgx.BeginFunc(ctx, cfg.Owner, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, s.LockKey); err != nil {
			return fmt.Errorf("setup: lock: %w", err)
		}
		var present bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.Last).Scan(&present); err != nil {
			return fmt.Errorf("setup: look up: %w", err)
		}
		if !present {
			if _, err := tx.Exec(ctx, s.DDL); err != nil {
				return fmt.Errorf("setup: create: %w", err)
			}
		}
		tables := make([]string, len(s.Grants))
		for i, g := range s.Grants {
			tables[i] = g.Table
			stmt := fmt.Sprintf("GRANT %s ON TABLE %s TO %s", g.Privileges, pgx.Identifier{g.Table}.Sanitize(), role)
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("setup: %s: %w", stmt, err)
			}
		}
		seqs, err := ownedSequences(ctx, tx, tables)
		if err != nil {
			return err
		}
		if len(seqs) > 0 {
			stmt := "GRANT USAGE ON SEQUENCE " + strings.Join(seqs, ", ") + " TO " + role
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("setup: %s: %w", stmt, err)
			}
		}
		return nil
	})
}

// ownedSequences names the sequences owned by a column of these tables
// through a default (bigserial), quoted. An identity column's sequence is
// left out: INSERT on its table draws from it without USAGE, which would
// be a privilege never used (least-privilege's checkPrivilegesUsed).
func ownedSequences(ctx context.Context, tx pgx.Tx, tables []string) ([]string, error) {
	rows, err := tx.Query(ctx, `
		SELECT d.objid::regclass::text
		FROM pg_depend d JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
		WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
		  AND d.refobjid = ANY (SELECT to_regclass(t) FROM unnest($1::text[]) AS t)
		  AND d.deptype = 'a'
		ORDER BY 1`, tables)
	if err != nil {
		return nil, fmt.Errorf("setup: sequences: %w", err)
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("setup: sequences: %w", err)
	}
	return seqs, nil
}
