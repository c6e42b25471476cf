package main

import (
	"fmt"
	"strings"

	"github.com/reservebench/reservebench/bench"
)

// clientSection writes where the Go client's time goes: its CPU per
// success against pgbench's running the same SQL, and the profiled trials'
// categories.
func (r *results) clientSection(b *strings.Builder, ix index) {
	profiles := ix.filter(func(c cell) bool { return c.Exp == expProfile })
	if len(profiles) == 0 && len(r.Pgbench) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## 7. Where the Go client's time goes\n\n")
	w("On %d cores shared with the server, every microsecond of client CPU is taken from the server. *Client CPU per success*: this process's CPU time during the window over its successes (Go: the load generator, pgx, the strategy's Go code and the runtime), and pgbench's process CPU over its transactions (its whole run, connections included); medians over the closed-loop trials (%s).\n\n", r.Machine.Cores, see("where-the-client-time-goes", "the client's time"))
	w("| strategy | clients | Go/pgbench | Go µs CPU per success | pgbench µs CPU per transaction | Go − pgbench µs |\n|---|---:|---:|---:|---:|---:|\n")
	for _, name := range r.strategies() {
		if !contains(r.Pgbench, name) {
			continue
		}
		for _, c := range goPgbenchClients {
			g := ix.find(expClosed, name, bench.ToolGo, "", c, "")
			p := ix.find(expClosed, name, bench.ToolPgbench, "", c, "")
			if g == nil || p == nil {
				continue
			}
			w("| `%s` | %d | %s | %.1f | %.1f | %+.1f |\n", name, c, fmtRatio(ratios(r.Trials, name, c)), g.ClientCPU.Median, p.ClientCPU.Median, g.ClientCPU.Median-p.ClientCPU.Median)
		}
	}
	w("\n")
	if len(profiles) == 0 {
		return
	}
	w("One closed-loop Go trial per point, with a window of %v, ran under the CPU profiler (`runtime/pprof` at 100 Hz, the whole process; the raw profiles are written to `docs/perf/profiles/`, not committed: `go tool pprof -top docs/perf/profiles/<strategy>-c<clients>.pprof`). Flat CPU time by what it was spent in:\n\n", max(r.Config.ProfileWindow, r.Config.Duration))
	var cats []string
	for _, s := range profiles {
		if s.Profile == nil {
			continue
		}
		for _, c := range s.Profile.Categories {
			if !containsStr(cats, c.Name) {
				cats = append(cats, c.Name)
			}
		}
	}
	w("| strategy | clients | samples | client µs CPU per success | goodput /s |")
	for _, c := range cats {
		w(" %s |", c)
	}
	w(" inside pgx (cum.) | inside the strategy (cum.) | %s | %s |\n|---|---:|---:|---:|---:|", mechPgxTimer, mechIdleSearch)
	for range cats {
		w("---:|")
	}
	w("---:|---:|---:|---:|\n")
	for _, name := range r.strategies() {
		for _, c := range r.Config.ProfileClients {
			s := ix.find(expProfile, name, bench.ToolGo, "", c, "")
			if s == nil || s.Profile == nil {
				continue
			}
			p := s.Profile
			w("| `%s` | %d | %d | %.1f | %.0f |", name, c, p.Samples, s.ClientCPU.Median, s.Goodput.Median)
			for _, cat := range cats {
				w(" %s |", pct(p.Categories, cat))
			}
			w(" %s | %s | %s | %s |\n", pct(p.Inside, catPgx), pct(p.Inside, catStrategy), pct(p.Inside, mechPgxTimer), pct(p.Inside, mechIdleSearch))
		}
	}
	w("\n")
	r.profileRanges(b, ix)
	// Not this run's data: a benchmark of its own, measured side by side,
	// whose numbers the method doc keeps.
	w("A one-statement HELD path taken apart one layer at a time at one client (the strategy, pgxpool, pgx, pgx's wire protocol alone, pgbench), each layer's client CPU per reservation measured side by side by a benchmark of its own: %s.\n\n", see("one-layer-at-a-time", "one layer at a time, in the method"))
	w("The functions with the most flat time, per profiled point:\n\n")
	for _, name := range r.strategies() {
		for _, c := range r.Config.ProfileClients {
			s := ix.find(expProfile, name, bench.ToolGo, "", c, "")
			if s == nil || s.Profile == nil || len(s.Profile.Top) == 0 {
				continue
			}
			var top []string
			for _, t := range s.Profile.Top {
				top = append(top, fmt.Sprintf("`%s` %.0f%%", t.Name, 100*t.Share))
			}
			w("- `%s` at %s: %s\n", name, clientsStr(c), strings.Join(top, ", "))
		}
	}
	w("\n")
}

// pct is the share of category name in ss, as a percentage, or "–".
func pct(ss []share, name string) string {
	for _, s := range ss {
		if s.Name == name {
			return fmt.Sprintf("%.0f%%", 100*s.Share)
		}
	}
	return "–"
}

// profileRanges states, over every profiled point, the range of the client
// CPU share that went to the runtime and the socket, to pgx, and to this
// module's own code (the strategies' Go code and the load generator): what
// there is to reduce on our side.
func (r *results) profileRanges(b *strings.Builder, ix index) {
	type rng struct{ lo, hi float64 }
	widen := func(x *rng, v float64) {
		if v < x.lo {
			x.lo = v
		}
		if v > x.hi {
			x.hi = v
		}
	}
	sys, pgx, ours := rng{2, -1}, rng{2, -1}, rng{2, -1}
	n := 0
	for _, s := range ix.filter(func(c cell) bool { return c.Exp == expProfile }) {
		p := s.Profile
		if p == nil || p.Samples == 0 {
			continue
		}
		n++
		get := func(name string) float64 {
			for _, c := range p.Categories {
				if c.Name == name {
					return c.Share
				}
			}
			return 0
		}
		widen(&sys, get(catRuntime)+get(catSocket))
		widen(&pgx, get(catPgx))
		widen(&ours, get(catStrategy)+get(catGenerator))
	}
	if n == 0 {
		return
	}
	fmt.Fprintf(b, "Over the %d profiled points, the Go runtime and the socket took %.0f–%.0f%% of the client's CPU, pgx %.0f–%.0f%%, and this module's own code (the strategies' Go code and the load generator, flat) %.0f–%.0f%%.\n\n",
		n, 100*sys.lo, 100*sys.hi, 100*pgx.lo, 100*pgx.hi, 100*ours.lo, 100*ours.hi)
}
