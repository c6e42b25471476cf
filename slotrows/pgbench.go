package slotrows

import (
	"fmt"
	"strings"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// PgbenchScript returns a pgbench custom script that replays the SQL of one
// reservation on its way to HELD, for the side-by-side runs of package bench
// (it implements bench.PgbenchScripter without importing it). The statements
// are this package's own constants, in the order node.Reserve sends them:
//
//	begin isolation level read committed   (pgx's BeginTx text for readCommitted)
//	sqlInsertReservation \gset             (:key, :user, :sku, :ttl_us; sets :id)
//	sqlClaimSlot                           (:sku, :first, :id)
//	commit
//
// :first is the slot the claim starts at: 1 for LowestFirst; for
// KeyHashFirst the script hashes the integer key with pgbench's hash(),
// where the Go code hashes the key's text with FNV: another start slot, the
// same statement. The SOLD_OUT path (no slot: roll back) is not in the
// script, which is for stock that does not sell out.
func (d *Deployment) PgbenchScript(sku string) (string, error) {
	total, ok := d.totals[sku]
	if !ok {
		return "", strategy.UnknownSKU(sku)
	}
	first := `\set first 1`
	if d.opts.SlotChoice == KeyHashFirst && total > 1 {
		first = fmt.Sprintf(`\set first 1 + ((hash(:key) %% %d) + %d) %% %d`, total, total, total)
	}
	return pgstrategy.PgbenchScript(
		first,
		"begin isolation level "+string(readCommitted),
		strings.TrimSpace(pgstrategy.PgbenchSQL(sqlInsertReservation, "key", "user", "sku", "ttl_us"))+` \gset`,
		pgstrategy.PgbenchSQL(sqlClaimSlot, "sku", "first", "id"),
		"commit",
	), nil
}
