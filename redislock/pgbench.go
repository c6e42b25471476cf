package redislock

import "github.com/reservebench/reservebench/strategy/pgstrategy"

// PgbenchScript is bench.PgbenchScripter's: the SQL part of a reservation,
// in the order Node.Reserve sends it, without the Redis lock (pgbench
// speaks no Redis), so a Go-to-pgbench ratio compares the SQL only:
//
//	sqlLookup, sqlAvailable           on the pool, before the lock
//	begin
//	sqlAvailable                      the double check
//	savepoint sp_1                    (pgx's pseudo-nested transaction)
//	sqlInsert, sqlTakeUnit
//	release savepoint sp_1
//	commit
//
// The SOLD_OUT branches are not in it: it is for stock that does not sell
// out.
func (d *Deployment) PgbenchScript(sku string) (string, error) {
	if err := d.owns.CheckSKU(sku); err != nil {
		return "", err
	}
	take := sqlTakeUnit
	if d.lockOnly {
		take = sqlTakeUnitLockOnly
	}
	return pgstrategy.PgbenchScript(
		pgstrategy.PgbenchSQL(d.tb.q(sqlLookup), "key"),
		pgstrategy.PgbenchSQL(d.tb.q(sqlAvailable), "sku"),
		"begin",
		pgstrategy.PgbenchSQL(d.tb.q(sqlAvailable), "sku"),
		"savepoint sp_1",
		pgstrategy.PgbenchSQL(d.tb.q(sqlInsert), "key", "user", "sku", "ttl_us"),
		pgstrategy.PgbenchSQL(d.tb.q(take), "sku"),
		"release savepoint sp_1",
		"commit",
	), nil
}

// PgbenchLeavesOut is bench.PgbenchPartial's: the script is the SQL only.
func (d *Deployment) PgbenchLeavesOut() string {
	return "taking and releasing the Redis lock (at least two Redis round trips)"
}
