package pgstrategy

import (
	"fmt"
	"strings"
)

// PgbenchSQL writes a statement's $1, $2, ... as the pgbench variables
// :vars[0], :vars[1], ...; nothing else in the statement changes.
func PgbenchSQL(sql string, vars ...string) string {
	pairs := make([]string, 0, 2*len(vars))
	for i := len(vars); i >= 1; i-- { // $12 before $1
		pairs = append(pairs, fmt.Sprintf("$%d", i), ":"+vars[i-1])
	}
	return strings.NewReplacer(pairs...).Replace(sql)
}

// PgbenchScript joins lines into a pgbench custom script, one a line, each
// trimmed. An SQL statement is ended by a semicolon; a meta-command (a line
// that starts with a backslash, e.g. \set) and a statement that ends with
// \gset or \aset are written as they are, since pgbench ends those itself.
func PgbenchScript(lines ...string) string {
	var b strings.Builder
	for _, s := range lines {
		s = strings.TrimSpace(s)
		b.WriteString(s)
		if !strings.HasPrefix(s, `\`) && !strings.HasSuffix(s, `\gset`) && !strings.HasSuffix(s, `\aset`) {
			b.WriteString(";")
		}
		b.WriteString("\n")
	}
	return b.String()
}
