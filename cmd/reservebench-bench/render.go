package main

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/reservebench/reservebench/bench"
)

// render writes docs/performance.md from the results. Every number in it
// comes from this run; perf is the plots' directory relative to the doc.
func (r *results) render(perf string, plots []plotFile) string {
	ix := index{all: r.Summaries}
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	cfg := r.Config

	w("# Performance: what each strategy costs\n\n")
	w("> **Generated** by `make bench` (`%s`) on %s, in %s; do not edit by hand, run it again. ",
		strings.TrimSpace(r.Command), r.Started.UTC().Format("2006-01-02 15:04 MST"), fmtDur(r.Elapsed))
	if r.RenderedFrom != "" {
		w("(This text was rendered again from that run's `%s` with `-render`: same data, newer wording.) ", r.RenderedFrom)
	}
	w("Mode **%s**: %d trials per point of the closed loop (Go and pgbench), %d per point of the other experiments, %v measured window per trial, clients %s. ",
		cfg.Mode, cfg.Trials, cfg.ExtraTrials, cfg.Duration, joinInts(cfg.Clients))
	w("Raw data: [`%s/results.txt`](%s/results.txt) (Go benchmark format, one line per trial: `benchstat -col /strategy %s/results.txt`), ",
		perf, perf, "docs/perf")
	w("[`%s/results.json`](%s/results.json) (every trial and every summary below). ", perf, perf)
	w("Timings never go into unit tests or table 28-1; this file is the only place they are reported.\n\n")

	r.headline(&b, ix)
	r.machineSection(&b)
	r.method(&b)
	r.closedSection(&b, ix, perf, plots)
	r.costSection(&b, ix)
	r.sellsOutSection(&b, ix)
	r.openSection(&b, ix, perf, plots)
	r.collapseSection(&b, ix, perf, plots)
	r.admissionSection(&b, ix, perf, plots)
	r.caveats(&b)
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

func (r *results) headline(b *strings.Builder, ix index) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## Headline\n\n")
	w("Successful reservations per second (goodput), Go client, closed loop, stock that never sells out; ")
	w("median of %d trials, [95%% confidence interval of the mean, Student's t]. ", r.Config.Trials)
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
		if math.IsInf(lo, 0) {
			w(" no pgbench script |\n")
		} else {
			w(" %.2f–%.2f |\n", lo, hi)
		}
	}
	w("\n")
	r.findings(b, ix)
}

// findings lists what the tables below show, computed from this run.
func (r *results) findings(b *strings.Builder, ix index) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	mx := r.maxClients()
	w("What this run shows (each point is backed by a section below):\n\n")
	best, bestC, bestV := "", 0, 0.0
	for _, name := range r.strategies() {
		if c, s := r.peak(ix, name); s != nil && s.Goodput.Median > bestV {
			best, bestC, bestV = name, c, s.Goodput.Median
		}
	}
	if best != "" {
		w("- The most goodput: `%s`, %.0f reservations/s at %s (section 1); what it gives up for that is in table 28-1, not here.\n", best, bestV, clientsStr(bestC))
	}
	for _, name := range r.strategies() {
		pc, ps := r.peak(ix, name)
		last := ix.find(expClosed, name, bench.ToolGo, "", mx, "")
		if ps == nil || last == nil || pc >= mx || last.Goodput.Median >= 0.6*ps.Goodput.Median {
			continue
		}
		w("- `%s` falls from %.0f/s at %s to %.0f/s at %d clients (p99 %s ms)", name, ps.Goodput.Median, clientsStr(pc), last.Goodput.Median, mx, ms(last.Held.P99))
		var adm []string
		as := ix.filter(func(c cell) bool { return c.Exp == expAdmission && c.Strategy == name && c.Clients == mx })
		sort.Slice(as, func(i, j int) bool { return as[i].Cell.Admit < as[j].Cell.Admit })
		for _, s := range as {
			adm = append(adm, fmt.Sprintf("%.0f/s with admission %s (p99 %s ms)", s.Goodput.Median, s.Cell.Admit, ms(s.Held.P99)))
		}
		if len(adm) > 0 {
			w("; through `admission.Gate` at the same %d clients: %s (section 6)", mx, strings.Join(adm, ", "))
		}
		w(".\n")
	}
	var withControls []string
	for _, name := range r.strategies() {
		if len(r.Caps[name]) > 0 {
			withControls = append(withControls, "`"+name+"`")
		}
	}
	if len(withControls) > 0 {
		w("- Why %s falls (section 5): commits on one hot row go one at a time (one WAL flush each: no group commit), and every commit wakes the queue of waiters, whose lock-manager and buffer-lock traffic takes the %d cores from the one transaction that holds the row; keeping the row locked across a client round trip, and the foreign key's KEY SHARE locks on the same row, make each turn longer as the queue grows. Section 5 also says, from the sampled wait events, why the others fall.\n", strings.Join(withControls, ", "), r.Machine.Cores)
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, name := range r.strategies() {
		for _, c := range r.Config.Clients {
			if rt := ratios(r.Trials, name, c); rt.N > 0 {
				lo, hi = math.Min(lo, rt.Median), math.Max(hi, rt.Median)
			}
		}
	}
	if !math.IsInf(lo, 0) {
		w("- Go against pgbench running the same SQL on the same server: median ratios from %.2f to %.2f over all strategies and client counts (section 1). The SQL and the server, not the Go code, set the shape of every curve.\n", lo, hi)
	}
	w("\n")
}

func (r *results) machineSection(b *strings.Builder) {
	m := r.Machine
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## The machine\n\n")
	w("Client and server share one machine: %d cores (%s), %.0f GiB of memory, Linux %s, %s/%s, %s. ",
		m.Cores, m.CPUModel, m.MemoryGiB, m.Kernel, m.GOOS, m.GOARCH, m.GoVersion)
	w("PostgreSQL %s, started for the run by `pgtest` (kind `%s`: a throwaway cluster, Unix socket, no TCP), %s. ",
		m.PostgresVersion, m.ServerKind, m.PgbenchVersion)
	w("An 8 kB write plus `fdatasync` in the cluster's directory took **%.2f ms** (median of 200, measured by the command before the sweep): ", m.FdatasyncMs)
	w("with fsync on, a commit cannot be acknowledged faster than one such flush, unless several commits share it (group commit).\n\n")
	w("| setting | value |\n|---|---|\n")
	for _, k := range settingNames {
		if v, ok := m.Settings[k]; ok {
			w("| `%s` | %s |\n", k, v)
		}
	}
	w("\nfsync, full_page_writes and synchronous_commit are **on**, as a user's server has them (tests run with fsync off; benchmarks never do).\n\n")
}

func (r *results) method(b *strings.Builder) {
	cfg := r.Config
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## How we measure, and what each number means\n\n")
	w("Library: package [`bench`](../bench); command: [`cmd/reservebench-bench`](../cmd/reservebench-bench). ")
	w("Every trial opens a **fresh deployment** of the strategy (`Meta.Open`) with a SKU of its own, in a database of its own per strategy, on one server, and sends requests for that SKU only: ")
	w("each request has a new key and a new user (a flash sale: every buyer buys once), TTL one hour, through `Node(0)` of a one-node deployment.\n\n")
	w("- **Closed loop**: N clients, each sends its next request when the previous one is answered (pgbench's default model). ")
	w("The window is %v; a request still in flight when it closes is not counted (it runs to its end: cancelling it could leave its outcome unknown). ", cfg.Duration)
	w("Connections are opened before the window (pgbench also reports tps \"without initial connection time\").\n")
	w("- **Open loop**: requests planned on a Poisson schedule (exponential gaps, like `pgbench --rate`) and sent by %d workers; ", cfg.OpenClients)
	w("a request's latency runs from its **planned** send time, so time spent waiting for a free worker counts (no coordinated omission). ")
	w("*Schedule lag* is send time minus planned time; *late* counts requests sent more than 1 ms late; a request that could only be sent more than %v late is skipped (as `pgbench --latency-limit` does) and counted with those still unsent when the window closed as *never sent*.\n", cfg.LateLimit)
	w("- **Goodput** is HELD answers per second: successful reservations, the only answers that sell anything. **Throughput** counts every answer. ")
	w("Latency of successes and of refusals (SOLD_OUT; admission's refusals separately) are recorded in separate [HdrHistogram](https://github.com/HdrHistogram/hdrhistogram-go) histograms, one per client, merged; ")
	w("p50/p90/p99/max are read from the merged histogram (3 significant digits), never averaged. A cell's *merged* quantiles merge the histograms of all its trials.\n")
	w("- **Trials**: %d per point (%d beyond the closed loop), interleaved: each round runs every point once in a shuffled order, and the Go and pgbench trials of one point run back to back, alternating which goes first, so drift of the machine spreads over all points. ", cfg.Trials, cfg.ExtraTrials)
	w("Tables show the **median** and a **95%% confidence interval of the mean** (mean ± t·s/√n with Student's t at n−1 degrees of freedom, from gonum's `distuv.StudentsT`; for 5 trials t = 2.78, not 1.96). The plots draw the median with those bars.\n")
	w("- **Cost per success**, from the server's counters before and after each trial (every connection is closed before the second reading, so every backend has reported its statistics): ")
	w("WAL bytes (`pg_current_wal_insert_lsn` delta, server-wide), WAL flushes (`pg_stat_wal.wal_sync`), rows written (`tup_inserted + tup_updated + tup_deleted` of the trial's database), ")
	w("round trips (queries and prepares counted by a pgx tracer on the Go pool; pgbench's are its script's statements), context switches (`/proc/stat`, machine-wide) and cores busy during the window, and the most connections of the database seen at once. ")
	w("All are divided by the HELD answers of the trial, including those answered after the window.\n")
	w("- **What the backends were doing**: every %v a separate connection reads `pg_stat_activity` for the trial's database (state and wait event of each backend), and every fourth sample `pg_locks`, to find the head of each lock queue (a backend holding a lock someone waits for, itself not waiting for a lock).\n", cfg.SampleEvery)
	w("- **pgbench side by side**: for every strategy whose deployment implements `bench.PgbenchScripter`, pgbench (`-M prepared`, like pgx's statement cache; `-j %d`) runs a script built in the strategy's own package from the **same SQL constants** its Go code sends, in the same order, on the same server, at the same client counts, in the same rounds. ", r.Machine.Cores)
	w("The ratio Go/pgbench is computed per round (the two trials ran back to back) and then summarized. ")
	w("Scripts replay the HELD path only (pgbench cannot branch on a row count without changing the statement), so pgbench runs on the never-sells-out stock only; the audit after each pgbench trial checks the rows it made. ")
	w("`memquota` decides in memory first: its script holds only its database part (one INSERT), so its ratio compares the whole Go path with that part. A strategy without a script gets no ratio (none is missing in this run).\n\n")
}

func (r *results) closedSection(b *strings.Builder, ix index, perf string, plots []plotFile) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## 1. Closed loop, stock that never sells out\n\n")
	w("Per strategy and client count: goodput (median [95%% CI]), latency of successes (merged over the trials), pgbench's transactions per second running the same SQL, and the paired ratio. ")
	w("The stock is %d units per trial; a trial that sold out anyway would be flagged here (none was unless marked).\n\n", r.Config.StockPlenty)
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
	w("Where p99 or max approach the %v window, the tail is cut by the window: a request slower than the window cannot be counted in it (in a closed loop with N clients, N requests are always in flight when the window closes). Read those tails as lower bounds.\n\n", r.Config.Duration)
}

func (r *results) costSection(b *strings.Builder, ix index) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## 2. What a success costs the database\n\n")
	w("Medians over the trials of the closed loop (Go client, never-sells-out stock). *fsync/succ* below 1 means commits shared WAL flushes (group commit); *round trips* are what the Go client sent per success (pgbench sends its script's statements); ")
	w("*ctx sw/succ* and *cores* are machine-wide (client and server together); *conns* is the most backends of the database seen at once.\n\n")
	w("| strategy | clients | WAL bytes | fsync | rows written | round trips | ctx sw | cores busy | conns |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, name := range r.strategies() {
		for _, c := range r.Config.Clients {
			s := ix.find(expClosed, name, bench.ToolGo, "", c, "")
			if s == nil {
				continue
			}
			w("| `%s` | %d | %.0f | %.2f | %.2f | %.2f | %.1f | %.2f | %d |\n", name, c, s.WALBytes.Median, s.WALSyncs.Median, s.Rows.Median,
				s.RoundTrips.Median, s.CtxSw.Median, s.Cores.Median, s.MaxConns)
		}
	}
	w("\n")
}

func (r *results) sellsOutSection(b *strings.Builder, ix index) {
	ss := ix.filter(func(c cell) bool { return c.Exp == expSellsOut })
	if len(ss) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## 3. Stock that sells out\n\n")
	w("Each trial opens %d units and sends requests for the whole %v window: the units go in the first moments, and every later answer is a refusal. ", r.Config.StockSellsOut, r.Config.Duration)
	w("*HELD* is the total over the trials (it must be trials × stock: no oversell, no undersell); *sold out after* is when the last unit was answered (median); refusals are SOLD_OUT answers, with their own latency histogram.\n\n")
	w("| strategy | clients | HELD (trials × %d) | sold out after ms | refusals /s | refusal p50 / p99 ms | success p50 / p99 ms |\n|---|---:|---:|---:|---:|---:|---:|\n", r.Config.StockSellsOut)
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
			refusedRate := float64(s.RefusedN) / (float64(s.Trials) * r.Config.Duration.Seconds())
			w("| `%s` | %d | %d of %d | %.0f | %.0f | %s / %s | %s / %s |\n", name, c, held, s.Trials*r.Config.StockSellsOut,
				1000*s.LastHeld.Median, refusedRate, ms(s.Refused.P50), ms(s.Refused.P99), ms(s.Held.P50), ms(s.Held.P99))
		}
	}
	w("\n")
}

func (r *results) openSection(b *strings.Builder, ix index, perf string, plots []plotFile) {
	ss := ix.filter(func(c cell) bool { return c.Exp == expOpen })
	if len(ss) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## 4. Open loop\n\n")
	w("%d workers; Poisson arrivals at a fraction (*load*) of the strategy's closed-loop median goodput (Go) at the largest measured client count not above %d (*base*), measured earlier in the same run. ", r.Config.OpenClients, r.Config.OpenClients)
	w("Latency is from the planned send time. Above 1.0 the server cannot keep up: the queue grows for the whole window, and latency grows with it, until requests become too late to send.\n\n")
	w("| strategy | base | load | planned /s | goodput /s | p50 ms | p99 ms | max ms | lag p99 ms | late | skipped + never sent |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	sort.SliceStable(ss, func(i, j int) bool {
		if ss[i].Cell.Strategy != ss[j].Cell.Strategy {
			return ss[i].Cell.Strategy < ss[j].Cell.Strategy
		}
		return ss[i].Cell.Load < ss[j].Cell.Load
	})
	for _, s := range ss {
		w("| `%s` | %d | %.2f | %.0f | %s | %s | %s | %s | %s | %d of %d | %d |\n", s.Cell.Strategy, s.Cell.Base, s.Cell.Load, s.Cell.Rate, fmtCI(s.Goodput),
			ms(s.Held.P50), ms(s.Held.P99), ms(s.Held.Max), ms(s.Lag.P99), s.Late, s.Sent, s.Skipped+s.NeverSent)
	}
	w("\n")
	embed(b, perf, plots, "open-loop.png")
}

func (r *results) collapseSection(b *strings.Builder, ix index, perf string, plots []plotFile) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	mx := r.maxClients()
	w("## 5. Why goodput falls as clients grow\n\n")
	w("The issue observed the seed's A transaction (`hotrow`: begin, savepoint, insert, update, commit) at about 750/1100/340/120 tps for 1/8/32/128 clients. ")
	var collapsing []string
	for _, name := range r.strategies() {
		pc, ps := r.peak(ix, name)
		last := ix.find(expClosed, name, bench.ToolGo, "", mx, "")
		if ps != nil && last != nil && pc < mx && last.Goodput.Median < 0.6*ps.Goodput.Median {
			collapsing = append(collapsing, fmt.Sprintf("`%s` (%.0f/s at %s → %.0f/s at %d)", name, ps.Goodput.Median, clientsStr(pc), last.Goodput.Median, mx))
		}
	}
	if len(collapsing) > 0 {
		w("In this run, these strategies lose more than 40%% of their peak goodput at %d clients: %s. ", mx, strings.Join(collapsing, ", "))
	}
	w("Three measurements say why, for every strategy with control scripts (pgbench scripts that run one part of the reservation alone, built from the same constants).\n\n")
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
		r.explain(b, ix, name, controls)
	}
	r.others(b, ix)
}

// others describes, from the sampled states, why strategies without
// control scripts lose goodput as clients grow.
func (r *results) others(b *strings.Builder, ix index) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	mx := r.maxClients()
	first := true
	for _, name := range r.strategies() {
		if len(r.Caps[name]) > 0 {
			continue
		}
		pc, peak := r.peak(ix, name)
		last := ix.find(expClosed, name, bench.ToolGo, "", mx, "")
		if peak == nil || last == nil || pc >= mx || last.Goodput.Median >= 0.6*peak.Goodput.Median || len(last.Waits) == 0 {
			continue
		}
		if first {
			w("### The other strategies that fall\n\n")
			w("Without control scripts, the sampled states at %d clients (mean backends per sample, Go runs) say where the time goes.\n\n", mx)
			w("| strategy | goodput peak → at %d | cores busy | ctx sw / success | states at %d clients | heads of lock queues |\n|---|---|---:|---:|---|---|\n", mx, mx)
			first = false
		}
		var states, heads []string
		for i, k := range bench.Top(last.Waits) {
			if i == 5 {
				break
			}
			states = append(states, fmt.Sprintf("%s %.1f", k, last.Waits[k]))
		}
		for _, k := range bench.Top(last.Holders) {
			heads = append(heads, fmt.Sprintf("%s %.2f", k, last.Holders[k]))
		}
		w("| `%s` | %.0f at %s → %.0f | %.2f | %.0f → %.0f | %s | %s |\n", name, peak.Goodput.Median, clientsStr(pc), last.Goodput.Median,
			last.Cores.Median, peak.CtxSw.Median, last.CtxSw.Median, strings.Join(states, ", "), strings.Join(heads, ", "))
	}
	if first {
		return
	}
	w("\n")
	for _, name := range r.strategies() {
		if len(r.Caps[name]) > 0 {
			continue
		}
		pc, peak := r.peak(ix, name)
		last := ix.find(expClosed, name, bench.ToolGo, "", mx, "")
		if peak == nil || last == nil || pc >= mx || last.Goodput.Median >= 0.6*peak.Goodput.Median || len(last.Waits) == 0 {
			continue
		}
		lock, clientWait := 0.0, 0.0
		lockLabel := ""
		for k, v := range last.Waits {
			switch {
			case strings.HasPrefix(k, "Lock:"):
				lock += v
				if lockLabel == "" || v > last.Waits[lockLabel] {
					lockLabel = k
				}
			case k == "idle" || k == "idle in transaction" || k == "Client:ClientRead":
				clientWait += v
			}
		}
		switch {
		case lock > float64(mx)/2:
			w("- `%s`: %.0f of %d backends queue on one lock (`%s`): one reservation at a time, like a hot row, but the machine is not saturated (%.2f cores busy), so goodput is 1 ÷ the time one reservation holds the lock, every statement of it a round trip to a client that shares the cores. ",
				name, lock, mx, lockLabel, last.Cores.Median)
		case clientWait > float64(mx)/2 && last.Cores.Median > 0.85*float64(r.Machine.Cores):
			w("- `%s`: no lock queue; %.0f of %d backends are waiting for their client (*idle*, *idle in transaction*) while %.2f of %d cores are busy: the machine is saturated, and %d backends plus the client process share it. ",
				name, clientWait, mx, last.Cores.Median, r.Machine.Cores, mx)
			if p := ix.find(expClosed, name, bench.ToolPgbench, "", mx, ""); p != nil {
				w("pgbench, another client, reached %.0f/s at %d clients against Go's %.0f/s (section 1). ", p.Throughput.Median, mx, last.Goodput.Median)
			}
		default:
			w("- `%s`: see the states above. ", name)
		}
		w("Admission helps where the queue, not the work, grew (section 6).\n")
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
		for k, v := range s.Waits {
			total[k] += v / float64(s.Cell.Clients)
		}
	}
	labels := bench.Top(total)
	if len(labels) > 10 {
		labels = labels[:10]
	}
	w("**What the backends were doing** (`%s`, Go runs): mean number of the database's backends per sample in each state (see `bench.Waits` for the labels; *CPU* is a backend running or waiting for a core).\n\n", name)
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
		for k, v := range s.Holders {
			hl[k] += v
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
// show, with the numbers of this run.
func (r *results) explain(b *strings.Builder, ix index, name string, controls []string) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	mx := r.maxClients()
	one := ix.find(expClosed, name, bench.ToolGo, "", r.Config.Clients[0], "")
	last := ix.find(expClosed, name, bench.ToolGo, "", mx, "")
	pc, peak := r.peak(ix, name)
	if one == nil || last == nil || peak == nil {
		return
	}
	lockWaits := func(s *summary) float64 {
		sum := 0.0
		for k, v := range s.Waits {
			if strings.HasPrefix(k, "Lock:") {
				sum += v
			}
		}
		return sum
	}
	lw := func(s *summary, prefix string) float64 {
		sum := 0.0
		for k, v := range s.Waits {
			if strings.HasPrefix(k, prefix) {
				sum += v
			}
		}
		return sum
	}
	w("**What this shows.**\n\n")
	w("1. *The stock row is a queue of one.* Every reservation ends by updating the same row, and the row lock taken by that UPDATE is held until COMMIT. ")
	w("So commits of one SKU happen one at a time and cannot share a WAL flush: fsync per success is %.2f at %s and %.2f at %d clients, ", one.WALSyncs.Median, clientsStr(one.Cell.Clients), last.WALSyncs.Median, mx)
	if s := ix.find(expControl, name, bench.ToolPgbench, "insert-only", mx, ""); s != nil {
		w("while the same insert without the UPDATE (`insert-only`) shares flushes, %.2f per transaction at %d clients, and runs at %.0f/s. ", s.WALSyncs.Median, mx, s.Throughput.Median)
	}
	w("Goodput is then 1 ÷ (time the row stays locked per reservation). The flush alone (%.2f ms on this disk, the probe above) would allow about %.0f commits a second; the best measured point, %.0f/s at %s, bounds the time the row stays locked to at most %.2f ms per reservation: the UPDATE, its answer travelling to the client, the client's COMMIT travelling back, and the commit. ",
		r.Machine.FdatasyncMs, 1000/math.Max(r.Machine.FdatasyncMs, 1e-3), peak.Goodput.Median, clientsStr(pc), 1000/math.Max(peak.Goodput.Median, 1e-9))
	w("At %d clients, %.1f of the %d backends were waiting for a lock (`Lock:*`) on average, against %.1f at %s.\n", mx, lockWaits(last), mx, lockWaits(peak), clientsStr(pc))
	w("2. *Waiting is not free, and it grows with the queue.* Goodput does not stay at that ceiling: it falls from %.0f/s at %s to %.0f/s at %d (the row now stays locked %.1f ms per reservation), while the machine stays busy (%.2f cores at %s, %.2f at %d) ",
		peak.Goodput.Median, clientsStr(pc), last.Goodput.Median, mx, 1000/math.Max(last.Goodput.Median, 1e-9), peak.Cores.Median, clientsStr(pc), last.Cores.Median, mx)
	w("and the context switches per success grow from %.0f to %.0f. ", peak.CtxSw.Median, last.CtxSw.Median)
	w("Every commit releases the row to one waiter but wakes the others queued on the same lock: they all go through the one lock-manager partition that holds that lock (%.1f backends waiting on `LWLock:LockManager` at %d clients, %.1f at %s), ",
		lw(last, "LWLock:LockManager"), mx, lw(peak, "LWLock:LockManager"), clientsStr(pc))
	w("re-read the row's newest version on the one buffer page that holds it (%.1f on `LWLock:BufferContent` at %d clients)", lw(last, "LWLock:BufferContent"), mx)
	w(", and go back to sleep. On %d cores that work competes with the one transaction that could make progress: the lock holder needs a core to receive its client's next statement and to commit. ", r.Machine.Cores)
	w("The heads of the lock queues table shows the holder itself: besides flushing WAL (`IO:WALSync`), it is found *idle in transaction*, i.e. holding the row while it waits for its client, and at high client counts waiting for an LWLock behind the very waiters it blocks.\n")
	if u, bu := ix.find(expControl, name, bench.ToolPgbench, "update-only", mx, ""), ix.find(expControl, name, bench.ToolPgbench, "begin-update-commit", mx, ""); u != nil && bu != nil {
		u1 := ix.find(expControl, name, bench.ToolPgbench, "update-only", r.Config.Clients[0], "")
		w("3. *Holding the row across a round trip makes it worse.* The single-statement UPDATE (`update-only`, its lock released by its own commit) also falls with clients (%s at %s → %.0f/s at %d; the issue saw 3000/3700/2100/900), but the same UPDATE between BEGIN and COMMIT (`begin-update-commit`), whose lock waits for the client's COMMIT, falls to %.0f/s at %d clients, ",
			rateOrDash(u1), clientsStr(r.Config.Clients[0]), u.Throughput.Median, mx, bu.Throughput.Median, mx)
		w("and the whole reservation, which adds an INSERT (with its KEY SHARE on the hot row) and a savepoint, to %.0f/s (pgbench) and %.0f/s (Go). ", pgOr(ix, name, mx), last.Goodput.Median)
		w("Each client-side round trip inside the lock lengthens the critical section by a scheduling delay on a machine whose cores are busy with waiters. Go and pgbench collapse alike, so the cause is in the transaction's shape and the server, not in the Go client.\n\n")
	} else {
		w("\n")
	}
	if ins, upd := ix.find(expControl, name, bench.ToolPgbench, "insert-only", mx, ""), ix.find(expControl, name, bench.ToolPgbench, "update-only", mx, ""); ins != nil && upd != nil {
		ins1 := ix.find(expControl, name, bench.ToolPgbench, "insert-only", r.Config.Clients[0], "")
		upd1 := ix.find(expControl, name, bench.ToolPgbench, "update-only", r.Config.Clients[0], "")
		if ins1 != nil && upd1 != nil {
			mxact := 0.0
			for k, v := range last.Waits {
				if strings.HasPrefix(k, "LWLock:MultiXact") {
					mxact += v
				}
			}
			w("4. *The foreign key touches the hot row too.* The reservation's INSERT checks its foreign key to the stock row, which takes a KEY SHARE lock on that same row. KEY SHARE does not conflict with the UPDATE's lock, so nobody waits for it, but while an UPDATE of the row is uncommitted every such lock makes PostgreSQL record a new MultiXact listing all the row's current lockers. ")
			w("WAL per success shows it: %.0f bytes at %s, %.0f at %d clients, while neither part alone grows like that (`insert-only` %.0f → %.0f bytes, `update-only` %.0f → %.0f); %.2f backends waited on `LWLock:MultiXact*` at %d clients. ",
				one.WALBytes.Median, clientsStr(one.Cell.Clients), last.WALBytes.Median, mx, ins1.WALBytes.Median, ins.WALBytes.Median, upd1.WALBytes.Median, upd.WALBytes.Median, mxact, mx)
			if st := lw(last, "LWLock:SubtransSLRU"); st > 0.05 {
				w("The savepoint adds a little: the row's locker is a subtransaction, which waiters resolve through pg_subtrans (%.2f on `LWLock:SubtransSLRU`). ", st)
			}
			w("(slotrows' and memquota's schemas leave out exactly this foreign key, for this reason; their comments say so.)\n\n")
		}
	}
	if idle := lw(last, "idle"); idle > 1 {
		w("At %d clients %.1f backends on average were *idle* (between transactions) or *idle in transaction*: waiting for their client, which shares the %d cores; the client is part of the critical section whenever it holds the row.\n\n", mx, idle, r.Machine.Cores)
	}
	w("So the collapse is not a lack of connections (max_connections is %s; at most %d were used) but the cost of many backends queued on one row on %d cores. ", r.Machine.Settings["max_connections"], last.MaxConns, r.Machine.Cores)
	w("The remedy is to keep fewer transactions on the row at once: section 6.\n\n")
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
	w("The same closed loop, through `admission.Wrap(node, Limits{InFlight: k, ...})` ([`admission`](../admission)): at most k requests touch the database at once and the pool has k connections. ")
	w("k is the client count at which the strategy's own goodput peaked in section 1 (chosen by the command from this run's data; points where k ≥ clients are skipped: the gate would never close). Two policies:\n\n")
	w("- **queue-k**: every request waits its turn (queue as long as the client count, wait up to 10 s): nobody is refused, and latency includes the wait in the gate.\n")
	w("- **shed-k**: queue of k, wait at most 50 ms; a refused request is answered at once (a 503 with Retry-After), and the client sends the same request again after its Retry-After of 10 ms. Each send is timed on its own; refusals have their own histogram.\n\n")
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
	w("\nThe baseline rows (*none*) are section 1's trials, measured in the same run before this phase.\n\n")
	embed(b, perf, plots, "admission.png")
	w("What it does: with k in flight, the lock queue on a hot row is at most k−1 long, so a commit wakes at most k−1 waiters and the cores go to the transaction holding the row; the other clients wait in the gate, a goroutine on a channel, which costs nothing on the server. ")
	w("For a strategy whose goodput falls with clients the curve stays near its peak instead; for one whose goodput grows with clients (no hot row) a small k only caps it. ")
	w("Queueing moves the wait from the database into the gate: latency of a success still grows with the number of clients (Little's law: clients ÷ goodput), but it is no longer multiplied by a collapsing goodput. ")
	w("Shedding bounds the wait instead and answers the overflow at once, before the database, with a Retry-After.\n\n")
}

func (r *results) caveats(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## Caveats\n\n")
	w("- **Two noisy cores, shared by client and server.** The Go client, pgbench and every backend compete for the same %d cores; at high client counts the client's own scheduling is part of every latency (backends *idle* in the wait tables are waiting for their client). Absolute numbers are this machine's; compare strategies and shapes, not figures across machines. The confidence intervals cover trial-to-trial noise of this run, not a different machine.\n", r.Machine.Cores)
	w("- **Short windows.** %v per trial keeps the full sweep under 15 minutes; tails longer than the window cannot be observed (section 1), and effects that build up over minutes (table and index growth, autovacuum, checkpoints) are only sampled. WAL bytes are server-wide and include whatever else wrote WAL in the window (autovacuum; full-page images after a checkpoint).\n", r.Config.Duration)
	w("- **One SKU.** Every request asks for the same SKU: the worst case for strategies with a hot row, the common case of a flash sale. Spreading requests over many SKUs would remove most of the contention measured here.\n")
	w("- **pgbench replays the HELD path only**, with keys computed as integers, and for `memquota` only the database part. Ratios near 1 say the Go code adds little to the SQL; ratios above 1 at high client counts mean pgbench's own single process (2 threads for all clients) was the slower client there.\n")
	w("- **The load generator shares the cores too.** In the open loop, a request is *late* when its worker wakes more than 1 ms after the planned time; on 2 busy cores timer wake-ups themselves lag, so some lateness appears even well below capacity. It is counted, as it should be: a real client on a loaded host is late too.\n")
	w("- `memquota` and `memquota-recover` run the same reserve path (they differ only on restart): their difference is a measure of the noise.\n")
	w("- The open loop's rates come from the closed loop of the same run; a strategy whose closed-loop goodput at %d clients was itself depressed gets proportionally low rates.\n\n", r.Config.OpenClients)
}

func (r *results) reproduce(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## Reproduce and compare\n\n")
	w("```sh\nmake bench         # this report: the full sweep (about %s here)\nmake bench-quick   # a quick look (under 3 minutes), same outputs\n", fmtDur(r.Elapsed))
	w("go test -run '^$' -bench . ./bench   # testing.B: BenchmarkReserve/strategy=X/clients=N for every registered strategy\n")
	w("benchstat -col /strategy docs/perf/results.txt                  # strategies side by side\n")
	w("benchstat -filter '/tool:go' old/results.txt docs/perf/results.txt   # two runs\n```\n")
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
