package main

import (
	"fmt"
	"sort"
	"strings"

	"github.com/reservebench/reservebench/bench"
)

// target is a goal the run measures: the Go goodput of one strategy
// against a reference point of the same run (another strategy, or one of
// its pgbench control scripts), as a ratio paired round by round, and the
// least ratio that meets it. The sweep's configuration names them
// (main.go); the report computes them from the trials.
type target struct {
	// What is the goal, in words.
	What string `json:"what"`
	// Strategy's Go goodput in the closed loop, at Clients (0: at the
	// strategy's best client count).
	Strategy string `json:"strategy"`
	Clients  int    `json:"clients,omitempty"`
	// NumScript, when set, measures Strategy's control script NumScript
	// (pgbench) instead of its Go reservation.
	NumScript string `json:"num_script,omitempty"`
	// NumPgbench, when set, measures Strategy's reservation as pgbench runs
	// its script (the same SQL, pgbench's client) instead of its Go
	// client: the design against the bare UPDATE with the same client on
	// both sides.
	NumPgbench bool `json:"num_pgbench,omitempty"`
	// Against: strategy Against's control script Script (pgbench), or its
	// Go reservation when Script is "", at AgainstClients (0: at its best).
	Against        string `json:"against"`
	Script         string `json:"script,omitempty"`
	AgainstClients int    `json:"against_clients,omitempty"`
	// Min is the least ratio that meets the goal.
	Min float64 `json:"min"`
}

// targetResult is a target measured.
type targetResult struct {
	target
	NumClients, DenClients int
	Num, Den               bench.Summary // goodput of each side over its trials
	Ratio                  bench.Summary // per round, numerator / denominator
	BackToBack             bool          // measured in phase 4's pairs
}

// verdict says whether the measured ratio meets the target, and how
// surely.
func (t targetResult) verdict() string {
	switch {
	case t.Ratio.N == 0:
		return "not measured"
	case t.Ratio.Lo >= t.Min:
		return "met (the whole interval is above)"
	case t.Ratio.Median >= t.Min:
		return "met by the median; the interval reaches below"
	case t.Ratio.Hi >= t.Min:
		return "missed by the median; the interval reaches above"
	}
	return "missed (the whole interval is below)"
}

// numSide reports whether c is a trial of the target's numerator in
// experiment exp (expClosed: phase 1; expTarget: the back-to-back pairs).
func (t target) numSide(c cell, exp string) bool {
	if t.NumScript != "" {
		if exp == expClosed {
			exp = expControl
		}
		return c.Exp == exp && c.Strategy == t.Strategy && c.Script == t.NumScript
	}
	if t.NumPgbench {
		return c.Exp == exp && c.Strategy == t.Strategy && c.Tool == bench.ToolPgbench && c.Script == ""
	}
	return c.Exp == exp && c.Strategy == t.Strategy && c.Tool == bench.ToolGo
}

// denSide is numSide for the denominator: a control script's trials live
// in expControl in phase 1.
func (t target) denSide(c cell, exp string) bool {
	if t.Script != "" {
		if exp == expClosed {
			exp = expControl
		}
		return c.Exp == exp && c.Strategy == t.Against && c.Script == t.Script
	}
	return c.Exp == exp && c.Strategy == t.Against && c.Tool == bench.ToolGo
}

// measureTargets computes the configured targets whose points ran: from
// the back-to-back pairs of phase 4 when they ran, else from phase 1's
// trials paired by round.
func (r *results) measureTargets() []targetResult {
	var out []targetResult
	for _, t := range r.Config.Targets {
		if t.Script != "" && !containsStr(r.Caps[t.Against], t.Script) || t.NumScript != "" && !containsStr(r.Caps[t.Strategy], t.NumScript) ||
			t.NumPgbench && !contains(r.Pgbench, t.Strategy) {
			continue // a control script or the pgbench script did not run
		}
		exp := expClosed
		for _, rc := range r.Trials {
			if t.numSide(rc.Cell, expTarget) {
				exp = expTarget
			}
		}
		numSide := func(rc *record) bool { return t.numSide(rc.Cell, exp) }
		denSide := func(rc *record) bool { return t.denSide(rc.Cell, exp) }
		nc := pickClients(r.Trials, numSide, t.Clients)
		dc := pickClients(r.Trials, denSide, t.AgainstClients)
		if nc == 0 || dc == 0 {
			continue
		}
		num, den := byRound(r.Trials, numSide, nc), byRound(r.Trials, denSide, dc)
		res := targetResult{target: t, NumClients: nc, DenClients: dc, Num: bench.Summarize(values(num)), Den: bench.Summarize(values(den)), BackToBack: exp == expTarget}
		var xs []float64
		for round, v := range num {
			if d, ok := den[round]; ok && d > 0 {
				xs = append(xs, v/d)
			}
		}
		sort.Float64s(xs)
		res.Ratio = bench.Summarize(xs)
		out = append(out, res)
	}
	return out
}

// numString names the numerator's point and its goodput.
func (t targetResult) numString() string {
	switch {
	case t.NumScript != "":
		return fmt.Sprintf("`%s` control `%s` (pgbench) at %s: %s", t.Strategy, t.NumScript, clientsStr(t.NumClients), fmtCI(t.Num))
	case t.NumPgbench:
		return fmt.Sprintf("`%s` pgbench (its script) at %s: %s", t.Strategy, clientsStr(t.NumClients), fmtCI(t.Num))
	}
	return fmt.Sprintf("`%s` Go at %s: %s", t.Strategy, clientsStr(t.NumClients), fmtCI(t.Num))
}

// denString names the denominator's point and its goodput.
func (t targetResult) denString() string {
	if t.Script != "" {
		return fmt.Sprintf("`%s` control `%s` (pgbench) at %s: %s", t.Against, t.Script, clientsStr(t.DenClients), fmtCI(t.Den))
	}
	return fmt.Sprintf("`%s` Go at %s: %s", t.Against, clientsStr(t.DenClients), fmtCI(t.Den))
}

// pickClients is want, or (want 0) the client count whose trials have the
// best median goodput; 0 when no trial matches.
func pickClients(recs []*record, match func(*record) bool, want int) int {
	by := map[int][]float64{}
	for _, rc := range recs {
		if match(rc) {
			by[rc.Cell.Clients] = append(by[rc.Cell.Clients], rc.Trial.Run.Goodput)
		}
	}
	if want != 0 {
		if len(by[want]) == 0 {
			return 0
		}
		return want
	}
	keys := make([]int, 0, len(by))
	for k := range by {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	best, bestV := 0, -1.0
	for _, k := range keys {
		if v := bench.Summarize(by[k]).Median; v > bestV {
			best, bestV = k, v
		}
	}
	return best
}

// byRound is the goodput of the matching trials at clients, by round.
func byRound(recs []*record, match func(*record) bool, clients int) map[int]float64 {
	out := map[int]float64{}
	for _, rc := range recs {
		if match(rc) && rc.Cell.Clients == clients {
			out[rc.Round] = rc.Trial.Run.Goodput
		}
	}
	return out
}

func values(m map[int]float64) []float64 {
	out := make([]float64, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	sort.Float64s(out)
	return out
}

// targetsSection writes the measured targets, and Go/pgbench at the client
// counts the issue named, for every strategy with a pgbench script.
func (r *results) targetsSection(b *strings.Builder, ix index) {
	ts := r.measureTargets()
	goPg := r.goPgbenchAt()
	if len(ts) == 0 && len(goPg) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## Targets\n\n")
	peakAt := ""
	if len(r.Config.TargetPeakClients) > 0 {
		peakAt = fmt.Sprintf(" (and, for a side taken at its peak, at %s clients too, between the sweep's counts)", joinInts(r.Config.TargetPeakClients))
	}
	w("Each goal is a ratio of two points of this run: each side at the client count where section 1 found its peak%s (or the count the goal names), run back to back %d times, alternating which went first; the ratio of each pair (two trials seconds apart, so the machine's drift cancels) is summarized like any metric: median [95%% CI of the mean, Student's t] (%s).\n\n", peakAt, r.Config.TargetPairs, see("targets-and-paired-ratios", "targets"))
	if len(ts) > 0 {
		w("| goal | measured | against | ratio | needed | verdict |\n|---|---|---|---:|---:|---|\n")
		for _, t := range ts {
			how := ""
			if !t.BackToBack {
				how = " (phase 1's trials, paired by round)"
			}
			w("| %s | %s | %s | %s%s | %.2g | %s |\n", t.What, t.numString(), t.denString(), fmtRatio(t.Ratio), how, t.Min, t.verdict())
		}
		w("\n")
	}
	if len(goPg) > 0 {
		w("Go against pgbench running the same SQL, at the client counts the issue named (paired per round; the goal is at least %.1f, or a profile of the client that says where the difference goes: section 7):\n\n", goPgbenchGoal)
		w("| strategy |")
		for _, c := range goPgbenchClients {
			w(" %s |", clientsStr(c))
		}
		w(" below %.1f |\n|---|", goPgbenchGoal)
		for range goPgbenchClients {
			w("---:|")
		}
		w("---|\n")
		for _, g := range goPg {
			w("| `%s` |", g.strategy)
			var below []int
			for i, c := range goPgbenchClients {
				rt := g.ratios[i]
				w(" %s |", fmtRatio(rt))
				if rt.N > 0 && rt.Median < goPgbenchGoal {
					below = append(below, c)
				}
			}
			part := ""
			if lo := r.PgbenchLeavesOut[g.strategy]; lo != "" {
				part = "; its script leaves out " + lo + "†"
			}
			if len(below) == 0 {
				w(" none%s |\n", part)
			} else {
				w(" at %s%s |\n", clientList(below), part)
			}
		}
		w("\n")
		if len(r.PgbenchLeavesOut) > 0 {
			w("† The script is the database part of the Go path only (pgbench speaks no Redis and keeps no counter): the ratio is below 1 by what the part it leaves out costs, not only by what the Go client adds (%s).\n\n", see("pgbench-side-by-side", "what each script covers"))
		}
	}
}

// goPgbenchClients and goPgbenchGoal are the issue's: Go/pgbench at least
// 0.9 at 1, 8 and 32 clients.
var goPgbenchClients = []int{1, 8, 32}

const goPgbenchGoal = 0.9

type goPg struct {
	strategy string
	ratios   []bench.Summary // per goPgbenchClients
}

func (r *results) goPgbenchAt() []goPg {
	var out []goPg
	for _, name := range r.strategies() {
		g := goPg{strategy: name}
		any := false
		for _, c := range goPgbenchClients {
			rt := ratios(r.Trials, name, c)
			any = any || rt.N > 0
			g.ratios = append(g.ratios, rt)
		}
		if any {
			out = append(out, g)
		}
	}
	return out
}

// clientList writes client counts as "1 client", "1 and 32 clients",
// "1, 8 and 32 clients".
func clientList(cs []int) string {
	if len(cs) == 1 {
		return clientsStr(cs[0])
	}
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = fmt.Sprint(c)
	}
	return joinAnd(parts) + " clients"
}
