package rediscounter

import "github.com/reservebench/reservebench/strategy/pgstrategy"

// PgbenchScript is bench.PgbenchScripter's: the SQL part of a reservation
// (sqlLookup, then sqlInsert in autocommit), without the Lua script in
// Redis that takes the unit (pgbench speaks no Redis), so a Go-to-pgbench
// ratio compares the SQL only.
func (d *Deployment) PgbenchScript(sku string) (string, error) {
	if err := d.owns.CheckSKU(sku); err != nil {
		return "", err
	}
	return pgstrategy.PgbenchScript(
		pgstrategy.PgbenchSQL(sqlLookup, "key"),
		pgstrategy.PgbenchSQL(sqlInsert, "key", "user", "sku", "ttl_us"),
	), nil
}

// PgbenchLeavesOut is bench.PgbenchPartial's: the script is the SQL only.
func (d *Deployment) PgbenchLeavesOut() string {
	return "the Lua script in Redis that takes the unit (one Redis round trip)"
}
