package advisorylock

import (
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// PgbenchScript is bench.PgbenchScripter's (implemented without importing
// bench): this package's own constants, in the order reserveIn sends them
// inside pgx.BeginFunc:
//
//	begin
//	lockSKUSQL, lookupSQL, countSQL, activeOfUserSQL
//	savepoint sp_1                (pgx's pseudo-nested transaction)
//	insertSQL                     (:ttl_s: the TTL in seconds as interval text)
//	release savepoint sp_1
//	commit
//
// The SOLD_OUT and USER_LIMIT answers (a commit after the reads, no insert)
// are not in the script, which is for stock that does not sell out.
func (d *Deployment) PgbenchScript(sku string) (string, error) {
	if err := d.owns.CheckSKU(sku); err != nil {
		return "", err
	}
	return pgstrategy.PgbenchScript(
		`\set ttl_s :ttl_us / 1000000`,
		"begin",
		pgstrategy.PgbenchSQL(lockSKUSQL, "sku"),
		pgstrategy.PgbenchSQL(lookupSQL, "key"),
		pgstrategy.PgbenchSQL(countSQL, "sku"),
		pgstrategy.PgbenchSQL(activeOfUserSQL, "sku", "user"),
		"savepoint sp_1",
		pgstrategy.PgbenchSQL(insertSQL, "key", "user", "sku", "ttl_s"),
		"release savepoint sp_1",
		"commit",
	), nil
}
