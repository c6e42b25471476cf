package main

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/reservebench/reservebench/bench"
)

// httpPair is what one round's HTTP trial measured against the library
// trial it ran back to back with.
type httpPair struct {
	ratio              float64 // goodput, HTTP / library
	dP50, dP99         float64 // latency of successes, HTTP − library, ms
	libCPU, httpCPU    float64 // client CPU per success, µs (the HTTP trial's includes the server: one process)
	hasCPU, hasLatency bool
}

// httpPoint is one point of the HTTP experiment: a strategy at a client
// count (closed loop) or a load (open loop), its pairs summarized.
type httpPoint struct {
	Strategy string
	Exp      string  // expClosed or expOpen
	Clients  int     // closed loop
	Load     float64 // open loop
	Lib, Web *summary
	Ratio    bench.Summary
	DP50     bench.Summary
	DP99     bench.Summary
	DCPU     bench.Summary // HTTP − library µs per success
	Pairs    int
}

// httpPoints pairs every HTTP trial with the library (Go) trial of the
// same point and round, in the closed and the open loop.
func (r *results) httpPoints(ix index) []httpPoint {
	type key struct {
		exp, strat string
		clients    int
		load       float64
	}
	type trials struct{ lib, web map[int]*record }
	by := map[key]*trials{}
	var keys []key
	for _, rc := range r.Trials {
		c := rc.Cell
		if (c.Exp != expClosed && c.Exp != expOpen) || (c.Tool != bench.ToolGo && c.Tool != bench.ToolHTTP) {
			continue
		}
		k := key{c.Exp, c.Strategy, c.Clients, c.Load}
		t := by[k]
		if t == nil {
			t = &trials{lib: map[int]*record{}, web: map[int]*record{}}
			by[k] = t
			keys = append(keys, k)
		}
		if c.Tool == bench.ToolGo {
			t.lib[rc.Round] = rc
		} else {
			t.web[rc.Round] = rc
		}
	}
	var out []httpPoint
	for _, k := range keys {
		t := by[k]
		if len(t.web) == 0 {
			continue
		}
		var ratio, d50, d99, dcpu []float64
		for round, w := range t.web {
			l, ok := t.lib[round]
			if !ok {
				continue
			}
			p := pairOf(l.Trial.Run, w.Trial.Run)
			if l.Trial.Run.Goodput > 0 {
				ratio = append(ratio, p.ratio)
			}
			if p.hasLatency {
				d50, d99 = append(d50, p.dP50), append(d99, p.dP99)
			}
			if p.hasCPU {
				dcpu = append(dcpu, p.httpCPU-p.libCPU)
			}
		}
		if len(ratio) == 0 {
			continue
		}
		for _, xs := range [][]float64{ratio, d50, d99, dcpu} {
			sort.Float64s(xs)
		}
		pt := httpPoint{Strategy: k.strat, Exp: k.exp, Clients: k.clients, Load: k.load, Pairs: len(ratio),
			Ratio: bench.Summarize(ratio), DP50: bench.Summarize(d50), DP99: bench.Summarize(d99), DCPU: bench.Summarize(dcpu)}
		for _, s := range ix.filter(func(c cell) bool {
			return c.Exp == k.exp && c.Strategy == k.strat && c.Clients == k.clients && c.Load == k.load
		}) {
			switch s.Cell.Tool {
			case bench.ToolGo:
				pt.Lib = s
			case bench.ToolHTTP:
				pt.Web = s
			}
		}
		out = append(out, pt)
	}
	order := map[string]int{}
	for i, name := range r.strategies() {
		order[name] = i
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Strategy != b.Strategy {
			return order[a.Strategy] < order[b.Strategy]
		}
		if a.Exp != b.Exp {
			return a.Exp == expClosed
		}
		if a.Clients != b.Clients {
			return a.Clients < b.Clients
		}
		return a.Load < b.Load
	})
	return out
}

func pairOf(lib, web *bench.Run) httpPair {
	var p httpPair
	if lib.Goodput > 0 {
		p.ratio = web.Goodput / lib.Goodput
	}
	if lib.HeldLatency.N > 0 && web.HeldLatency.N > 0 {
		p.hasLatency = true
		p.dP50 = web.HeldLatency.P50 - lib.HeldLatency.P50
		p.dP99 = web.HeldLatency.P99 - lib.HeldLatency.P99
	}
	if lib.Held > 0 && web.Held > 0 && lib.CPU.Client > 0 && web.CPU.Client > 0 {
		p.hasCPU = true
		p.libCPU = 1e6 * lib.CPU.Client / float64(lib.Held)
		p.httpCPU = 1e6 * web.CPU.Client / float64(web.Held)
	}
	return p
}

// httpSection writes what the HTTP front costs: each HTTP trial against
// the library trial it ran back to back with.
func (r *results) httpSection(b *strings.Builder, ix index) {
	pts := r.httpPoints(ix)
	if len(pts) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## 11. What the HTTP front costs\n\n")
	w("The same load through `reservebench serve`'s HTTP API instead of the library: package `service`'s handler and its admission gate over the strategy's node, on a loopback TCP socket of this machine, the load generator's clients sending `POST /reserve` through a keep-alive pool with a connection per client, connected before the window (%s). ", see("the-http-front", "how"))
	w("The gate has a slot for every request that can be in flight, so it never refuses nor queues: what differs from the library is the HTTP layer alone (encoding, the socket both ways, the server's goroutine per connection, decoding the answer). ")
	w("Each HTTP trial ran back to back with the library (Go) trial of the same point and round, alternating which went first; every row is paired per round: goodput HTTP/library, and HTTP − library for the latency of successes and for the process's CPU per success (client and server in one process for HTTP; the library's client alone), median [95%% CI of the mean].\n\n")
	w("| strategy | loop | library goodput /s | HTTP goodput /s | HTTP/library | p50 ms library → HTTP | added p50 ms | added p99 ms | CPU µs/success library → HTTP | added CPU µs | pairs |\n")
	w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range pts {
		loop := clientsStr(p.Clients)
		if p.Exp == expOpen {
			loop = fmt.Sprintf("open, load %.2f", p.Load)
		}
		libG, webG, lat, cpu := "–", "–", "–", "–"
		if p.Lib != nil && p.Web != nil {
			libG, webG = fmtCI(p.Lib.Goodput), fmtCI(p.Web.Goodput)
			lat = ms(p.Lib.Held.P50) + " → " + ms(p.Web.Held.P50)
			if p.Lib.ClientCPU.N > 0 && p.Web.ClientCPU.N > 0 {
				cpu = fmt.Sprintf("%.0f → %.0f", p.Lib.ClientCPU.Median, p.Web.ClientCPU.Median)
			}
		}
		w("| `%s` | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d |\n", p.Strategy, loop, libG, webG, fmtRatio(p.Ratio), lat,
			fmtDelta(p.DP50, "%.3f"), fmtDelta(p.DP99, "%.2f"), cpu, fmtDelta(p.DCPU, "%.0f"), p.Pairs)
	}
	w("\n")
	for _, line := range r.httpFindings(pts) {
		w("- %s\n", line)
	}
	w("\n")
}

// httpFindings states, per closed-loop client count, the range of the
// median ratios and of the added p50 over the strategies, and which
// strategies lost the most.
func (r *results) httpFindings(pts []httpPoint) []string {
	var out []string
	byClients := map[int][]httpPoint{}
	var counts []int
	for _, p := range pts {
		if p.Exp != expClosed {
			continue
		}
		if len(byClients[p.Clients]) == 0 {
			counts = append(counts, p.Clients)
		}
		byClients[p.Clients] = append(byClients[p.Clients], p)
	}
	sort.Ints(counts)
	for _, c := range counts {
		ps := byClients[c]
		lo, hi := math.Inf(1), math.Inf(-1)
		dlo, dhi := math.Inf(1), math.Inf(-1)
		clo, chi := math.Inf(1), math.Inf(-1)
		worst := ps[0]
		for _, p := range ps {
			lo, hi = math.Min(lo, p.Ratio.Median), math.Max(hi, p.Ratio.Median)
			if p.Ratio.Median < worst.Ratio.Median {
				worst = p
			}
			if p.DP50.N > 0 {
				dlo, dhi = math.Min(dlo, p.DP50.Median), math.Max(dhi, p.DP50.Median)
			}
			if p.DCPU.N > 0 {
				clo, chi = math.Min(clo, p.DCPU.Median), math.Max(chi, p.DCPU.Median)
			}
		}
		line := fmt.Sprintf("At %s, through HTTP: goodput %.2f–%.2f of the library's over %d strategies (least: `%s`, %.2f)", clientsStr(c), lo, hi, len(ps), worst.Strategy, worst.Ratio.Median)
		if !math.IsInf(dlo, 0) {
			line += fmt.Sprintf("; p50 of a success %+.3f to %+.3f ms", dlo, dhi)
		}
		if !math.IsInf(clo, 0) {
			line += fmt.Sprintf("; %+.0f to %+.0f µs of CPU per success", clo, chi)
		}
		out = append(out, line+".")
	}
	var below []string
	for _, p := range pts {
		if p.Exp == expClosed && p.Ratio.N > 1 && p.Ratio.Hi < 1 {
			below = append(below, fmt.Sprintf("`%s` at %d", p.Strategy, p.Clients))
		}
	}
	if len(below) > 0 {
		out = append(out, fmt.Sprintf("The whole interval of the ratio lies below 1 (HTTP costs goodput beyond this run's noise) for: %s.", strings.Join(below, ", ")))
	}
	return out
}

// fmtDelta writes a paired difference, median [95% CI], with a sign.
func fmtDelta(s bench.Summary, f string) string {
	if s.N == 0 || math.IsNaN(s.Median) {
		return "–"
	}
	if s.N == 1 {
		return fmt.Sprintf("%+"+f[1:], s.Median)
	}
	return fmt.Sprintf("%+"+f[1:]+" ["+f+", "+f+"]", s.Median, s.Lo, s.Hi)
}

// standInsText says which strategies ran in the closed loop only, and
// which strategy stands for each in the other experiments (config.StandIns).
func (r *results) standInsText() string {
	var parts []string
	for _, si := range r.Config.StandIns {
		if containsStr(r.Config.Strategies, si.Strategy) && containsStr(r.Config.Strategies, si.For) {
			parts = append(parts, fmt.Sprintf("`%s` for `%s` (%s)", si.Strategy, si.For, si.Why))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return fmt.Sprintf("To fit %d strategies into the sweep's time, %d of them ran in the closed loop with the Go client only (section 1, the headline and section 2); in every other experiment (pgbench, control scripts, sells-out, many SKUs, open loop, admission, profiles, HTTP) a strategy with the same SQL stands for each: %s.",
		len(r.Config.Strategies), len(parts), strings.Join(parts, "; "))
}
