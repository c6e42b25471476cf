package main

import (
	"fmt"
	"strings"

	"github.com/reservebench/reservebench/bench"
)

// batchesSection writes, for strategies that serve requests in batches,
// how large their batches were (a failed batch answers every request in it
// with an error: its blast radius) and what a lone request pays (latency
// at one client against the strategy with the least).
func (r *results) batchesSection(b *strings.Builder, ix index) {
	var names []string
	for _, name := range r.strategies() {
		for _, c := range r.Config.Clients {
			if s := ix.find(expClosed, name, bench.ToolGo, "", c, ""); s != nil && s.BatchMean != nil {
				names = append(names, name)
				break
			}
		}
	}
	if len(names) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## 10. Batches\n\n")
	w("Strategies that serve concurrent requests in batches: requests per batch (median over the trials of the mean batch) and the largest batch of any trial, per client count (closed loop, Go). A batch that fails answers every request in it with an error, an unknown outcome each: the largest batch is the blast radius of one failure (%s).\n\n", see("batches-and-their-blast-radius", "batches"))
	w("| strategy | clients | goodput /s | requests per batch | largest batch | p50 / p99 ms |\n|---|---:|---:|---:|---:|---:|\n")
	for _, name := range names {
		for _, c := range r.Config.Clients {
			s := ix.find(expClosed, name, bench.ToolGo, "", c, "")
			if s == nil || s.BatchMean == nil {
				continue
			}
			w("| `%s` | %d | %s | %.1f | %d | %s / %s |\n", name, c, fmtCI(s.Goodput), s.BatchMean.Median, s.BatchMax, ms(s.Held.P50), ms(s.Held.P99))
		}
	}
	w("\n")
	// What a lone request pays: latency at one client against the
	// strategy whose median is lowest there.
	low, lowS := "", (*summary)(nil)
	for _, name := range r.strategies() {
		if s := ix.find(expClosed, name, bench.ToolGo, "", 1, ""); s != nil && s.Held.N > 0 && (lowS == nil || s.Held.P50 < lowS.Held.P50) {
			low, lowS = name, s
		}
	}
	for _, name := range names {
		s := ix.find(expClosed, name, bench.ToolGo, "", 1, "")
		if s == nil || lowS == nil || name == low {
			continue
		}
		w("At one client a request of `%s` waits for no other: its batch is itself. Its median latency there is %s ms (p99 %s ms) against %s ms (p99 %s ms) for `%s`, the lowest of the run.\n\n",
			name, ms(s.Held.P50), ms(s.Held.P99), ms(lowS.Held.P50), ms(lowS.Held.P99), low)
	}
}
