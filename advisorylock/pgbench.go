package advisorylock

import (
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// PgbenchScript returns a pgbench custom script that replays the SQL of one
// reservation on its way to HELD, for the side-by-side runs of package bench
// (it implements bench.PgbenchScripter without importing it). The statements
// are this package's own constants, in the order reserveIn sends them inside
// pgx.BeginFunc:
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
	if !d.owns[sku] {
		return "", strategy.UnknownSKU(sku)
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
