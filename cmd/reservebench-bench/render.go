package main

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/gonum/stat/distuv"

	"github.com/reservebench/reservebench/bench"
)

// render writes docs/performance.md from the results. Every number in it
// comes from this run; perf is the plots' directory relative to the doc.
//
// The rule of this file: a sentence that names a strategy or states a
// number is computed from the results, and is written only when the data
// support it (the conditions are in findings.go). What does not depend on
// the run (how we measure, why an effect appears, caveats of the method,
// what the seed observed) lives in docs/performance-method.md, written by
// hand, which the report links section by section. No strategy name is
// written here as a literal: render_test.go renders a run whose strategies
// are renamed and checks that none of the real names comes out.
func (r *results) render(perf string, plots []plotFile) string {
	ix := index{all: r.Summaries}
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	cfg := r.Config

	w("# Performance: what each strategy costs\n\n")
	w("> **Generated** by `%s` on %s, in %s; do not edit by hand, run it again. ",
		strings.TrimSpace(r.Command), r.Started.UTC().Format("2006-01-02 15:04 MST"), fmtDur(r.Elapsed))
	if r.RenderedFrom != "" {
		w("(This text was rendered again from that run's `%s` with `-render`: same data, newer wording.) ", r.RenderedFrom)
	}
	w("Mode **%s**: %d trials per point of the closed loop (Go and pgbench)%s, %d per point of the other experiments, %v measured window per trial, clients %s. ",
		cfg.Mode, cfg.Trials, cfg.fewerTrials(), cfg.ExtraTrials, cfg.Duration, joinInts(cfg.Clients))
	w("Raw data: [`%s/results.txt`](%s/results.txt) (Go benchmark format, one line per trial: `benchstat -col /strategy %s/results.txt`), ",
		perf, perf, "docs/perf")
	w("[`%s/results.json`](%s/results.json) (every trial and every summary below). ", perf, perf)
	w("How it is measured, what each number means, and why the effects below appear: [%s](%s), written by hand.\n\n", methodDoc, methodDoc)

	r.headline(&b, ix)
	r.targetsSection(&b, ix)
	r.machineSection(&b)
	r.method(&b)
	r.closedSection(&b, ix, perf, plots)
	r.costSection(&b, ix)
	r.sellsOutSection(&b, ix)
	r.openSection(&b, ix, perf, plots)
	r.collapseSection(&b, ix, perf, plots)
	r.admissionSection(&b, ix, perf, plots)
	r.clientSection(&b, ix)
	r.skusSection(&b, ix)
	r.isolationSection(&b, ix)
	r.batchesSection(&b, ix)
	r.httpSection(&b, ix)
	r.caveats(&b, ix)
	r.reproduce(&b)
	return b.String()
}

func (r *results) strategies() []string {
	var out []string
	for _, m := range r.Metas {
		out = append(out, m.Name)
	}
	return out
}

func (r *results) maxClients() int {
	mx := 0
	for _, c := range r.Config.Clients {
		mx = max(mx, c)
	}
	return mx
}

// peak returns the client count and summary of a strategy's best median Go goodput.
func (r *results) peak(ix index, strat string) (int, *summary) {
	var best *summary
	for _, s := range ix.filter(func(c cell) bool { return c.Exp == expClosed && c.Strategy == strat && c.Tool == bench.ToolGo }) {
		if best == nil || s.Goodput.Median > best.Goodput.Median {
			best = s
		}
	}
	if best == nil {
		return 0, nil
	}
	return best.Cell.Clients, best
}

// ratioRange is the lowest and highest median Go/pgbench ratio of the run
// (±Inf without any).
func (r *results) ratioRange() (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, name := range r.strategies() {
		for _, c := range r.Config.Clients {
			if rt := ratios(r.Trials, name, c); rt.N > 0 {
				lo, hi = math.Min(lo, rt.Median), math.Max(hi, rt.Median)
			}
		}
	}
	return lo, hi
}

func (r *results) headline(b *strings.Builder, ix index) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## Headline\n\n")
	w("Successful reservations per second (goodput), Go client, closed loop, stock that never sells out; ")
	w("median of %d trials%s, [95%% confidence interval of the mean, Student's t]. ", r.Config.Trials, r.Config.fewerTrials())
	w("The last columns compare the strategy's best point with its most crowded one, and Go with pgbench running the same SQL.\n\n")
	w("| strategy |")
	for _, c := range r.Config.Clients {
		w(" %s |", clientsStr(c))
	}
	w(" peak → at %d | Go/pgbench |\n|---|", r.maxClients())
	for range r.Config.Clients {
		w("---:|")
	}
	w("---|---|\n")
	for _, name := range r.strategies() {
		w("| `%s` |", name)
		for _, c := range r.Config.Clients {
			s := ix.find(expClosed, name, bench.ToolGo, "", c, "")
			if s == nil {
				w(" – |")
				continue
			}
			w(" %s |", fmtCI(s.Goodput))
		}
		pc, ps := r.peak(ix, name)
		last := ix.find(expClosed, name, bench.ToolGo, "", r.maxClients(), "")
		if ps != nil && last != nil {
			w(" %.0f at %d → %.0f%% |", ps.Goodput.Median, pc, 100*last.Goodput.Median/ps.Goodput.Median)
		} else {
			w(" – |")
		}
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, c := range r.Config.Clients {
			rt := ratios(r.Trials, name, c)
			if rt.N > 0 {
				lo, hi = math.Min(lo, rt.Median), math.Max(hi, rt.Median)
			}
		}
		if rep, stood := r.Config.standInFor(name); math.IsInf(lo, 0) && stood {
			w(" as `%s` (same SQL) |\n", rep)
		} else if math.IsInf(lo, 0) {
			w(" no pgbench script |\n")
		} else {
			w(" %.2f–%.2f |\n", lo, hi)
		}
	}
	w("\n")
	r.findings(b, ix)
}

// findings lists what the tables below show, computed from this run; each
// line is written only when its condition holds.
func (r *results) findings(b *strings.Builder, ix index) {
	var lines []string
	add := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	mx := r.maxClients()
	best, bestC, bestV := "", 0, 0.0
	for _, name := range r.strategies() {
		if c, s := r.peak(ix, name); s != nil && s.Goodput.Median > bestV {
			best, bestC, bestV = name, c, s.Goodput.Median
		}
	}
	if best != "" {
		add("The most goodput: `%s`, %.0f reservations/s at %s (section 1); what it gives up for that is in table 28-1, not here.", best, bestV, clientsStr(bestC))
	}
	for _, name := range r.strategies() {
		d, ok := r.diagnose(ix, name)
		if !ok || !d.falls {
			continue
		}
		var s strings.Builder
		fmt.Fprintf(&s, "`%s` falls from %.0f/s at %s to %.0f/s at %d clients (p99 %s ms)", name, d.peak.Goodput.Median, clientsStr(d.peakC), d.last.Goodput.Median, mx, ms(d.last.Held.P99))
		var adm []string
		for _, a := range d.admitted {
			adm = append(adm, fmt.Sprintf("%.0f/s with admission %s (p99 %s ms)", a.Goodput.Median, a.Cell.Admit, ms(a.Held.P99)))
		}
		if len(adm) > 0 {
			fmt.Fprintf(&s, "; through `admission.Gate` at the same %d clients: %s (section 6)", mx, strings.Join(adm, ", "))
		}
		s.WriteString(".")
		if why := d.why(r.Machine.Cores); why != "" {
			fmt.Fprintf(&s, " Section 5 finds at %d clients: %s.", mx, why)
		}
		lines = append(lines, s.String())
	}
	if lo, hi := r.ratioRange(); !math.IsInf(lo, 0) {
		line := fmt.Sprintf("Go against pgbench running the same SQL on the same server: median ratios from %.2f to %.2f over all strategies and client counts (section 1).", lo, hi)
		if withinBand(lo) && withinBand(hi) {
			line += fmt.Sprintf(" Every ratio is within a factor of %.1f of 1, so the SQL and the server, not the Go client, set the shape of the curves (%s).", ratioBand, see("pgbench-side-by-side", "what each script covers"))
		}
		lines = append(lines, line)
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(b, "What this run shows (each point is backed by a section below):\n\n")
	for _, l := range lines {
		fmt.Fprintf(b, "- %s\n", l)
	}
	b.WriteString("\n")
}

func (r *results) machineSection(b *strings.Builder) {
	m := r.Machine
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## The machine\n\n")
	w("Client and server share one machine: %d cores (%s), %.0f GiB of memory, Linux %s, %s/%s, %s. ",
		m.Cores, m.CPUModel, m.MemoryGiB, m.Kernel, m.GOOS, m.GOARCH, m.GoVersion)
	w("PostgreSQL %s, started for the run by `pgtest` (kind `%s`), %s. ", m.PostgresVersion, m.ServerKind, m.PgbenchVersion)
	if m.FdatasyncMs > 0 {
		w("An 8 kB write plus `fdatasync` in the cluster's directory took **%.2f ms** (%s): at most about %.0f flushes a second, the ceiling of commits that do not share one.",
			m.FdatasyncMs, see("the-machine-and-the-server", "the probe"), 1000/m.FdatasyncMs)
	}
	w("\n\n| setting | value |\n|---|---|\n")
	for _, k := range settingNames {
		if v, ok := m.Settings[k]; ok {
			w("| `%s` | %s |\n", k, v)
		}
	}
	var on, off []string
	for _, k := range []string{"fsync", "full_page_writes", "synchronous_commit"} {
		switch v, ok := m.Settings[k]; {
		case !ok:
		case v == "on":
			on = append(on, k)
		default:
			off = append(off, fmt.Sprintf("%s is **%s**", k, v))
		}
	}
	w("\n")
	if len(off) > 0 {
		w("**Not a user's server:** %s in this run, so its commits cost less than they would with it on (%s).\n\n", strings.Join(off, ", "), see("the-machine-and-the-server", "why it matters"))
	} else if len(on) > 0 {
		w("%s %s **on**, as a user's server has them (%s).\n\n", joinAnd(on), isAre(len(on)), see("the-machine-and-the-server", "why"))
	}
}

// method states this run's parameters; what they mean is in the method doc.
func (r *results) method(b *strings.Builder) {
	cfg := r.Config
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## How we measure, and what each number means\n\n")
	w("Library: package [`bench`](../bench); command: [`cmd/reservebench-bench`](../cmd/reservebench-bench). ")
	w("What a trial is, the closed and open loops, goodput, the histograms, the confidence intervals, the cost counters, the sampled wait states and the pgbench runs are described in [%s](%s). This run's parameters:\n\n", methodDoc, methodDoc)
	w("| parameter | value | see |\n|---|---|---|\n")
	w("| trials per point, closed loop / other experiments | %d%s / %d, interleaved in shuffled rounds | %s |\n", cfg.Trials, cfg.fewerTrials(), cfg.ExtraTrials, see("trials", "trials"))
	if cfg.Trials > 1 {
		w("| Student's t for %d trials (95%%) | %.2f | %s |\n", cfg.Trials, studentT(cfg.Trials), see("goodput-latency-and-confidence-intervals", "intervals"))
	}
	w("| measured window | %v | %s |\n", cfg.Duration, see("closed-loop", "closed loop"))
	if cfg.pgbenchPartsOnly() != "" {
		w("| pgbench's own script, closed loop | at every client count; %s | %s |\n", cfg.pgbenchPartsOnly(), see("pgbench-side-by-side", "pgbench"))
	}
	w("| stock, never sells out / sells out | %d / %d units per trial | %s |\n", cfg.StockPlenty, cfg.StockSellsOut, see("stock-that-sells-out", "sells out"))
	if cfg.OpenTrials > 0 {
		w("| open loop | loads %s of each strategy's peak, %d trials each; Go: a pool of %d connections, at most %d requests in flight; pgbench `--rate` with `-c %d`; late limit %v | %s |\n",
			joinFloats(cfg.OpenLoads), cfg.OpenTrials, cfg.OpenClients, cfg.OpenMaxInFlight, cfg.OpenClients, cfg.LateLimit, see("open-loop", "open loop"))
	}
	if cfg.ManySKUs > 1 {
		w("| many SKUs | %d SKUs, Zipf exponent %.2g, clients %s | %s |\n", cfg.ManySKUs, cfg.Zipf, joinInts(cfg.ManyClients), see("many-skus", "many SKUs"))
	}
	if cfg.SampleEvery > 0 {
		w("| `pg_stat_activity` sampling | every %v (`pg_locks` every fourth sample) | %s |\n", cfg.SampleEvery, see("sampled-wait-states", "wait states"))
	}
	if len(cfg.HTTPClients)+len(cfg.HTTPLoads) > 0 && cfg.has(expHTTP) {
		w("| HTTP beside the library | closed loop at %s clients, open loop at load %s, paired per round | %s |\n", joinInts(cfg.HTTPClients), joinFloats(cfg.HTTPLoads), see("the-http-front", "the HTTP front"))
	}
	w("| pgbench | `-M prepared -j %d` (at most one thread per client) | %s |\n", r.Machine.Cores, see("pgbench-side-by-side", "pgbench"))
	w("| Go client's threads | `GOMAXPROCS` as pgbench's `-j`: %d, at most one per client | %s |\n", r.Machine.Cores, see("the-clients-threads", "the client's threads"))
	w("| seed of the trial order and schedules | %d | |\n", cfg.Seed)
	w("\n")
	if t := r.standInsText(); t != "" {
		w("%s\n\n", t)
	}
	var without []string
	for _, name := range r.strategies() {
		if _, stood := cfg.standInFor(name); !contains(r.Pgbench, name) && !stood {
			without = append(without, "`"+name+"`")
		}
	}
	switch {
	case len(r.Pgbench) == 0:
		w("No strategy ran under pgbench in this run: there are no Go/pgbench ratios.\n\n")
	case len(without) == 0:
		w("Every strategy of this run has a pgbench script, so every one has a Go/pgbench ratio.\n\n")
	default:
		w("Without a pgbench script, hence without a Go/pgbench ratio: %s.\n\n", strings.Join(without, ", "))
	}
}

func (r *results) closedSection(b *strings.Builder, ix index, perf string, plots []plotFile) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## 1. Closed loop, stock that never sells out\n\n")
	w("Per strategy and client count: goodput (median [95%% CI]), latency of successes (merged over the trials), pgbench's transactions per second running the same SQL, and the paired ratio (%s). ", see("closed-loop", "closed loop"))
	soldOut := 0
	for _, s := range ix.filter(func(c cell) bool { return c.Exp == expClosed }) {
		soldOut += s.SoldOutTrials
	}
	if p := r.Config.pgbenchPartsOnly(); p != "" {
		w("pgbench ran each strategy's script at every client count but, %s. ", p)
	}
	w("The stock is %d units per trial; ", r.Config.StockPlenty)
	if soldOut == 0 {
		w("no trial of this section sold out.\n\n")
	} else {
		w("%d trials sold out anyway, marked in the tables.\n\n", soldOut)
	}
	for _, name := range r.strategies() {
		w("### `%s`\n\n", name)
		w("| clients | goodput /s | p50 ms | p90 ms | p99 ms | max ms | pgbench tps | pgbench p50 / p99 ms | Go/pgbench |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, c := range r.Config.Clients {
			s := ix.find(expClosed, name, bench.ToolGo, "", c, "")
			if s == nil {
				continue
			}
			flag := ""
			if s.SoldOutTrials > 0 {
				flag = fmt.Sprintf(" (sold out in %d trials)", s.SoldOutTrials)
			}
			if s.Errors > 0 {
				flag += fmt.Sprintf(" (%d errors)", s.Errors)
			}
			w("| %d | %s%s | %s | %s | %s | %s |", c, fmtCI(s.Goodput), flag, ms(s.Held.P50), ms(s.Held.P90), ms(s.Held.P99), ms(s.Held.Max))
			if p := ix.find(expClosed, name, bench.ToolPgbench, "", c, ""); p != nil {
				rt := ratios(r.Trials, name, c)
				w(" %s | %s / %s | %s |\n", fmtCI(p.Throughput), ms(p.Held.P50), ms(p.Held.P99), fmtRatio(rt))
			} else {
				w(" – | – | – |\n")
			}
		}
		w("\n")
	}
	embed(b, perf, plots, "goodput.png", "go-vs-pgbench.png", "latency.png")
	window := r.Config.Duration.Seconds() * 1000
	var cut []string
	for _, name := range r.strategies() {
		for _, c := range r.Config.Clients {
			for _, tool := range []bench.Tool{bench.ToolGo, bench.ToolPgbench} {
				s := ix.find(expClosed, name, tool, "", c, "")
				if s == nil || window <= 0 || s.Held.Max < window/2 {
					continue
				}
				cut = append(cut, fmt.Sprintf("`%s` %s at %d clients (max %s ms)", name, toolName(tool), c, ms(s.Held.Max)))
			}
		}
	}
	if len(cut) > 0 {
		w("The slowest success took at least half the %v window at these points, so their tails are lower bounds (%s): %s.\n\n", r.Config.Duration, see("the-window-cuts-the-tail", "the window cuts the tail"), strings.Join(cut, ", "))
	}
	var reran []string
	for _, rc := range r.Trials {
		if rc.Reruns > 0 {
			reran = append(reran, fmt.Sprintf("`%s` %s at %d clients (%s, round %d, %d time(s))", rc.Cell.Strategy, toolName(rc.Cell.Tool), rc.Cell.Clients, rc.Cell.Exp, rc.Round, rc.Reruns))
		}
	}
	if len(reran) > 0 {
		w("Run again because pgbench aborted a client on PostgreSQL's internal error \"new multixact has more than one updating member\", which it cannot retry (the Go client of `hotrow` retries it): %s. Only the complete trial is counted.\n\n", strings.Join(reran, ", "))
	}
}

func (r *results) costSection(b *strings.Builder, ix index) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	mx := r.maxClients()
	w("## 2. What a success costs the database\n\n")
	w("Medians over the trials of the closed loop (Go client, never-sells-out stock), per success; the columns are defined in %s.\n\n", see("cost-per-success", "cost per success"))
	w("| strategy | clients | WAL bytes | fsync | rows written | round trips | Redis commands | ctx sw | cores busy | conns |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, name := range r.strategies() {
		for _, c := range r.Config.Clients {
			s := ix.find(expClosed, name, bench.ToolGo, "", c, "")
			if s == nil {
				continue
			}
			w("| `%s` | %d | %.0f | %.2f | %.2f | %.2f | %.1f | %.1f | %.2f | %d |\n", name, c, s.WALBytes.Median, s.WALSyncs.Median, s.Rows.Median,
				s.RoundTrips.Median, s.Redis.Median, s.CtxSw.Median, s.Cores.Median, s.MaxConns)
		}
	}
	w("\n")
	var shared, own []string
	for _, name := range r.strategies() {
		s := ix.find(expClosed, name, bench.ToolGo, "", mx, "")
		if s == nil || s.WALSyncs.N == 0 {
			continue
		}
		item := fmt.Sprintf("`%s` %.2f", name, s.WALSyncs.Median)
		if s.WALSyncs.Median >= serialFsync {
			own = append(own, item)
		} else {
			shared = append(shared, item)
		}
	}
	if len(shared) > 0 || len(own) > 0 {
		w("WAL flushes per success at %d clients (%s): ", mx, see("cost-per-success", "group commit"))
		if len(shared) > 0 {
			w("shared by several commits for %s", strings.Join(shared, ", "))
		}
		if len(own) > 0 {
			if len(shared) > 0 {
				w("; ")
			}
			w("one or more per commit for %s", strings.Join(own, ", "))
		}
		w(".\n\n")
	}
}

func (r *results) sellsOutSection(b *strings.Builder, ix index) {
	ss := ix.filter(func(c cell) bool { return c.Exp == expSellsOut })
	if len(ss) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## 3. Stock that sells out\n\n")
	w("Each trial opens %d units and sends requests for the whole %v window; *HELD* must be trials × stock (%s).\n\n", r.Config.StockSellsOut, r.Config.Duration, see("stock-that-sells-out", "how to read this table"))
	w("| strategy | clients | HELD (trials × %d) | sold out after ms | refusals /s | refusal p50 / p99 ms | success p50 / p99 ms |\n|---|---:|---:|---:|---:|---:|---:|\n", r.Config.StockSellsOut)
	var wrong []string
	cells := 0
	for _, name := range r.strategies() {
		for _, c := range r.Config.Clients {
			s := ix.find(expSellsOut, name, bench.ToolGo, "", c, "")
			if s == nil {
				continue
			}
			held := int64(0)
			for _, t := range r.Trials {
				if t.Cell.key() == s.Cell.key() {
					held += t.Trial.Run.HeldTotal
				}
			}
			want := int64(s.Trials * r.Config.StockSellsOut)
			cells++
			if held != want {
				wrong = append(wrong, fmt.Sprintf("`%s` at %d clients (%d of %d)", name, c, held, want))
			}
			refusedRate := float64(s.RefusedN) / (float64(s.Trials) * r.Config.Duration.Seconds())
			w("| `%s` | %d | %d of %d | %.0f | %.0f | %s / %s | %s / %s |\n", name, c, held, want,
				1000*s.LastHeld.Median, refusedRate, ms(s.Refused.P50), ms(s.Refused.P99), ms(s.Held.P50), ms(s.Held.P99))
		}
	}
	w("\n")
	if len(wrong) == 0 {
		w("Every one of the %d cells sold exactly trials × stock: no oversell, no undersell.\n\n", cells)
	} else {
		w("**HELD differs from trials × stock** in %s.\n\n", strings.Join(wrong, ", "))
	}
}

func (r *results) collapseSection(b *strings.Builder, ix index, perf string, plots []plotFile) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	mx := r.maxClients()
	w("## 5. Why goodput falls as clients grow\n\n")
	var collapsing []string
	for _, name := range r.strategies() {
		if d, ok := r.diagnose(ix, name); ok && d.falls {
			collapsing = append(collapsing, fmt.Sprintf("`%s` (%.0f/s at %s → %.0f/s at %d)", name, d.peak.Goodput.Median, clientsStr(d.peakC), d.last.Goodput.Median, mx))
		}
	}
	if len(collapsing) > 0 {
		w("In this run, these strategies lose more than %.0f%% of their peak goodput at %d clients: %s. ", 100*(1-fallShare), mx, strings.Join(collapsing, ", "))
	} else {
		w("In this run no strategy loses more than %.0f%% of its peak goodput at %d clients. ", 100*(1-fallShare), mx)
	}
	w("A strategy with control scripts (%s) gets its reservation set against its parts, the sampled states of its backends, and what they show; the others, where they fall, a summary of their sampled states. ", see("control-scripts", "pgbench scripts that run one part of the reservation alone"))
	w("The mechanisms named below are explained in the method doc; what the issue observed on another machine is there too (%s).\n\n", see("what-the-seed-observed", "what the seed observed"))
	for _, name := range r.strategies() {
		controls := r.Caps[name]
		if len(controls) == 0 {
			continue
		}
		w("### `%s`: the reservation against its parts\n\n", name)
		w("Transactions per second (median [95%% CI]); `fsync` is WAL flushes per transaction, `ctx sw` context switches per transaction (machine-wide).\n\n")
		w("| clients | reservation, Go | reservation, pgbench |")
		for _, c := range controls {
			w(" %s (pgbench) |", c)
		}
		w("\n|---:|---:|---:|")
		for range controls {
			w("---:|")
		}
		w("\n")
		for _, c := range r.Config.Clients {
			g := ix.find(expClosed, name, bench.ToolGo, "", c, "")
			p := ix.find(expClosed, name, bench.ToolPgbench, "", c, "")
			w("| %d | %s | %s |", c, cellTPS(g, true), cellTPS(p, false))
			for _, ctl := range controls {
				w(" %s |", cellTPS(ix.find(expControl, name, bench.ToolPgbench, ctl, c, ""), false))
			}
			w("\n")
		}
		w("\n")
		embed(b, perf, plots, name+"-collapse.png")
		r.waitTable(b, ix, name)
		r.explain(b, ix, name)
	}
	r.others(b, ix)
}

// others describes, from the sampled states, why strategies without
// control scripts lose goodput as clients grow.
func (r *results) others(b *strings.Builder, ix index) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	mx := r.maxClients()
	var ds []diag
	for _, name := range r.strategies() {
		if len(r.Caps[name]) > 0 {
			continue
		}
		if d, ok := r.diagnose(ix, name); ok && d.falls && len(d.last.Waits) > 0 {
			ds = append(ds, d)
		}
	}
	if len(ds) == 0 {
		return
	}
	w("### The other strategies that fall\n\n")
	w("Without control scripts, the sampled states at %d clients (mean backends per sample, Go runs; %s) say where the time goes.\n\n", mx, see("sampled-wait-states", "the labels"))
	w("| strategy | goodput peak → at %d | cores busy | ctx sw / success | states at %d clients | heads of lock queues |\n|---|---|---:|---:|---|---|\n", mx, mx)
	for _, d := range ds {
		var states, heads []string
		for i, k := range bench.Top(d.last.Waits) {
			if i == 5 {
				break
			}
			states = append(states, fmt.Sprintf("%s %.1f", k, d.last.Waits[k]))
		}
		for _, k := range bench.Top(d.last.Holders) {
			heads = append(heads, fmt.Sprintf("%s %.2f", k, d.last.Holders[k]))
		}
		w("| `%s` | %.0f at %s → %.0f | %.2f | %.0f → %.0f | %s | %s |\n", d.name, d.peak.Goodput.Median, clientsStr(d.peakC), d.last.Goodput.Median,
			d.last.Cores.Median, d.peak.CtxSw.Median, d.last.CtxSw.Median, strings.Join(states, ", "), strings.Join(heads, ", "))
	}
	w("\n")
	cores := r.Machine.Cores
	for _, d := range ds {
		switch {
		case d.oneLock():
			w("- `%s`: %.0f of %d backends wait on `%s`", d.name, d.lockTop, mx, d.lockLabel)
			if d.fewHolders() {
				w(" behind %.2f lock holders per sample: reservations pass few at a time, %.2f ms per reservation at %d clients (1 ÷ goodput)", d.heads, 1000/math.Max(d.last.Goodput.Median, 1e-9), mx)
			}
			if d.saturated {
				w(", on a saturated machine (%.2f of %d cores busy)", d.last.Cores.Median, cores)
			} else {
				w(", and the machine is not saturated (%.2f of %d cores busy): the time goes to waiting, not to work", d.last.Cores.Median, cores)
			}
			if d.last.RoundTrips.N > 0 {
				w("; each success took %.2f round trips to a client that shares the cores (%s)", d.last.RoundTrips.Median, see("a-lock-held-across-a-client-round-trip", "why that counts"))
			}
			w(". ")
		case d.clientBound():
			w("- `%s`: %.1f of %d backends wait on locks (`Lock:*`) but %.0f are waiting for their client (*idle*, *idle in transaction*) while %.2f of %d cores are busy: the machine is saturated, and %d backends plus the client process share it. ",
				d.name, d.lock, mx, d.clientWait, d.last.Cores.Median, cores, mx)
			if d.pgLast != nil {
				w("pgbench, another client, reached %.0f/s at %d clients against Go's %.0f/s (section 1). ", d.pgLast.Throughput.Median, mx, d.last.Goodput.Median)
			}
		default:
			w("- `%s`: no single cause stands out in the sampled states above. ", d.name)
		}
		if d.admissionHelps() {
			w("Through admission (%s) at %d clients it reached %.0f/s, %.2f× the goodput without it (section 6).\n", d.bestAdmit.Cell.Admit, mx, d.bestAdmit.Goodput.Median, d.bestAdmit.Goodput.Median/d.last.Goodput.Median)
		} else if d.bestAdmit != nil {
			w("Admission at %d clients did not reach %.1f× the goodput without it (best: %s, %.0f/s; section 6).\n", mx, admissionGain, d.bestAdmit.Cell.Admit, d.bestAdmit.Goodput.Median)
		} else {
			w("\n")
		}
	}
	w("\n")
}

// cellTPS is "rate [CI] · fsync · ctx sw" for one cell.
func cellTPS(s *summary, goodput bool) string {
	if s == nil {
		return "–"
	}
	v := s.Throughput
	if goodput {
		v = s.Goodput
	}
	return fmt.Sprintf("%s · %.2f fsync · %.0f ctx sw", fmtCI(v), s.WALSyncs.Median, s.CtxSw.Median)
}

func (r *results) waitTable(b *strings.Builder, ix index, name string) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	var ss []*summary
	for _, c := range r.Config.Clients {
		if s := ix.find(expClosed, name, bench.ToolGo, "", c, ""); s != nil && len(s.Waits) > 0 {
			ss = append(ss, s)
		}
	}
	if len(ss) == 0 {
		return
	}
	total := map[string]float64{}
	for _, s := range ss {
		for _, k := range sortedKeys(s.Waits) {
			total[k] += s.Waits[k] / float64(s.Cell.Clients)
		}
	}
	labels := bench.Top(total)
	if len(labels) > 10 {
		labels = labels[:10]
	}
	w("**What the backends were doing** (`%s`, Go runs): mean number of the database's backends per sample in each state (%s).\n\n", name, see("sampled-wait-states", "the labels"))
	w("| state |")
	for _, s := range ss {
		w(" %s |", clientsStr(s.Cell.Clients))
	}
	w("\n|---|")
	for range ss {
		w("---:|")
	}
	w("\n")
	for _, l := range labels {
		w("| %s |", l)
		for _, s := range ss {
			w(" %.2f |", s.Waits[l])
		}
		w("\n")
	}
	w("\n**Heads of the lock queues**: mean number per `pg_locks` sample of backends that held a lock another backend waited for, by what they were doing themselves.\n\n")
	hl := map[string]float64{}
	for _, s := range ss {
		for _, k := range sortedKeys(s.Holders) {
			hl[k] += s.Holders[k]
		}
	}
	w("| head of queue |")
	for _, s := range ss {
		w(" %s |", clientsStr(s.Cell.Clients))
	}
	w("\n|---|")
	for range ss {
		w("---:|")
	}
	w("\n")
	for _, l := range bench.Top(hl) {
		w("| %s |", l)
		for _, s := range ss {
			w(" %.2f |", s.Holders[l])
		}
		w("\n")
	}
	w("\n")
}

// explain states what the measurements of a strategy with control scripts
// show, with the numbers of this run. Each point is written only when its
// condition (findings.go) holds.
func (r *results) explain(b *strings.Builder, ix index, name string) {
	d, ok := r.diagnose(ix, name)
	if !ok {
		return
	}
	mx := r.maxClients()
	cores := r.Machine.Cores
	first := r.Config.Clients[0]
	ctl := func(script string, c int) *summary {
		return ix.find(expControl, name, bench.ToolPgbench, script, c, "")
	}
	var items []string
	item := func(s string) { items = append(items, s) }
	one, last, peak, pc := d.one, d.last, d.peak, d.peakC

	if d.hotRow() {
		var s strings.Builder
		fmt.Fprintf(&s, "*Commits went one at a time.* fsync per success is %.2f at %s and %.2f at %d clients", one.WALSyncs.Median, clientsStr(one.Cell.Clients), last.WALSyncs.Median, mx)
		if ins := ctl("insert-only", mx); ins != nil && ins.WALSyncs.Median < serialFsync {
			fmt.Fprintf(&s, ", while `insert-only` shares flushes, %.2f per transaction at %d clients, and runs at %.0f/s", ins.WALSyncs.Median, mx, ins.Throughput.Median)
		}
		fmt.Fprintf(&s, ". At %d clients, %.1f of the %d backends were waiting for a lock (`Lock:*`) on average, against %.1f at %s; %.1f of them for another transaction's row lock (`Lock:transactionid`, `Lock:tuple`), released at its COMMIT: the signature of a hot row (%s). ",
			mx, d.lock, mx, d.lockPeak, clientsStr(pc), d.rowLock, see("why-a-hot-row-serializes-commits", "why it serializes commits"))
		if r.Machine.FdatasyncMs > 0 {
			fmt.Fprintf(&s, "The flush alone (%.2f ms on this disk, the probe above) would allow about %.0f commits a second; ", r.Machine.FdatasyncMs, 1000/r.Machine.FdatasyncMs)
		}
		fmt.Fprintf(&s, "the best measured point, %.0f/s at %s, bounds the time the lock is held per reservation to at most %.2f ms.", peak.Goodput.Median, clientsStr(pc), 1000/math.Max(peak.Goodput.Median, 1e-9))
		item(s.String())
	}
	if d.wakeups() {
		var s strings.Builder
		fmt.Fprintf(&s, "*Waiting is not free, and it grows with the queue.* Goodput falls from %.0f/s at %s to %.0f/s at %d (%.1f ms per reservation)", peak.Goodput.Median, clientsStr(pc), last.Goodput.Median, mx, 1000/math.Max(last.Goodput.Median, 1e-9))
		if d.saturated || last.Cores.Median >= peak.Cores.Median {
			fmt.Fprintf(&s, ", while the machine stays busy (%.2f cores at %s, %.2f at %d)", peak.Cores.Median, clientsStr(pc), last.Cores.Median, mx)
		}
		if last.CtxSw.Median > peak.CtxSw.Median {
			fmt.Fprintf(&s, " and the context switches per success grow from %.0f to %.0f", peak.CtxSw.Median, last.CtxSw.Median)
		}
		fmt.Fprintf(&s, ". %.1f backends waited on `LWLock:LockManager` at %d clients (%.1f at %s) and %.1f on `LWLock:BufferContent`: waiters woken by each commit, competing for the %d cores with the transaction that holds the lock (%s).",
			waitSum(last.Waits, "LWLock:LockManager"), mx, waitSum(peak.Waits, "LWLock:LockManager"), clientsStr(pc), waitSum(last.Waits, "LWLock:BufferContent"), cores, see("why-waiting-costs-more-as-the-queue-grows", "why"))
		if len(last.Holders) > 0 {
			var heads []string
			for _, k := range bench.Top(last.Holders) {
				heads = append(heads, fmt.Sprintf("%s %.2f", k, last.Holders[k]))
			}
			fmt.Fprintf(&s, " Heads of the lock queues at %d clients: %s.", mx, strings.Join(heads, ", "))
			if idle := waitSum(last.Holders, "idle in transaction"); idle > 0 {
				fmt.Fprintf(&s, " A head *idle in transaction* (%.2f per sample) holds the lock while it waits for its client", idle)
				if lw := waitSum(last.Holders, "LWLock:"); lw > 0 {
					fmt.Fprintf(&s, "; one waiting on an LWLock (%.2f) waits behind the very waiters it blocks", lw)
				}
				s.WriteString(".")
			}
		}
		item(s.String())
	}
	u, bu := ctl("update-only", mx), ctl("begin-update-commit", mx)
	if u != nil && bu != nil && bu.Throughput.Median < roundTripPenalty*u.Throughput.Median {
		var s strings.Builder
		s.WriteString("*Holding the lock across a round trip makes it worse.* ")
		u1 := ctl("update-only", first)
		if u1 != nil && u.Throughput.Median < u1.Throughput.Median {
			fmt.Fprintf(&s, "`update-only` also falls with clients (%s at %s → %.0f/s at %d), ", rateOrDash(u1), clientsStr(first), u.Throughput.Median, mx)
		} else {
			fmt.Fprintf(&s, "`update-only` runs at %.0f/s at %d clients, ", u.Throughput.Median, mx)
		}
		fmt.Fprintf(&s, "but `begin-update-commit`, which keeps its lock until the client's COMMIT, falls to %.0f/s at %d clients", bu.Throughput.Median, mx)
		if p := pgOr(ix, name, mx); p > 0 {
			fmt.Fprintf(&s, ", and the whole reservation to %.0f/s (pgbench) and %.0f/s (Go)", p, last.Goodput.Median)
		}
		fmt.Fprintf(&s, " (%s; %s).", see("control-scripts", "what each control runs"), see("a-lock-held-across-a-client-round-trip", "why a round trip inside the lock costs"))
		if d.falls && d.pgFalls && d.ratioLast.N > 0 && withinBand(d.ratioLast.Median) {
			fmt.Fprintf(&s, " Go and pgbench collapse alike (at %d clients %.0f%% and %.0f%% of their peaks, ratio %.2f), so the cause is in the transaction's shape and the server, not in the Go client.",
				mx, 100*last.Goodput.Median/peak.Goodput.Median, 100*d.pgLast.Throughput.Median/d.pgPeak.Throughput.Median, d.ratioLast.Median)
		}
		item(s.String())
	}
	if d.multiXact() {
		var s strings.Builder
		fmt.Fprintf(&s, "*WAL per success grows with the queue.* %.0f bytes at %s, %.0f at %d clients (%.1f×)", one.WALBytes.Median, clientsStr(one.Cell.Clients), last.WALBytes.Median, mx, d.walFactor)
		ins, upd := ctl("insert-only", mx), ctl("update-only", mx)
		ins1, upd1 := ctl("insert-only", first), ctl("update-only", first)
		if ins != nil && upd != nil && ins1 != nil && upd1 != nil && ins1.WALBytes.Median > 0 && upd1.WALBytes.Median > 0 &&
			ins.WALBytes.Median/ins1.WALBytes.Median < d.walFactor/2 && upd.WALBytes.Median/upd1.WALBytes.Median < d.walFactor/2 {
			fmt.Fprintf(&s, ", while neither part alone grows like that (`insert-only` %.0f → %.0f bytes, `update-only` %.0f → %.0f)", ins1.WALBytes.Median, ins.WALBytes.Median, upd1.WALBytes.Median, upd.WALBytes.Median)
		}
		fmt.Fprintf(&s, "; %.2f backends waited on `LWLock:MultiXact*` at %d clients: several transactions lock one row at once, and PostgreSQL records each new set of lockers as a MultiXact (%s).", d.mxact, mx, see("shared-row-locks-and-multixacts", "why, and which foreign key"))
		if st := waitSum(last.Waits, "LWLock:SubtransSLRU"); st > 0.05 {
			fmt.Fprintf(&s, " %.2f backends waited on `LWLock:SubtransSLRU`: lockers inside a savepoint, resolved through pg_subtrans (%s).", st, see("savepoints-and-pg_subtrans", "savepoints"))
		}
		item(s.String())
	}
	if len(items) > 0 {
		b.WriteString("**What this shows.**\n\n")
		for i, it := range items {
			fmt.Fprintf(b, "%d. %s\n", i+1, it)
		}
		b.WriteString("\n")
	}
	if idle := waitSum(last.Waits, "idle"); idle > 1 {
		fmt.Fprintf(b, "At %d clients %.1f backends on average were *idle* (between transactions) or *idle in transaction*: waiting for their client, which shares the %d cores (%s).\n\n", mx, idle, cores, see("a-lock-held-across-a-client-round-trip", "the client in the critical section"))
	}
	var concl []string
	if maxc, err := strconv.Atoi(r.Machine.Settings["max_connections"]); err == nil && last.MaxConns < maxc && d.falls {
		concl = append(concl, fmt.Sprintf("The fall is not a lack of connections: max_connections is %d and at most %d were used.", maxc, last.MaxConns))
	}
	if d.falls && d.hotRow() {
		c := fmt.Sprintf("It is the cost of %.0f backends queued on row locks", d.rowLock)
		if d.fewHolders() {
			c += fmt.Sprintf(", behind %.2f lock holders per sample,", d.heads)
		}
		concl = append(concl, fmt.Sprintf("%s on %d cores.", c, cores))
	}
	if d.falls && d.admissionHelps() {
		concl = append(concl, fmt.Sprintf("Keeping fewer transactions in flight helps: admission %s at %d clients reached %.0f/s against %.0f/s without it (section 6).", d.bestAdmit.Cell.Admit, mx, d.bestAdmit.Goodput.Median, last.Goodput.Median))
	}
	if len(concl) > 0 {
		fmt.Fprintf(b, "%s\n\n", strings.Join(concl, " "))
	}
}

func rateOrDash(s *summary) string {
	if s == nil {
		return "–"
	}
	return fmt.Sprintf("%.0f/s", s.Throughput.Median)
}

func pgOr(ix index, name string, c int) float64 {
	if s := ix.find(expClosed, name, bench.ToolPgbench, "", c, ""); s != nil {
		return s.Throughput.Median
	}
	return 0
}

func (r *results) admissionSection(b *strings.Builder, ix index, perf string, plots []plotFile) {
	ss := ix.filter(func(c cell) bool { return c.Exp == expAdmission })
	if len(ss) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## 6. What bounded admission does\n\n")
	w("The same closed loop, through `admission.Wrap(node, Limits{InFlight: k, ...})` ([`admission`](../admission)): at most k requests touch the database at once. ")
	w("k is the client count at which the strategy's own goodput peaked in section 1; *queue-k* makes every request wait its turn, *shed-k* refuses the overflow at once with a Retry-After (%s). ", see("bounded-admission", "the two policies and why a bound helps"))
	w("The *none* rows are section 1's trials.\n\n")
	w("| strategy | clients | admission | goodput /s | p50 / p99 ms | shed /s (p99 ms) | conns | vs no admission |\n|---|---:|---|---:|---:|---:|---:|---:|\n")
	sort.SliceStable(ss, func(i, j int) bool {
		a, c := ss[i].Cell, ss[j].Cell
		if a.Strategy != c.Strategy {
			return a.Strategy < c.Strategy
		}
		if a.Clients != c.Clients {
			return a.Clients < c.Clients
		}
		return a.Admit < c.Admit
	})
	last := ""
	for _, s := range ss {
		c := s.Cell
		if key := fmt.Sprintf("%s|%d", c.Strategy, c.Clients); key != last {
			last = key
			if base := ix.find(expClosed, c.Strategy, bench.ToolGo, "", c.Clients, ""); base != nil {
				w("| `%s` | %d | none | %s | %s / %s | – | %d | 1.00 |\n", c.Strategy, c.Clients, fmtCI(base.Goodput), ms(base.Held.P50), ms(base.Held.P99), base.MaxConns)
			}
		}
		rel := "–"
		if base := ix.find(expClosed, c.Strategy, bench.ToolGo, "", c.Clients, ""); base != nil && base.Goodput.Median > 0 {
			rel = fmt.Sprintf("%.2f", s.Goodput.Median/base.Goodput.Median)
		}
		shed := "–"
		if s.ShedN > 0 {
			shed = fmt.Sprintf("%.0f (%s)", float64(s.ShedN)/(float64(s.Trials)*r.Config.Duration.Seconds()), ms(s.Shed.P99))
		}
		w("| `%s` | %d | %s | %s | %s / %s | %s | %d | %s |\n", c.Strategy, c.Clients, c.Admit, fmtCI(s.Goodput), ms(s.Held.P50), ms(s.Held.P99), shed, s.MaxConns, rel)
	}
	w("\n")
	embed(b, perf, plots, "admission.png")
	mx := r.maxClients()
	var lines []string
	for _, name := range r.strategies() {
		d, ok := r.diagnose(ix, name)
		if !ok || len(d.admitted) == 0 || d.last.Goodput.Median <= 0 || d.peak.Goodput.Median <= 0 {
			continue
		}
		var parts []string
		for _, a := range d.admitted {
			parts = append(parts, fmt.Sprintf("%s %.0f/s (%.2f× without admission, %.0f%% of the peak; p99 %s ms)", a.Cell.Admit, a.Goodput.Median,
				a.Goodput.Median/d.last.Goodput.Median, 100*a.Goodput.Median/d.peak.Goodput.Median, ms(a.Held.P99)))
		}
		verdict := ""
		switch {
		case d.falls && d.admissionNearPeak():
			verdict = fmt.Sprintf(": the bound keeps goodput near the peak that %d clients lost", mx)
		case d.falls && d.admissionHelps():
			verdict = fmt.Sprintf(": the bound recovers part of what %d clients lost", mx)
		case !d.admissionHelps():
			verdict = fmt.Sprintf(": no policy reached %.1f× the goodput without admission", admissionGain)
		}
		lines = append(lines, fmt.Sprintf("`%s` at %d clients, peak %.0f/s at %s, %.0f/s without admission (p99 %s ms): %s%s.", name, mx, d.peak.Goodput.Median, clientsStr(d.peakC),
			d.last.Goodput.Median, ms(d.last.Held.P99), strings.Join(parts, ", "), verdict))
	}
	if len(lines) > 0 {
		w("At the most clients:\n\n")
		for _, l := range lines {
			w("- %s\n", l)
		}
		w("\n")
	}
}

// caveats links the method's caveats and states those that depend on this
// run, each only when it applies.
func (r *results) caveats(b *strings.Builder, ix index) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	mx := r.maxClients()
	w("## Caveats\n\n")
	w("The caveats of the method (one machine shared by client and server, short windows, one SKU, what pgbench replays, a load generator on the same cores) are in %s. For this run:\n\n", see("caveats", "the method doc"))
	w("- Client, pgbench and server shared %d cores; absolute numbers are this machine's, and the confidence intervals cover trial-to-trial noise of this run only.\n", r.Machine.Cores)
	var high []string
	for _, name := range r.strategies() {
		if rt := ratios(r.Trials, name, mx); rt.N > 0 && rt.Median > 1.05 {
			high = append(high, fmt.Sprintf("`%s` %.2f", name, rt.Median))
		}
	}
	if len(high) > 0 {
		w("- Go/pgbench above 1 at %d clients: %s. There pgbench (one process, `-j %d`) was the slower client (%s).\n", mx, strings.Join(high, ", "), r.Machine.Cores, see("pgbench-side-by-side", "pgbench"))
	}
	if pairs := r.overlapping(ix); len(pairs) > 0 {
		w("- The goodput intervals of %s overlap at every client count: this run cannot tell them apart.\n", strings.Join(pairs, "; "))
	}
	w("\n")
}

func (r *results) reproduce(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## Reproduce and compare\n\n")
	w("`%s` produced this run in %s; `go run ./cmd/reservebench-bench -render docs/perf/results.json` writes this report again from it. Other commands, and how to compare two runs with `benchstat`: %s.\n",
		strings.TrimSpace(r.Command), fmtDur(r.Elapsed), see("reproduce-and-compare", "reproduce and compare"))
}

func embed(b *strings.Builder, perf string, plots []plotFile, names ...string) {
	for _, n := range names {
		for _, p := range plots {
			if p.Name == n {
				fmt.Fprintf(b, "![%s](%s/%s)\n\n", p.Title, perf, p.Name)
			}
		}
	}
}

func clientsStr(c int) string {
	if c == 1 {
		return "1 client"
	}
	return fmt.Sprintf("%d clients", c)
}

func fmtCI(s bench.Summary) string {
	if s.N == 0 || math.IsNaN(s.Median) {
		return "–"
	}
	if s.N == 1 {
		return fmt.Sprintf("%.0f", s.Median)
	}
	return fmt.Sprintf("%.0f [%.0f, %.0f]", s.Median, math.Max(s.Lo, 0), s.Hi)
}

func fmtRatio(s bench.Summary) string {
	if s.N == 0 {
		return "–"
	}
	if s.N == 1 {
		return fmt.Sprintf("%.2f", s.Median)
	}
	return fmt.Sprintf("%.2f [%.2f, %.2f]", s.Median, math.Max(s.Lo, 0), s.Hi)
}

func ms(v float64) string {
	switch {
	case v == 0 || math.IsNaN(v):
		return "–"
	case v < 1:
		return fmt.Sprintf("%.3f", v)
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	case v < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

func fmtDur(sec float64) string {
	m := int(sec) / 60
	s := int(sec) % 60
	return fmt.Sprintf("%dm%02ds", m, s)
}

func joinInts(xs []int) string {
	var parts []string
	for _, x := range xs {
		parts = append(parts, fmt.Sprint(x))
	}
	return strings.Join(parts, ", ")
}

func joinFloats(xs []float64) string {
	var parts []string
	for _, x := range xs {
		parts = append(parts, strconv.FormatFloat(x, 'f', -1, 64))
	}
	return strings.Join(parts, ", ")
}

// joinAnd writes "a", "a and b", "a, b and c".
func joinAnd(xs []string) string {
	switch len(xs) {
	case 0:
		return ""
	case 1:
		return xs[0]
	}
	return strings.Join(xs[:len(xs)-1], ", ") + " and " + xs[len(xs)-1]
}

func isAre(n int) string {
	if n == 1 {
		return "is"
	}
	return "are"
}

func sortedKeys(m map[string]float64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// studentT is the two-sided 95% quantile of Student's t for n trials, as
// bench.Summarize uses it.
func studentT(n int) float64 {
	return distuv.StudentsT{Mu: 0, Sigma: 1, Nu: float64(n - 1)}.Quantile(0.975)
}

// toolName is how the report writes a tool in a sentence.
func toolName(t bench.Tool) string {
	if t == bench.ToolGo {
		return "Go"
	}
	return string(t)
}

// pgbenchPartsOnly says where the closed loop ran pgbench only for the
// strategies with control scripts (PgbenchPartsOnlyFrom), or "".
func (c config) pgbenchPartsOnly() string {
	if c.PgbenchPartsOnlyFrom <= 0 || !slices.ContainsFunc(c.Clients, func(n int) bool { return n >= c.PgbenchPartsOnlyFrom }) {
		return ""
	}
	return fmt.Sprintf("from %d clients on, only for the strategies with control scripts (section 5 sets their reservation against its parts there; connecting %d pgbench clients takes this machine more than the window)", c.PgbenchPartsOnlyFrom, c.PgbenchPartsOnlyFrom)
}

// fewerTrials says where the closed loop ran fewer trials (FewerTrialsFrom),
// whose intervals are the wider for it, or nothing.
func (c config) fewerTrials() string {
	if c.FewerTrialsFrom <= 0 || c.ExtraTrials >= c.Trials || !slices.ContainsFunc(c.Clients, func(n int) bool { return n >= c.FewerTrialsFrom }) {
		return ""
	}
	return fmt.Sprintf(" (%d at %d clients and more, where the interval's t is %.2f)", c.ExtraTrials, c.FewerTrialsFrom, studentT(c.ExtraTrials))
}
