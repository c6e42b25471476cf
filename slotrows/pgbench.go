package slotrows

import (
	"fmt"
	"strings"

	"github.com/reservebench/reservebench/strategy"
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
func (d *deployment) PgbenchScript(sku string) (string, error) {
	total, ok := d.totals[sku]
	if !ok {
		return "", strategy.UnknownSKU(sku)
	}
	first := `\set first 1`
	if d.opts.SlotChoice == KeyHashFirst && total > 1 {
		first = fmt.Sprintf(`\set first 1 + ((hash(:key) %% %d) + %d) %% %d`, total, total, total)
	}
	var b strings.Builder
	b.WriteString(first + "\n")
	b.WriteString("begin isolation level " + string(readCommitted.IsoLevel) + ";\n")
	b.WriteString(strings.TrimSpace(pgbenchSQL(sqlInsertReservation, "key", "user", "sku", "ttl_us")) + ` \gset` + "\n")
	b.WriteString(strings.TrimSpace(pgbenchSQL(sqlClaimSlot, "sku", "first", "id")) + ";\n")
	b.WriteString("commit;\n")
	return b.String(), nil
}

// pgbenchSQL writes a statement's $1, $2, ... as the pgbench variables
// :vars[0], :vars[1], ...; nothing else in the statement changes.
func pgbenchSQL(sql string, vars ...string) string {
	pairs := make([]string, 0, 2*len(vars))
	for i := len(vars); i >= 1; i-- { // $12 before $1
		pairs = append(pairs, fmt.Sprintf("$%d", i), ":"+vars[i-1])
	}
	return strings.NewReplacer(pairs...).Replace(sql)
}
