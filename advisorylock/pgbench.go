package advisorylock

import (
	"fmt"
	"slices"
	"strings"

	"github.com/reservebench/reservebench/strategy"
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
func (d *deployment) PgbenchScript(sku string) (string, error) {
	if !slices.Contains(d.skus, sku) {
		return "", strategy.UnknownSKU(sku)
	}
	stmts := []string{
		"begin",
		pgbenchSQL(lockSKUSQL, "sku"),
		pgbenchSQL(lookupSQL, "key"),
		pgbenchSQL(countSQL, "sku"),
		pgbenchSQL(activeOfUserSQL, "sku", "user"),
		"savepoint sp_1",
		pgbenchSQL(insertSQL, "key", "user", "sku", "ttl_s"),
		"release savepoint sp_1",
		"commit",
	}
	var b strings.Builder
	b.WriteString("\\set ttl_s :ttl_us / 1000000\n")
	for _, s := range stmts {
		b.WriteString(strings.TrimSpace(s) + ";\n")
	}
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
