package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/reservebench/reservebench/admission"
	"github.com/reservebench/reservebench/bench"
	"github.com/reservebench/reservebench/strategy"
)

// Experiments of the sweep. Each trial belongs to one.
const (
	expClosed    = "closed"      // closed loop, stock that never sells out, Go and pgbench side by side
	expControl   = "control"     // pgbench control scripts (parts of a reservation), same clients
	expSellsOut  = "sellsout"    // closed loop, stock that sells out early in the window (Go)
	expOpen      = "open"        // open loop, Poisson arrivals at fractions of the closed-loop peak (Go, and pgbench --rate)
	expAdmission = "admission"   // closed loop through admission.Gate (Go)
	expSKUs      = "skus"        // closed loop over many SKUs with Zipf popularity (Go)
	expProfile   = "profile"     // one closed-loop Go trial with a CPU profile of the client
	expTarget    = "target"      // a target's two points, back to back (targets.go)
	expPeak      = "target-peak" // a target's sides at client counts between the sweep's, where a peak may lie
	// expHTTP is not an experiment of its own cells: it adds an HTTP trial
	// (bench.ToolHTTP) beside the Go trial of closed-loop points (Exp
	// closed) and open-loop points (Exp open), run back to back with it in
	// the same round, so that HTTP/library is a paired ratio (http.go).
	expHTTP = "http"
)

// cell is one point of the sweep: everything but the trial number.
type cell struct {
	Exp      string     `json:"experiment"`
	Strategy string     `json:"strategy"`
	Tool     bench.Tool `json:"tool"`
	Script   string     `json:"script,omitempty"` // control script name
	Clients  int        `json:"clients"`
	Stock    string     `json:"stock"`          // "plenty" or "sellsout"
	Load     float64    `json:"load,omitempty"` // open loop: fraction of the closed-loop peak
	Rate     float64    `json:"rate,omitempty"` // open loop: requests per second
	Base     int        `json:"base,omitempty"` // open loop: the closed-loop client count the rate derives from
	Admit    string     `json:"admit,omitempty"`
	SKUs     int        `json:"skus,omitempty"` // > 1: requests over this many SKUs (expSKUs)
	limits   *admission.Limits
	meta     strategy.Meta
}

// name is the benchmark name of the cell, in the key=value form benchstat
// reads: `benchstat -col /strategy results.txt` puts strategies side by side.
func (c cell) name() string {
	parts := []string{"BenchmarkReserve", "strategy=" + c.Strategy, fmt.Sprintf("clients=%d", c.Clients), "stock=" + c.Stock}
	if c.SKUs > 1 {
		parts = append(parts, fmt.Sprintf("skus=%d", c.SKUs))
	}
	if c.Exp == expProfile {
		parts = append(parts, "profile=cpu")
	}
	switch c.Exp {
	case expOpen:
		parts = append(parts, "loop=open", fmt.Sprintf("load=%.2f", c.Load))
	default:
		parts = append(parts, "loop=closed")
	}
	if c.Admit != "" {
		parts = append(parts, "admit="+c.Admit)
	}
	parts = append(parts, "tool="+string(c.Tool))
	if c.Script != "" {
		parts = append(parts, "script="+c.Script)
	}
	return strings.Join(parts, "/")
}

func (c cell) key() string { return c.Exp + "|" + c.name() }

// config is what the flags decide.
type config struct {
	Mode        string   `json:"mode"`
	Strategies  []string `json:"strategies"`
	Clients     []int    `json:"clients"`
	Trials      int      `json:"trials"`       // closed loop with pgbench, and the control scripts
	ExtraTrials int      `json:"extra_trials"` // sells-out, admission, many SKUs
	// FewerTrialsFrom: at this client count and above the closed loop and
	// the control scripts run ExtraTrials, not Trials (0: never). A trial
	// at 128 clients costs about 4 s on 2 cores, most of it connecting.
	FewerTrialsFrom int `json:"fewer_trials_from,omitempty"`
	// PgbenchPartsOnlyFrom: at this client count and above, pgbench runs a
	// strategy's own script only where the strategy also has control
	// scripts, whose section sets the reservation against its parts there
	// (0: always). Every other strategy's fall at that count is measured by
	// the Go client and the sampled states of its backends; pgbench would
	// add a point where connecting its clients costs more than the window.
	PgbenchPartsOnlyFrom int           `json:"pgbench_parts_only_from,omitempty"`
	Duration             time.Duration `json:"duration_ns"`
	Experiments          []string      `json:"experiments"`
	StockPlenty          int           `json:"stock_plenty"`
	StockSellsOut        int           `json:"stock_sellsout"`
	SellsOutClients      []int         `json:"sellsout_clients"`
	// The open loop: Go's pool and pgbench's -c (OpenClients), the cap on
	// Go's requests in flight, the loads (fractions of the strategy's
	// closed-loop peak) and trials per load.
	OpenClients     int           `json:"open_clients"`
	OpenMaxInFlight int           `json:"open_max_in_flight"`
	OpenLoads       []float64     `json:"open_loads"`
	OpenTrials      int           `json:"open_trials"`
	LateLimit       time.Duration `json:"late_limit_ns"`
	AdmitClients    []int         `json:"admission_clients"`
	ShedClients     []int         `json:"shed_clients"`
	// Many SKUs: how many, the Zipf exponent of their popularity, and the
	// client counts.
	ManySKUs    int     `json:"many_skus"`
	Zipf        float64 `json:"zipf"`
	ManyClients []int   `json:"many_clients"`
	// ProfileClients: client counts at which one Go trial per strategy with
	// a pgbench script runs under the CPU profiler.
	ProfileClients []int         `json:"profile_clients"`
	ProfileWindow  time.Duration `json:"profile_window_ns"` // a profiled trial's window: longer, for more samples
	Targets        []target      `json:"targets,omitempty"`
	// HTTPClients and HTTPLoads are the closed-loop client counts and the
	// open-loop loads at which an HTTP trial runs beside the Go one.
	HTTPClients []int     `json:"http_clients,omitempty"`
	HTTPLoads   []float64 `json:"http_loads,omitempty"`
	// StandIns run in the closed loop with the Go client only; for every
	// other experiment (pgbench, sells-out, many SKUs, open loop,
	// admission, profiles, HTTP) the strategy they name stands for them.
	StandIns []standIn `json:"stand_ins,omitempty"`

	TargetPairs int `json:"target_pairs"` // back-to-back pairs per target (phase 4)
	// TargetPeakClients are client counts at which a target's sides that
	// are taken at their peak also run (phase 3b): a hot row peaks at 1
	// or 2 clients, between the sweep's 1 and 8.
	TargetPeakClients []int         `json:"target_peak_clients,omitempty"`
	SampleEvery       time.Duration `json:"sample_every_ns"`
	Seed              uint64        `json:"seed"`
}

// pgbenchAt reports whether the closed loop runs a strategy's own pgbench
// script at this client count (PgbenchPartsOnlyFrom).
func (c config) pgbenchAt(clients int, dep caps) bool {
	return c.PgbenchPartsOnlyFrom <= 0 || clients < c.PgbenchPartsOnlyFrom || len(dep.controls) > 0
}

// standIn says that one strategy's measurements beyond the closed loop are
// taken as another's, and why that is fair.
type standIn struct {
	Strategy string `json:"strategy"`
	For      string `json:"stands_for"` // Strategy stands for For
	Why      string `json:"why"`
}

// standIn reports the strategy that stands for name, if any.
func (c config) standInFor(name string) (string, bool) {
	for _, si := range c.StandIns {
		if si.For == name && containsStr(c.Strategies, si.Strategy) {
			return si.Strategy, true
		}
	}
	return "", false
}

func (c config) has(exp string) bool {
	for _, e := range c.Experiments {
		if e == exp {
			return true
		}
	}
	return false
}

// sweep runs the experiments and collects every trial.
type sweep struct {
	cfg      config
	env      *bench.Env
	metas    []strategy.Meta
	log      func(format string, args ...any)
	progress time.Duration
	trials   []*record
	rng      *rand.Rand
	started  time.Time
	planned  int
	done     int
	caps     map[string]caps
	// profileDir receives the raw CPU profiles (not committed); "": none.
	profileDir string
}

// record is one trial with its cell.
type record struct {
	Cell  cell         `json:"cell"`
	Round int          `json:"round"`
	Trial *bench.Trial `json:"trial"`
	// Profile summarizes the client's CPU profile (expProfile).
	Profile *clientProfile `json:"profile,omitempty"`
	// Reruns counts the trials of this point and round thrown away before
	// this one (rerunnable: pgbench aborted on an error it cannot retry).
	Reruns int `json:"reruns,omitempty"`
}

// rerunnable reports whether a failed trial is run again rather than
// ending the sweep: pgbench retries only 40001 and 40P01 and aborts the
// client on anything else, and PostgreSQL 15 can fail an UPDATE of a row
// that many transactions lock at once with the internal error "new
// multixact has more than one updating member" (XX000), which hotrow's Go
// client retries (hotrow/reserve.go) and pgbench cannot. A trial that met
// it is incomplete; it is run again, at most maxReruns times, and the
// report says where.
func rerunnable(err error) bool {
	return err != nil && strings.Contains(err.Error(), "new multixact has more than one updating member")
}

const maxReruns = 2

// run executes phase by phase. Within a phase, every round runs each cell
// once, in an order shuffled per round, and Go and pgbench trials of one
// point run back to back, alternating which goes first: slow drift of the
// machine (autovacuum, checkpoints, a neighbour) spreads over all cells
// instead of landing on one.
func (s *sweep) run(ctx context.Context) error {
	s.started = time.Now()
	// Phase 1: the closed loop with and without pgbench, controls, sells-out.
	var phase1 [][]cell // groups run back to back
	for _, m := range s.metas {
		dep := s.probeCaps(m)
		_, stood := s.cfg.standInFor(m.Name)
		for _, c := range s.cfg.Clients {
			if s.cfg.has(expClosed) {
				g := []cell{{Exp: expClosed, Strategy: m.Name, Tool: bench.ToolGo, Clients: c, Stock: "plenty", meta: m}}
				if dep.pgbench && !stood && s.cfg.pgbenchAt(c, dep) {
					g = append(g, cell{Exp: expClosed, Strategy: m.Name, Tool: bench.ToolPgbench, Clients: c, Stock: "plenty", meta: m})
				}
				if s.cfg.has(expHTTP) && !stood && slices.Contains(s.cfg.HTTPClients, c) {
					g = append(g, cell{Exp: expClosed, Strategy: m.Name, Tool: bench.ToolHTTP, Clients: c, Stock: "plenty", meta: m})
				}
				phase1 = append(phase1, g)
			}
			if stood {
				continue // the closed loop's Go client only
			}
			if s.cfg.has(expControl) {
				for _, name := range dep.controls {
					phase1 = append(phase1, []cell{{Exp: expControl, Strategy: m.Name, Tool: bench.ToolPgbench, Script: name, Clients: c, Stock: "plenty", meta: m}})
				}
			}
			if s.cfg.has(expSellsOut) && slices.Contains(s.cfg.SellsOutClients, c) {
				phase1 = append(phase1, []cell{{Exp: expSellsOut, Strategy: m.Name, Tool: bench.ToolGo, Clients: c, Stock: "sellsout", meta: m}})
			}
		}
		if s.cfg.has(expSKUs) && s.cfg.ManySKUs > 1 && !stood {
			for _, c := range s.cfg.ManyClients {
				phase1 = append(phase1, []cell{{Exp: expSKUs, Strategy: m.Name, Tool: bench.ToolGo, Clients: c, Stock: "plenty", SKUs: s.cfg.ManySKUs, meta: m}})
			}
		}
	}
	for _, g := range phase1 {
		for _, c := range g {
			s.planned += s.trialsOf(c)
		}
	}
	if s.cfg.has(expOpen) {
		for _, m := range s.measured() { // an estimate until phase 2
			n := 1
			if s.probeCaps(m).pgbench {
				n = 2
			}
			s.planned += s.cfg.OpenTrials * len(s.cfg.OpenLoads) * n
			if s.cfg.has(expHTTP) {
				for _, f := range s.cfg.OpenLoads {
					if slices.Contains(s.cfg.HTTPLoads, f) {
						s.planned += s.cfg.OpenTrials
					}
				}
			}
		}
	}
	if s.cfg.has(expAdmission) {
		s.planned += s.cfg.ExtraTrials * len(s.measured()) * (len(s.cfg.AdmitClients) + len(s.cfg.ShedClients))
	}
	if s.cfg.has(expTarget) {
		for _, t := range s.cfg.Targets {
			if containsStr(s.cfg.Strategies, t.Strategy) && containsStr(s.cfg.Strategies, t.Against) {
				s.planned += 2 * s.cfg.TargetPairs
			}
		}
		s.planned += s.cfg.Trials * countCells(s.peakCells())
	}
	if s.cfg.has(expProfile) {
		for _, m := range s.measured() {
			if s.probeCaps(m).pgbench {
				s.planned += len(s.cfg.ProfileClients)
			}
		}
	}
	s.log("planned: about %d trials (%v each with the setup around it: about %v)", s.planned, perTrial, (time.Duration(s.planned) * perTrial).Round(time.Minute))
	if err := s.rounds(ctx, "phase 1 (closed loop, pgbench, HTTP, controls, sells-out, many SKUs)", phase1); err != nil {
		return err
	}

	// Phase 2: the open loop, at fractions of each strategy's closed-loop
	// peak (the median Go goodput of its best client count, measured in
	// phase 1), Go and pgbench --rate at the same rate back to back.
	if s.cfg.has(expOpen) {
		var phase2 [][]cell
		for _, m := range s.measured() {
			base := s.peakClients(m.Name)
			_, peak := s.closedGoodput(m.Name, base)
			if peak <= 0 {
				s.log("open loop: no closed-loop goodput for %s; skipped", m.Name)
				continue
			}
			for _, f := range s.cfg.OpenLoads {
				g := []cell{{Exp: expOpen, Strategy: m.Name, Tool: bench.ToolGo, Clients: s.cfg.OpenClients,
					Stock: "plenty", Load: f, Rate: roundRate(f * peak), Base: base, meta: m}}
				if s.probeCaps(m).pgbench {
					pg := g[0]
					pg.Tool = bench.ToolPgbench
					g = append(g, pg)
				}
				if s.cfg.has(expHTTP) && slices.Contains(s.cfg.HTTPLoads, f) {
					h := g[0]
					h.Tool = bench.ToolHTTP
					g = append(g, h)
				}
				phase2 = append(phase2, g)
			}
		}
		if err := s.rounds(ctx, "phase 2 (open loop)", phase2); err != nil {
			return err
		}
	}

	// Phase 3: bounded admission with k in flight, k the client count at
	// which the strategy's closed-loop goodput peaked in phase 1.
	if s.cfg.has(expAdmission) {
		var phase3 [][]cell
		for _, m := range s.measured() {
			k := s.peakClients(m.Name)
			if k == 0 {
				continue
			}
			for _, c := range s.cfg.AdmitClients {
				if k >= c {
					continue // the gate would never close
				}
				l := admission.Limits{InFlight: k, Queue: c, Wait: 10 * time.Second, RetryAfter: 10 * time.Millisecond}
				phase3 = append(phase3, []cell{{Exp: expAdmission, Strategy: m.Name, Tool: bench.ToolGo, Clients: c, Stock: "plenty",
					Admit: fmt.Sprintf("queue-k%d", k), limits: &l, meta: m}})
			}
			for _, c := range s.cfg.ShedClients {
				if k >= c {
					continue
				}
				l := admission.Limits{InFlight: k, Queue: k, Wait: 50 * time.Millisecond, RetryAfter: 10 * time.Millisecond}
				phase3 = append(phase3, []cell{{Exp: expAdmission, Strategy: m.Name, Tool: bench.ToolGo, Clients: c, Stock: "plenty",
					Admit: fmt.Sprintf("shed-k%d", k), limits: &l, meta: m}})
			}
		}
		if err := s.rounds(ctx, "phase 3 (admission)", phase3); err != nil {
			return err
		}
	}

	// Phase 4: each target's two points, at the client counts phase 1
	// chose, run back to back TargetPairs times (alternating which goes
	// first): the machine's disk and neighbours drift minute to minute,
	// and a ratio of two trials seconds apart cancels most of it.
	// Phase 3b: the sides of the targets taken at their peak, at the
	// client counts between the sweep's where that peak may lie; phase 4
	// then pairs each side at its best count of phases 1 and 3b.
	if s.cfg.has(expTarget) {
		if err := s.rounds(ctx, "phase 3b (targets: client counts between the sweep's)", s.peakCells()); err != nil {
			return err
		}
	}
	if s.cfg.has(expTarget) && s.cfg.TargetPairs > 0 {
		var phase [][]cell
		for _, t := range s.cfg.Targets {
			num, den, ok := s.targetCells(t)
			if !ok {
				s.log("target %q: its points did not run; skipped", t.What)
				continue
			}
			phase = append(phase, []cell{num, den})
		}
		if err := s.rounds(ctx, "phase 4 (targets, back to back)", phase); err != nil {
			return err
		}
	}

	// Phase 5: where the Go client's time goes, one profiled trial per
	// point (a profile of the whole process: the client is all it runs).
	if s.cfg.has(expProfile) {
		var phase4 [][]cell
		for _, m := range s.measured() {
			if !s.probeCaps(m).pgbench {
				continue
			}
			for _, c := range s.cfg.ProfileClients {
				phase4 = append(phase4, []cell{{Exp: expProfile, Strategy: m.Name, Tool: bench.ToolGo, Clients: c, Stock: "plenty", meta: m}})
			}
		}
		if err := s.rounds(ctx, "phase 5 (client CPU profiles)", phase4); err != nil {
			return err
		}
	}
	return nil
}

// perTrial is what a one-second trial costs with the setup around it
// (fresh deployment, counters, quiet waits), for the planned duration only:
// 1.32 s by -quick on the 2-core machine of 2026-12-01, 1.85 s by the full
// sweep on the slower one of 2026-12-03 and 1.78 s on 2026-12-04 (more of
// its trials are at 32 and 128 clients, where connecting costs most).
const perTrial = 1780 * time.Millisecond

// measured are the strategies of the experiments beyond the closed loop:
// all but the stand-ins' (config.StandIns).
func (s *sweep) measured() []strategy.Meta {
	var out []strategy.Meta
	for _, m := range s.metas {
		if _, stood := s.cfg.standInFor(m.Name); !stood {
			out = append(out, m)
		}
	}
	return out
}

func countCells(groups [][]cell) int {
	n := 0
	for _, g := range groups {
		n += len(g)
	}
	return n
}

func roundRate(r float64) float64 {
	if r < 10 {
		return 10
	}
	return float64(int(r/10+0.5) * 10)
}

// targetCells are a target's two points for phase 4: the numerator's Go
// reservation and the denominator's (pgbench control script, or Go
// reservation), each at the client count phase 1 chose for it.
func (s *sweep) targetCells(t target) (num, den cell, ok bool) {
	num, den, ok = s.sides(t)
	if !ok {
		return cell{}, cell{}, false
	}
	recs := s.trials
	nc := pickClients(recs, func(r *record) bool { return t.numSide(r.Cell, expClosed) || t.numSide(r.Cell, expPeak) }, t.Clients)
	dc := pickClients(recs, func(r *record) bool { return t.denSide(r.Cell, expClosed) || t.denSide(r.Cell, expPeak) }, t.AgainstClients)
	if nc == 0 || dc == 0 {
		return cell{}, cell{}, false
	}
	num.Clients, den.Clients = nc, dc
	return num, den, true
}

// sides are a target's two cells for phase 4, without their client
// counts: the numerator's Go reservation (or control script) and the
// denominator's pgbench control script or Go reservation.
func (s *sweep) sides(t target) (num, den cell, ok bool) {
	var nm, dm strategy.Meta
	for _, m := range s.metas {
		if m.Name == t.Strategy {
			nm = m
		}
		if m.Name == t.Against {
			dm = m
		}
	}
	if nm.Name == "" || dm.Name == "" {
		return cell{}, cell{}, false
	}
	num = cell{Exp: expTarget, Strategy: t.Strategy, Tool: bench.ToolGo, Stock: "plenty", meta: nm}
	den = cell{Exp: expTarget, Strategy: t.Against, Tool: bench.ToolGo, Stock: "plenty", meta: dm}
	if t.Script != "" {
		den.Tool, den.Script = bench.ToolPgbench, t.Script
	}
	if t.NumScript != "" {
		num.Tool, num.Script = bench.ToolPgbench, t.NumScript
	}
	if t.NumPgbench {
		num.Tool = bench.ToolPgbench
	}
	return num, den, true
}

// peakCells are phase 3b's points: each side of a target taken at its
// peak (Clients or AgainstClients 0), at every TargetPeakClients count
// the sweep's Clients lack, the two sides of one count in one group.
func (s *sweep) peakCells() [][]cell {
	var out [][]cell
	seen := map[string]bool{}
	for _, t := range s.cfg.Targets {
		num, den, ok := s.sides(t)
		if !ok {
			continue
		}
		for _, c := range s.cfg.TargetPeakClients {
			if slices.Contains(s.cfg.Clients, c) {
				continue
			}
			var g []cell
			for _, side := range []struct {
				c    cell
				peak bool
			}{{num, t.Clients == 0}, {den, t.AgainstClients == 0}} {
				x := side.c
				x.Exp, x.Clients = expPeak, c
				if x.Script != "" && !slices.Contains(s.probeCaps(x.meta).controls, x.Script) ||
					x.Tool == bench.ToolPgbench && x.Script == "" && !s.probeCaps(x.meta).pgbench {
					continue // no such script (or no pgbench): the target is not measured
				}
				key := fmt.Sprintf("%s/%s/%s/%d", x.Strategy, x.Tool, x.Script, c)
				if side.peak && !seen[key] {
					seen[key] = true
					g = append(g, x)
				}
			}
			if len(g) > 0 {
				out = append(out, g)
			}
		}
	}
	return out
}

func (s *sweep) trialsOf(c cell) int {
	switch c.Exp {
	case expTarget:
		return s.cfg.TargetPairs
	case expPeak:
		return s.cfg.Trials
	case expClosed, expControl:
		// Controls pair with the reservation round by round, so both take
		// the same count.
		if s.cfg.FewerTrialsFrom > 0 && c.Clients >= s.cfg.FewerTrialsFrom {
			return s.cfg.ExtraTrials
		}
		return s.cfg.Trials
	case expOpen:
		return s.cfg.OpenTrials
	case expProfile:
		return 1
	}
	return s.cfg.ExtraTrials
}

func (s *sweep) rounds(ctx context.Context, title string, groups [][]cell) error {
	if len(groups) == 0 {
		return nil
	}
	most := 0
	for _, g := range groups {
		for _, c := range g {
			most = max(most, s.trialsOf(c))
		}
	}
	s.log("%s: %d points, up to %d trials each", title, countCells(groups), most)
	for round := 1; round <= most; round++ {
		var order [][]cell
		for _, g := range groups {
			var keep []cell
			for _, c := range g {
				if round <= s.trialsOf(c) {
					keep = append(keep, c)
				}
			}
			if len(keep) > 0 {
				order = append(order, keep)
			}
		}
		s.rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, g := range order {
			g = append([]cell(nil), g...)
			if round%2 == 0 {
				for i, j := 0, len(g)-1; i < j; i, j = i+1, j-1 {
					g[i], g[j] = g[j], g[i]
				}
			}
			for _, c := range g {
				if err := s.one(ctx, c, round); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (s *sweep) one(ctx context.Context, c cell, round int) error {
	stock := s.cfg.StockPlenty
	if c.Exp == expProfile { // a longer window: as many units per second
		stock = int(float64(stock) * max(s.cfg.ProfileWindow, s.cfg.Duration).Seconds() / s.cfg.Duration.Seconds())
	}
	if c.Stock == "sellsout" {
		stock = s.cfg.StockSellsOut
	}
	prefix := fmt.Sprintf("%s %s c=%d", c.Strategy, c.Tool, c.Clients)
	if c.Script != "" {
		prefix += " script=" + c.Script
	}
	if c.Exp == expOpen {
		prefix += fmt.Sprintf(" open %.0f/s", c.Rate)
	}
	if c.Admit != "" {
		prefix += " admit=" + c.Admit
	}
	if c.Stock == "sellsout" {
		prefix += " sells-out"
	}
	if c.SKUs > 1 {
		prefix += fmt.Sprintf(" over %d SKUs", c.SKUs)
	}
	spec := bench.Spec{
		Meta: c.meta, Tool: c.Tool, Control: c.Script, Clients: c.Clients, Duration: s.cfg.Duration,
		Stock: stock, SKUs: c.SKUs, Zipf: s.cfg.Zipf,
		Rate: c.Rate, LateLimit: s.cfg.LateLimit, MaxInFlight: s.cfg.OpenMaxInFlight, Admission: c.limits,
		SampleEvery: s.cfg.SampleEvery, Seed: s.cfg.Seed + uint64(round),
		Progress:      func(line string) { s.log("  %s %s", prefix, line) },
		ProgressEvery: s.progress,
	}
	var prof bytes.Buffer
	if c.Exp == expProfile {
		prefix += " (CPU profile)"
		spec.CPUProfile = &prof
		spec.SampleEvery = 0 // the sampler's queries would be the client's too
		spec.Duration = max(s.cfg.ProfileWindow, s.cfg.Duration)
	}
	t, err := s.env.RunTrial(ctx, spec)
	reruns := 0
	for ; rerunnable(err) && reruns < maxReruns; reruns++ {
		s.log("%s (round %d): pgbench aborted on PostgreSQL's \"new multixact has more than one updating member\", which it cannot retry: the trial runs again", prefix, round)
		t, err = s.env.RunTrial(ctx, spec)
	}
	if err != nil {
		return fmt.Errorf("%s (round %d): %w", prefix, round, err)
	}
	rec := &record{Cell: c, Round: round, Trial: t, Reruns: reruns}
	if c.Exp == expProfile {
		if rec.Profile, err = summarizeProfile(prof.Bytes(), c.Strategy); err != nil {
			return fmt.Errorf("%s: %w", prefix, err)
		}
		if s.profileDir != "" {
			name := filepath.Join(s.profileDir, fmt.Sprintf("%s-c%d.pprof", c.Strategy, c.Clients))
			if err := os.WriteFile(name, prof.Bytes(), 0o644); err != nil {
				return err
			}
		}
	}
	s.trials = append(s.trials, rec)
	s.done++
	r := t.Run
	line := fmt.Sprintf("[%d/%d %s] %-44s round %d: %8.1f succ/s, lat p50 %.2f p99 %.2f ms",
		s.done, s.planned, time.Since(s.started).Round(time.Second), prefix, round, r.Goodput, r.HeldLatency.P50, r.HeldLatency.P99)
	if r.Refused > 0 {
		line += fmt.Sprintf(", refused %d (p99 %.2f ms)", r.Refused, r.RefusedLatency.P99)
	}
	if r.Shed > 0 {
		line += fmt.Sprintf(", shed %d", r.Shed)
	}
	if r.Errors > 0 {
		line += fmt.Sprintf(", ERRORS %d: %s", r.Errors, r.FirstErr)
	}
	if c.Stock == "plenty" && t.SoldOut {
		line += " (WARNING: the stock sold out)"
	}
	s.log("%s", line)
	return nil
}

// closedGoodput is the median closed-loop Go goodput of a strategy at the
// largest measured client count not above clients, and that count.
func (s *sweep) closedGoodput(strat string, clients int) (int, float64) {
	best := 0
	for _, c := range s.cfg.Clients {
		if c <= clients && c > best {
			best = c
		}
	}
	var xs []float64
	for _, r := range s.trials {
		if r.Cell.Exp == expClosed && r.Cell.Strategy == strat && r.Cell.Tool == bench.ToolGo && r.Cell.Clients == best {
			xs = append(xs, r.Trial.Run.Goodput)
		}
	}
	return best, bench.Summarize(xs).Median
}

// peakClients is the client count with the highest median closed-loop Go
// goodput of a strategy.
func (s *sweep) peakClients(strat string) int {
	byClients := map[int][]float64{}
	for _, r := range s.trials {
		if r.Cell.Exp == expClosed && r.Cell.Strategy == strat && r.Cell.Tool == bench.ToolGo {
			byClients[r.Cell.Clients] = append(byClients[r.Cell.Clients], r.Trial.Run.Goodput)
		}
	}
	keys := make([]int, 0, len(byClients))
	for k := range byClients {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	best, bestV := 0, -1.0
	for _, k := range keys {
		if v := bench.Summarize(byClients[k]).Median; v > bestV {
			best, bestV = k, v
		}
	}
	return best
}

// caps is what a strategy's deployment offers the sweep.
type caps struct {
	pgbench   bool
	leavesOut string // what the pgbench script leaves out (bench.PgbenchPartial)
	controls  []string
}

// probeCaps returns the capabilities learned before the sweep (discoverCaps).
func (s *sweep) probeCaps(m strategy.Meta) caps { return s.caps[m.Name] }

// discoverCaps opens one deployment of each strategy and asks it.
func (s *sweep) discoverCaps(ctx context.Context) error {
	s.caps = map[string]caps{}
	for _, m := range s.metas {
		c, err := s.env.Capabilities(ctx, m)
		if err != nil {
			return err
		}
		s.caps[m.Name] = caps{pgbench: c.Pgbench && s.env.Pgbench != nil, leavesOut: c.LeavesOut, controls: c.Controls}
		if s.env.Pgbench == nil {
			s.caps[m.Name] = caps{}
		}
	}
	return nil
}
