package main

import (
	"fmt"
	"sort"
	"strings"

	"github.com/reservebench/reservebench/bench"
)

// openSection writes the open loop: arrivals on a schedule at fractions of
// each strategy's peak, Go (a request in flight per arrival, up to a cap)
// beside pgbench --rate (its clients wait for their previous transaction).
func (r *results) openSection(b *strings.Builder, ix index, perf string, plots []plotFile) {
	ss := ix.filter(func(c cell) bool { return c.Exp == expOpen && c.Tool == bench.ToolGo })
	if len(ss) == 0 {
		return
	}
	cfg := r.Config
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## 4. Open loop\n\n")
	w("Poisson arrivals at a fraction (*load*) of the strategy's peak closed-loop goodput (Go, the median at its best client count, *base*); latency from the planned send time (%s). ", see("open-loop", "open loop"))
	w("**Go** sends every request at its planned time, on a goroutine of its own, however many are in flight (k6's constant-arrival-rate, wrk2), through a pool of %d connections, up to %d requests in flight: *late* is the generator's own timer lag, *dropped* the requests planned while the cap was reached, *interrupted* those still in flight %v after the window, cancelled and not counted. ", cfg.OpenClients, cfg.OpenMaxInFlight, bench.OpenGrace)
	w("**pgbench** `--rate` at the same rate with `-c %d`: each client sends its next transaction only when the previous one is done, so its lag includes the system's backlog; its latency here includes that lag too.\n\n", cfg.OpenClients)
	w("| strategy | base | load | planned /s | Go goodput /s | Go p50 / p99 ms | Go lag p99 ms | Go late / sent | Go dropped | Go interrupted | Go most in flight | pgbench tps | pgbench p50 / p99 ms | pgbench lag p99 ms | pgbench late / sent |\n")
	w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	sort.SliceStable(ss, func(i, j int) bool {
		if ss[i].Cell.Strategy != ss[j].Cell.Strategy {
			return ss[i].Cell.Strategy < ss[j].Cell.Strategy
		}
		return ss[i].Cell.Load < ss[j].Cell.Load
	})
	for _, s := range ss {
		c := s.Cell
		w("| `%s` | %d | %.2f | %.0f | %s | %s / %s | %s | %d / %d | %d | %d | %d |", c.Strategy, c.Base, c.Load, c.Rate, fmtCI(s.Goodput),
			ms(s.Held.P50), ms(s.Held.P99), ms(s.Lag.P99), s.Late, s.Sent, s.Dropped, s.Interrupted, s.MaxInFlight)
		p := r.openPgbench(ix, c)
		if p == nil {
			w(" – | – | – | – |\n")
			continue
		}
		w(" %s | %s / %s | %s | %d / %d |\n", fmtCI(p.Throughput), ms(p.Held.P50), ms(p.Held.P99), ms(p.Lag.P99), p.Late, p.Sent)
	}
	w("\n")
	var behind []string
	for _, s := range ss {
		if s.Dropped > 0 {
			behind = append(behind, fmt.Sprintf("`%s` at load %.2f (%d dropped)", s.Cell.Strategy, s.Cell.Load, s.Dropped))
		}
	}
	if len(behind) > 0 {
		w("The Go generator reached its cap of %d requests in flight, so the system fell that far behind the schedule, at: %s.\n\n", cfg.OpenMaxInFlight, strings.Join(behind, ", "))
	}
	embed(b, perf, plots, "open-loop.png")
}

// openPgbench is the pgbench --rate cell beside an open-loop Go cell.
func (r *results) openPgbench(ix index, c cell) *summary {
	for _, s := range ix.filter(func(p cell) bool {
		return p.Exp == expOpen && p.Tool == bench.ToolPgbench && p.Strategy == c.Strategy && p.Load == c.Load
	}) {
		return s
	}
	return nil
}
