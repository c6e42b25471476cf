package slotrows

import (
	"fmt"
	"strings"

	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// PgbenchScript is bench.PgbenchScripter's (implemented without importing
// bench): strategy B's own constants, in the order node.Reserve sends them:
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
	if err := d.totals.CheckSKU(sku); err != nil {
		return "", err
	}
	total := d.totals[sku]
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
