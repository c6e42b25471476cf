package strategytest

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reservebench/reservebench/strategy"
)

func init() {
	registerKind(KindLeastPrivilege, kindSpec{run: runLeastPrivilege, required: []string{"requests"},
		validate: func(in *Scenario) error {
			if in.Requests < 1 || in.Requests > in.Stock[0].Total {
				return errors.New("need 1 <= requests <= the first SKU's total")
			}
			return nil
		}})
}

// insufficientPrivilege is SQLSTATE 42501: what PostgreSQL answers a role
// that lacks a privilege, or is not the owner (DROP, ALTER).
const insufficientPrivilege = "42501"

// noRequest selects no history for a check about something other than the
// requests: its failure message shows no excerpt.
const noRequest = "\x00"

// runLeastPrivilege serves some requests as the runtime role, then tries,
// as that role, what it must not be able to do to the strategy's tables:
// DROP, ALTER, TRUNCATE and DELETE each, CREATE TABLE and CREATE TEMP TABLE.
// Each must fail with 42501; each attempt runs in a transaction that is
// rolled back, so a broken grant cannot damage the run. The tables are
// those the owner role owns in schema public: the run's database holds the
// strategy's alone.
func runLeastPrivilege(ctx context.Context, t *trial) error {
	lp := t.env.lp
	if lp == nil || lp.owner == nil {
		why := "not least-privilege"
		if lp != nil {
			why = lp.why
		}
		return notApplicable(why)
	}
	sku := t.sku(t.in.Stock[0].SKU)
	held := 0
	for i := 0; i < t.in.Requests; i++ {
		op := t.reserveDefinite(ctx, "c", i, strategy.Request{Key: t.key(fmt.Sprintf("req-%02d", i)), User: t.user(fmt.Sprintf("user-%02d", i)), SKU: sku, TTL: strategy.TTLForever})
		if op.Outcome == strategy.OutcomeHeld {
			held++
		}
	}
	t.fact("served as "+lp.runtimeRole, "%d of %d requests HELD; schema created by %s (Meta.Setup)", held, t.in.Requests, lp.ownerRole)
	t.check(Base, "the strategy serves as the runtime role", held == t.in.Requests, fmt.Sprintf("%d of %d HELD", held, t.in.Requests))

	rows, err := t.env.Admin.Query(ctx, `
		SELECT c.relname FROM pg_class c
		WHERE c.relowner = (SELECT oid FROM pg_roles WHERE rolname = $1)
		  AND c.relkind IN ('r', 'p') AND c.relnamespace = 'public'::regnamespace
		ORDER BY 1`, lp.ownerRole)
	if err != nil {
		return fmt.Errorf("list tables: %w", err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("list tables: %w", err)
	}
	if len(tables) == 0 {
		return fmt.Errorf("%s owns no table after Setup", lp.ownerRole)
	}
	var privs []string
	for _, tb := range tables {
		var p string
		if err := t.env.Admin.QueryRow(ctx, `
			SELECT coalesce(string_agg(privilege_type, ', ' ORDER BY privilege_type), 'none')
			FROM information_schema.table_privileges
			WHERE grantee = $1 AND table_schema = 'public' AND table_name = $2`, lp.runtimeRole, tb).Scan(&p); err != nil {
			return fmt.Errorf("privileges on %s: %w", tb, err)
		}
		privs = append(privs, tb+": "+p)
	}
	t.fact("privileges of "+lp.runtimeRole, "%s", strings.Join(privs, "; "))

	var owned int
	if err := t.env.Admin.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM pg_class WHERE relowner = r.oid)
		     + (SELECT count(*) FROM pg_namespace WHERE nspowner = r.oid)
		     + (SELECT count(*) FROM pg_proc WHERE proowner = r.oid)
		FROM pg_roles r WHERE r.rolname = $1`, lp.runtimeRole).Scan(&owned); err != nil {
		return fmt.Errorf("count owned objects: %w", err)
	}
	t.fact("objects "+lp.runtimeRole+" owns in the database", "%d", owned)
	t.check(strategy.LeastPrivilege, "the runtime role owns nothing", owned == 0, fmt.Sprintf("it owns %d objects", owned), noRequest)

	var refused []string
	for _, probe := range []struct{ verb, sql string }{
		{"DROP", "DROP TABLE %s"},
		{"ALTER", "ALTER TABLE %s ADD COLUMN rb_probe int"},
		{"TRUNCATE", "TRUNCATE %s"},
		{"DELETE", "DELETE FROM %s WHERE false"},
	} {
		var allowed []string
		for _, tb := range tables {
			code, err := t.attemptAsRuntime(ctx, fmt.Sprintf(probe.sql, pgx.Identifier{tb}.Sanitize()))
			if err != nil {
				return err
			}
			if code != insufficientPrivilege {
				allowed = append(allowed, fmt.Sprintf("%s (%s)", tb, sqlstateOrOK(code)))
			}
		}
		refused = append(refused, fmt.Sprintf("%s %d of %d", probe.verb, len(tables)-len(allowed), len(tables)))
		t.check(strategy.LeastPrivilege, "the runtime role cannot "+probe.verb+" its tables (42501)", len(allowed) == 0,
			fmt.Sprintf("%s was not refused with 42501 on: %s", probe.verb, strings.Join(allowed, ", ")), noRequest)
	}
	for _, probe := range []struct{ what, sql string }{
		{"CREATE TABLE", "CREATE TABLE rb_probe (x int)"},
		{"CREATE TEMP TABLE", "CREATE TEMP TABLE rb_probe_tmp (x int)"},
	} {
		code, err := t.attemptAsRuntime(ctx, probe.sql)
		if err != nil {
			return err
		}
		ok := code == insufficientPrivilege
		refused = append(refused, fmt.Sprintf("%s %v", probe.what, ok))
		t.check(strategy.LeastPrivilege, "the runtime role cannot "+probe.what+" (42501)", ok, fmt.Sprintf("%s answered %s", probe.what, sqlstateOrOK(code)), noRequest)
	}
	t.fact("refused to "+lp.runtimeRole+" with 42501", "%s", strings.Join(refused, ", "))
	if err := t.checkNoGrantOption(ctx, lp); err != nil {
		return err
	}
	if err := t.checkDefinerFunctions(ctx, lp); err != nil {
		return err
	}
	return t.checkPrivilegesUsed(ctx, lp)
}

// attemptAsRuntime runs one statement as the runtime role (Env.DB) in a
// transaction that is always rolled back, and returns its SQLSTATE ("" when
// it succeeded). An error that is not the server's answer fails the run.
func (t *trial) attemptAsRuntime(ctx context.Context, sql string) (string, error) {
	tx, err := t.env.DB.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, sql)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return "", nil
	case errors.As(err, &pgErr):
		return pgErr.Code, nil
	}
	return "", fmt.Errorf("%s: %w", sql, err)
}

func sqlstateOrOK(code string) string {
	if code == "" {
		return "allowed"
	}
	return "SQLSTATE " + code
}
