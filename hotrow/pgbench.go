package hotrow

import (
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// PgbenchScript is bench.PgbenchScripter's (implemented without importing
// bench): hotrow's own constants, in the order Node.Reserve sends them:
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
// the statement, so the script is for stock that does not sell out.
// Retries after 40001 and 40P01 are pgbench's own (PgbenchMaxTries).
func (d *Deployment) PgbenchScript(sku string) (string, error) {
	if err := d.owns.CheckSKU(sku); err != nil {
		return "", err
	}
	return pgstrategy.PgbenchScript(
		d.beginSQL(),
		sqlSavepoint,
		pgstrategy.PgbenchSQL(sqlInsertHeld, "key", "user", "sku", "ttl_us"),
		pgstrategy.PgbenchSQL(sqlTakeUnit, "sku"),
		"commit",
	), nil
}

// PgbenchMaxTries is bench.PgbenchRetrier's: pgbench runs the script with
// --max-tries, one try more than Options.MaxRetries retries, as Reserve
// does (pgbench retries 40001 and 40P01 at once, without the pause).
func (d *Deployment) PgbenchMaxTries() int { return d.maxRetries + 1 }

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
//
// They belong to the reference design: a deployment at another isolation
// level has none (an error), since its controls would run the same
// statements and the sweep would measure them twice.
func (d *Deployment) PgbenchControls(sku string) (map[string]string, error) {
	if err := d.owns.CheckSKU(sku); err != nil {
		return nil, err
	}
	if d.iso != pgx.ReadCommitted {
		return nil, fmt.Errorf("hotrow: control scripts are the READ COMMITTED reference's, not %s's", d.iso)
	}
	update := pgstrategy.PgbenchSQL(sqlTakeUnit, "sku")
	insert := pgstrategy.PgbenchSQL(sqlInsertHeld, "key", "user", "sku", "ttl_us")
	return map[string]string{
		"update-only":         pgstrategy.PgbenchScript(update),
		"begin-update-commit": pgstrategy.PgbenchScript(d.beginSQL(), update, "commit"),
		"insert-only":         pgstrategy.PgbenchScript(d.beginSQL(), sqlSavepoint, insert, "commit"),
	}, nil
}

// beginSQL is the statement pgx's BeginTx sends for the deployment's
// isolation level (no access or deferrable mode).
func (d *Deployment) beginSQL() string { return "begin isolation level " + string(d.iso) }
