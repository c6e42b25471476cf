package onetrip

import (
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// PgbenchScript is bench.PgbenchScripter's (implemented without importing
// bench): what Node.Reserve sends on its way to HELD, sqlInsertAndTake alone
// in autocommit, with :key, :user, :sku and :ttl_us. pgbench runs it on a
// stock that does not sell out, so the second statement of the other
// answers never runs.
func (d *Deployment) PgbenchScript(sku string) (string, error) {
	if err := d.owns.CheckSKU(sku); err != nil {
		return "", err
	}
	return pgstrategy.PgbenchScript(pgstrategy.PgbenchSQL(sqlInsertAndTake, "key", "user", "sku", "ttl_us")), nil
}

// The parts of sqlInsertAndTake, for PgbenchControls.
const (
	// sqlBareDecrement is the hot-row UPDATE alone, on onetrip's stock
	// row: the bare UPDATE of hotrow's update-only control, on these
	// tables.
	sqlBareDecrement = `UPDATE onetrip_stock SET available = available - 1 WHERE sku = $1 AND available > 0`
	// sqlBareInsert writes the reservation row alone, through the table's
	// indexes, with nothing else in the statement.
	sqlBareInsert = `INSERT INTO onetrip_reservation (request_key, user_id, sku, status, expires_at) VALUES ($1, $2, $3, 'HELD', now() + $4::bigint * interval '1 microsecond')`
	// sqlBareInsertDecrement is the least a one-statement reservation that
	// writes its row does: insert the row, then decrement, in one
	// statement. Not a reservation (an empty row leaves the row inserted):
	// the floor of the design. sqlInsertAndTake is this statement with
	// RETURNING and with the stock row's CHECK, not the WHERE, refusing an
	// empty row; an earlier version read the row first and inserted with
	// ON CONFLICT, and sat well below this floor (docs/performance.md).
	sqlBareInsertDecrement = `
WITH ins AS (
    INSERT INTO onetrip_reservation (request_key, user_id, sku, status, expires_at)
    VALUES ($1, $2, $3, 'HELD', now() + $4::bigint * interval '1 microsecond')
    RETURNING sku
)
UPDATE onetrip_stock SET available = available - 1 WHERE sku = (SELECT sku FROM ins) AND available > 0`
)

// PgbenchControls returns scripts that run parts of the reservation alone
// (bench's control scripts), each one autocommit statement:
//
//	update-only    sqlBareDecrement: the bare UPDATE on onetrip's stock row
//	insert-only    sqlBareInsert: the reservation row, without the decrement
//	insert-update  sqlBareInsertDecrement: both in one statement, nothing
//	               else
//
// insert-update against update-only says what writing the row costs a
// one-statement design before any of its checks; the reservation against
// insert-update, what the checks cost.
func (d *Deployment) PgbenchControls(sku string) (map[string]string, error) {
	if err := d.owns.CheckSKU(sku); err != nil {
		return nil, err
	}
	args := []string{"key", "user", "sku", "ttl_us"}
	return map[string]string{
		"update-only":   pgstrategy.PgbenchScript(pgstrategy.PgbenchSQL(sqlBareDecrement, "sku")),
		"insert-only":   pgstrategy.PgbenchScript(pgstrategy.PgbenchSQL(sqlBareInsert, args...)),
		"insert-update": pgstrategy.PgbenchScript(pgstrategy.PgbenchSQL(sqlBareInsertDecrement, args...)),
	}, nil
}
