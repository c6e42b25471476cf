package controls

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/reservebench/reservebench/strategy"
)

// createSchema creates a control's tables in tx, under the control's
// advisory lock, unless they exist: the DDL of strategy A less the one
// constraint the control's mistake removes. Open runs it as the role it
// serves as; a control with Meta.Setup (grantsAll) has it run as the owner
// role first, and Open then finds the tables there and writes no DDL, which
// the runtime role could not.
func createSchema(ctx context.Context, tx pgx.Tx, s spec, tb tables) error {
	if s.b != schemaWithoutLock {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey(s.name)); err != nil {
			return err
		}
	}
	var present bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, tb.reservation).Scan(&present); err != nil {
		return err
	}
	if present {
		return nil
	}
	if _, err := tx.Exec(ctx, strings.ReplaceAll(schemaSQL, "ctl_", tb.prefix+"_")); err != nil {
		return err
	}
	if s.b != unconditionalDecrement && s.b != lazyExpiryCount {
		if _, err := tx.Exec(ctx, tb.q(`ALTER TABLE {stock} ADD CONSTRAINT {stock}_range CHECK (available >= 0 AND available <= total)`)); err != nil {
			return err
		}
	}
	if s.b == expiresWithoutZone {
		if _, err := tx.Exec(ctx, tb.q(`ALTER TABLE {reservation} ALTER COLUMN expires_at TYPE timestamp`)); err != nil {
			return err
		}
	}
	if s.b == stockSmallint {
		if _, err := tx.Exec(ctx, tb.q(`ALTER TABLE {stock} ALTER COLUMN total TYPE smallint, ALTER COLUMN available TYPE smallint`)); err != nil {
			return err
		}
	}
	if s.b == idInt4 {
		if _, err := tx.Exec(ctx, tb.q(`ALTER TABLE {reservation} ALTER COLUMN reservation_id TYPE int`)); err != nil {
			return err
		}
	}
	if s.b == keyColumnNarrow {
		if _, err := tx.Exec(ctx, tb.q(`ALTER TABLE {reservation} ALTER COLUMN request_key TYPE varchar(64)`)); err != nil {
			return err
		}
	}
	keyIndex := `CREATE UNIQUE INDEX {reservation}_key ON {reservation} (request_key)`
	switch s.b {
	case keyNotUnique:
		keyIndex = ""
	case keyPerSKU:
		keyIndex = `CREATE UNIQUE INDEX {reservation}_key ON {reservation} (sku, request_key)`
	case keyCaseFolded:
		keyIndex = `CREATE UNIQUE INDEX {reservation}_key ON {reservation} (lower(request_key))`
	case keyPrefix64:
		keyIndex = `CREATE UNIQUE INDEX {reservation}_key ON {reservation} (left(request_key, 64))`
	}
	if keyIndex != "" {
		if _, err := tx.Exec(ctx, tb.q(keyIndex)); err != nil {
			return err
		}
	}
	oneActive := `CREATE UNIQUE INDEX {reservation}_one_active ON {reservation} (sku, user_id) WHERE status IN ('HELD','CONFIRMED')`
	switch s.b {
	case checkThenInsert, limitSkipsDue:
		oneActive = ""
	case limitPerUser:
		oneActive = `CREATE UNIQUE INDEX {reservation}_one_active ON {reservation} (user_id) WHERE status IN ('HELD','CONFIRMED')`
	case limitCountsEnded:
		oneActive = `CREATE UNIQUE INDEX {reservation}_one_active ON {reservation} (sku, user_id)`
	case limitByConcat:
		oneActive = `CREATE UNIQUE INDEX {reservation}_one_active ON {reservation} ((sku || ':' || user_id)) WHERE status IN ('HELD','CONFIRMED')`
	case limitByConcatUserFirst:
		oneActive = `CREATE UNIQUE INDEX {reservation}_one_active ON {reservation} ((user_id || ':' || sku)) WHERE status IN ('HELD','CONFIRMED')`
	case userAliasFolded:
		oneActive = `CREATE UNIQUE INDEX {reservation}_one_active ON {reservation} (sku, (CASE WHEN user_id ~ '^[^@]+@[^@]+$'
			THEN lower(regexp_replace(split_part(user_id, '@', 1), '[+].*$', '')) || '@' || lower(split_part(user_id, '@', 2))
			ELSE user_id END)) WHERE status IN ('HELD','CONFIRMED')`
	case limitHeldOnly:
		oneActive = `CREATE UNIQUE INDEX {reservation}_one_active ON {reservation} (sku, user_id) WHERE status = 'HELD'`
	}
	if oneActive != "" {
		if _, err := tx.Exec(ctx, tb.q(oneActive)); err != nil {
			return err
		}
	}
	return nil
}

// setupOf is the control's Meta.Setup: nil (Open creates its tables as the
// role it serves as) except for the controls of least privilege, whose
// Setup creates them as the owner and then grants the runtime role what
// strategy A needs (SELECT, INSERT and UPDATE; USAGE on the sequence) and
// the control's mistake: ALL on them (grantsAll), the same WITH GRANT
// OPTION (grantOption), ALL on the sequence (grantsSequenceAll), UPDATE
// of the stock's total (grantsTotal), a SECURITY DEFINER restock function
// that PUBLIC may execute (definerRestock).
func setupOf(s spec) func(context.Context, strategy.SetupConfig) error {
	if s.b != grantsAll && s.b != grantOption && s.b != grantsSequenceAll && s.b != grantsTotal && s.b != definerRestock {
		return nil
	}
	return func(ctx context.Context, cfg strategy.SetupConfig) error {
		if err := cfg.Validate(); err != nil {
			return err
		}
		tb := tablesOf(s.name)
		role := pgx.Identifier{cfg.Runtime}.Sanitize()
		err := pgx.BeginFunc(ctx, cfg.Owner, func(tx pgx.Tx) error {
			if err := createSchema(ctx, tx, s, tb); err != nil {
				return err
			}
			grants := []string{
				tb.q("GRANT SELECT, INSERT, UPDATE ON TABLE {stock}, {reservation} TO ") + role,
				"GRANT USAGE ON SEQUENCE " + tb.reservation + "_reservation_id_seq TO " + role,
			}
			switch s.b {
			case grantsAll:
				grants = []string{
					tb.q("GRANT ALL ON TABLE {stock}, {reservation} TO ") + role,
					"GRANT ALL ON SEQUENCE " + tb.reservation + "_reservation_id_seq TO " + role,
				}
			case grantOption:
				for i := range grants {
					grants[i] += " WITH GRANT OPTION"
				}
			case grantsSequenceAll:
				grants[1] = "GRANT ALL ON SEQUENCE " + tb.reservation + "_reservation_id_seq TO " + role
			case grantsTotal:
				grants[0] = tb.q("GRANT SELECT, INSERT, UPDATE ON TABLE {reservation} TO ") + role
				grants = append(grants, tb.q("GRANT SELECT, INSERT, UPDATE (available, total) ON TABLE {stock} TO ")+role)
			case definerRestock:
				grants = append(grants, tb.q(`CREATE OR REPLACE FUNCTION {stock}_restock(p_sku text, p_units int) RETURNS int
LANGUAGE sql SECURITY DEFINER SET search_path = public AS
$$ UPDATE {stock} SET total = total + p_units, available = available + p_units WHERE sku = p_sku RETURNING available $$`))
			}
			for _, stmt := range grants {
				if _, err := tx.Exec(ctx, stmt); err != nil {
					return fmt.Errorf("%s: %w", stmt, err)
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("%s: setup: %w", s.name, err)
		}
		return nil
	}
}
