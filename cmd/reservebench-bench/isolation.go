package main

import (
	"fmt"
	"strings"

	"github.com/reservebench/reservebench/bench"
)

// isolationSection writes the isolation matrix: each strategy's level and
// retry policy (from its Meta), its goodput at its peak and at the most
// clients, and the retries it paid per success.
func (r *results) isolationSection(b *strings.Builder, ix index) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	mx := r.maxClients()
	w("## 9. Isolation levels\n\n")
	w("Each strategy at the level its transactions run at, with its retry policy (both stated by the strategy, `strategy.Meta`; table 28-1 shows the same matrix with what each level keeps of the claims). A design that runs at several levels is registered once per level. *Retries per success* counts the transactions the deployment ran again (where it counts them), over the closed-loop trials (%s).\n\n", see("isolation-levels", "isolation levels"))
	w("| strategy | isolation | retry policy | peak goodput /s | at %d clients | retries per success at the peak | at %d clients |\n|---|---|---|---:|---:|---:|---:|\n", mx, mx)
	for _, m := range r.Metas {
		iso, retry := m.Isolation, m.Retry
		if iso == "" {
			iso = "–"
		}
		if retry == "" {
			retry = "–"
		}
		pc, ps := r.peak(ix, m.Name)
		last := ix.find(expClosed, m.Name, bench.ToolGo, "", mx, "")
		peakS, lastS, rp, rl := "–", "–", "–", "–"
		if ps != nil {
			peakS = fmt.Sprintf("%s at %d", fmtCI(ps.Goodput), pc)
			if ps.Retries != nil {
				rp = fmt.Sprintf("%.2f", ps.Retries.Median)
			}
		}
		if last != nil {
			lastS = fmtCI(last.Goodput)
			if last.Retries != nil {
				rl = fmt.Sprintf("%.2f", last.Retries.Median)
			}
		}
		w("| `%s` | %s | %s | %s | %s | %s | %s |\n", m.Name, iso, strings.ReplaceAll(retry, "|", `\|`), peakS, lastS, rp, rl)
	}
	w("\n")
}
