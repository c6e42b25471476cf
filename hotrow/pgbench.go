package hotrow

import (
	"fmt"
	"strings"

	"github.com/reservebench/reservebench/strategy"
)

// PgbenchScript returns a pgbench custom script that replays the SQL of one
// reservation on its way to HELD, for the side-by-side runs of package bench
// (it implements bench.PgbenchScripter without importing it). The statements
// are this package's own constants, in the order Node.Reserve sends them:
//
//	begin isolation level <the deployment's level>   (pgx's BeginTx text)
//	SAVEPOINT hotrow_reserve
//	sqlInsertHeld                                     (:key, :user, :sku, :ttl_us)
//	sqlTakeUnit                                       (:sku)
//	commit
//
// The variables are those bench sets before each run of the script. The
// SOLD_OUT branch (ROLLBACK TO SAVEPOINT when the UPDATE takes no row) is
// not in the script: pgbench cannot branch on a row count without changing
// the statement, so the script is for stock that does not sell out. Retries
// after 40001 are not replayed either (READ COMMITTED needs none).
func (d *Deployment) PgbenchScript(sku string) (string, error) {
	if !d.owns[sku] {
		return "", strategy.UnknownSKU(sku)
	}
	return pgbenchScript(
		d.beginSQL(),
		sqlSavepoint,
		pgbenchSQL(sqlInsertHeld, "key", "user", "sku", "ttl_us"),
		pgbenchSQL(sqlTakeUnit, "sku"),
		"commit",
	), nil
}

// PgbenchControls returns scripts that run parts of the reservation alone,
// to tell which part of it costs what under contention (bench's control
// scripts):
//
//	update-only          sqlTakeUnit alone, in autocommit: the hot-row
//	                     UPDATE whose row lock is released by its own commit,
//	                     without waiting for the client
//	begin-update-commit  begin; sqlTakeUnit; commit: the row lock is held
//	                     while the UPDATE's answer goes to the client and its
//	                     COMMIT comes back, as in the reservation
//	insert-only          begin; SAVEPOINT; sqlInsertHeld; commit: the
//	                     reservation without the decrement (its foreign key
//	                     still takes a KEY SHARE lock on the stock row, which
//	                     does not conflict with another KEY SHARE)
//
// None is a reservation: the first two decrement the stock without a
// reservation row, the third writes a HELD row without a unit (its audit
// drifts by construction).
func (d *Deployment) PgbenchControls(sku string) (map[string]string, error) {
	if !d.owns[sku] {
		return nil, strategy.UnknownSKU(sku)
	}
	update := pgbenchSQL(sqlTakeUnit, "sku")
	insert := pgbenchSQL(sqlInsertHeld, "key", "user", "sku", "ttl_us")
	return map[string]string{
		"update-only":         pgbenchScript(update),
		"begin-update-commit": pgbenchScript(d.beginSQL(), update, "commit"),
		"insert-only":         pgbenchScript(d.beginSQL(), sqlSavepoint, insert, "commit"),
	}, nil
}

// beginSQL is the statement pgx's BeginTx sends for the deployment's
// isolation level (no access or deferrable mode).
func (d *Deployment) beginSQL() string { return "begin isolation level " + string(d.iso) }

// pgbenchSQL writes a statement's $1, $2, ... as the pgbench variables
// :vars[0], :vars[1], ...; nothing else in the statement changes.
func pgbenchSQL(sql string, vars ...string) string {
	pairs := make([]string, 0, 2*len(vars))
	for i := len(vars); i >= 1; i-- { // $12 before $1
		pairs = append(pairs, fmt.Sprintf("$%d", i), ":"+vars[i-1])
	}
	return strings.NewReplacer(pairs...).Replace(sql)
}

// pgbenchScript joins statements into a script, each ended by a semicolon.
func pgbenchScript(stmts ...string) string {
	var b strings.Builder
	for _, s := range stmts {
		b.WriteString(strings.TrimSpace(s))
		b.WriteString(";\n")
	}
	return b.String()
}
