package onetrip

import (
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// PgbenchScript is bench.PgbenchScripter's (implemented without importing
// bench): what Node.Reserve sends on its way to HELD, sqlTakeAndInsert alone
// in autocommit, with :key, :user, :sku and :ttl_us. pgbench runs it on a
// stock that does not sell out, so the second statement of the other
// answers never runs.
func (d *Deployment) PgbenchScript(sku string) (string, error) {
	if err := d.owns.CheckSKU(sku); err != nil {
		return "", err
	}
	return pgstrategy.PgbenchScript(pgstrategy.PgbenchSQL(sqlTakeAndInsert, "key", "user", "sku", "ttl_us")), nil
}
