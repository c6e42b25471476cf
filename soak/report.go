package soak

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/reservebench/reservebench/strategy/strategytest"
)

// Run is one `make soak`: its settings and a report per strategy.
type Run struct {
	Duration time.Duration // per strategy
	Seed     uint64
	Server   string // PostgreSQL major version
	Reports  []*strategytest.SoakReport
	Errors   map[string]string // strategy -> why its soak could not run to its end
	Elapsed  time.Duration
}

// Markdown renders docs/soak.md.
func (r *Run) Markdown() []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# Soak: reservations under a nemesis\n\n")
	fmt.Fprintf(&b, "<!-- Written by `make soak` (soak/soak_test.go). Counts vary from run to run; the verdicts must not. -->\n\n")
	fmt.Fprintf(&b, "Every registered strategy ran for %v on a PostgreSQL %s cluster of its own, through a TCP proxy\n", r.Duration, r.Server)
	fmt.Fprintf(&b, "(pgtest/pgproxy), while a nemesis chose one fault per cycle from seed %d: a connection cut once the\n", r.Seed)
	b.WriteString("server executed its first write or its COMMIT (reset, or silent until reset), the proxy dark for every\n")
	b.WriteString("connection, the server crashed (`pg_ctl stop -m immediate`) and restarted, a failover to a synchronous\n")
	b.WriteString("standby, a node restarted, or no fault. Each cycle sends 150 operations from 6 clients (new reservations,\n")
	b.WriteString("replays of acknowledged ones, releases); then the load stops, every request of unknown outcome is\n")
	b.WriteString("resolved by its key and sent again, and the cycle's history and the audit are checked. The whole\n")
	b.WriteString("history is checked once more at the end. Checks are judged against the strategy's claims, as in\n")
	b.WriteString("[table 28-1](table-28-1.md): a violation fails `make soak`; an observed boundary is reported.\n\n")
	fmt.Fprintf(&b, "Total time %v.\n\n", r.Elapsed.Round(time.Second))
	b.WriteString("| strategy | cycles | faults | requests | acknowledged | refused | unknown (resolved committed / absent) | replays, releases | verdict |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, rep := range r.Reports {
		verdict := "ERROR"
		if rep.Result != nil {
			verdict = string(rep.Result.Verdict())
		}
		fmt.Fprintf(&b, "| `%s` | %d | %s | %d | %d | %d | %d (%d / %d) | %d, %d | %s |\n",
			rep.Strategy, rep.Cycles, faults(rep.Faults), rep.Requests, rep.Acked, rep.Refused,
			rep.Unknown, rep.ResolvedCommitted, rep.ResolvedAbsent, rep.Replays, rep.Releases, verdict)
	}
	var notes []string
	for _, rep := range r.Reports {
		if rep.Result == nil {
			continue
		}
		for _, c := range rep.Result.Violations() {
			notes = append(notes, fmt.Sprintf("- `%s` **VIOLATION**: %s [%s], failed in %d of %d checks: %s", rep.Strategy, c.What, c.Claims, c.Failed, c.Trials, c.Detail))
		}
		for _, c := range rep.Result.Observations() {
			notes = append(notes, fmt.Sprintf("- `%s` observed: %s [%s], failed in %d of %d checks: %s", rep.Strategy, c.What, c.Claims, c.Failed, c.Trials, c.Detail))
		}
		if rep.Result.Skipped != "" {
			notes = append(notes, fmt.Sprintf("- `%s` n/a: %s", rep.Strategy, rep.Result.Skipped))
		}
	}
	names := make([]string, 0, len(r.Errors))
	for n := range r.Errors {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		notes = append(notes, fmt.Sprintf("- `%s` **ERROR**: %s", n, r.Errors[n]))
	}
	if len(notes) > 0 {
		b.WriteString("\nWhat the checks found, and what could not run:\n\n" + strings.Join(notes, "\n") + "\n")
	} else {
		b.WriteString("\nEvery check held for every strategy.\n")
	}
	return []byte(b.String())
}

func faults(m map[string]int) string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s %d", n, m[n])
	}
	return strings.Join(parts, ", ")
}
