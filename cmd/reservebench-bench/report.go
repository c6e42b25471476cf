package main

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/reservebench/reservebench/admission"
	"github.com/reservebench/reservebench/bench"
)

// summary aggregates the trials of one cell.
type summary struct {
	Cell   cell `json:"cell"`
	Trials int  `json:"trials"`

	Goodput    bench.Summary `json:"goodput"`    // HELD per second
	Throughput bench.Summary `json:"throughput"` // answers per second
	// Per-trial quantiles of HELD latency, summarized over trials.
	P50 bench.Summary `json:"p50_ms"`
	P99 bench.Summary `json:"p99_ms"`
	// Held, Refused, Shed latency read from the merge of every trial's histogram.
	Held    bench.Quantiles `json:"held_merged"`
	Refused bench.Quantiles `json:"refused_merged"`
	Shed    bench.Quantiles `json:"shed_merged"`

	RefusedN, ShedN, Errors, AfterWindow int64

	// Cost per success (medians over trials with a summary).
	WALBytes   bench.Summary `json:"wal_bytes_per_success"`
	WALSyncs   bench.Summary `json:"wal_syncs_per_success"`
	Rows       bench.Summary `json:"rows_per_success"`
	RoundTrips bench.Summary `json:"round_trips_per_success"`
	// Redis is the commands the strategy's Redis ran per success (0 for a
	// strategy without Redis).
	Redis    bench.Summary `json:"redis_commands_per_success"`
	CtxSw    bench.Summary `json:"ctx_switches_per_success"`
	Cores    bench.Summary `json:"cores_busy"`
	MaxConns int           `json:"max_connections"`

	Waits   map[string]float64 `json:"waits"`   // mean backends per label
	Holders map[string]float64 `json:"holders"` // mean lock-queue heads per label

	SoldOutTrials int           `json:"sold_out_trials"` // plenty stock that sold out anyway
	LastHeld      bench.Summary `json:"last_held_s"`     // sells-out: when the last unit went

	// Open loop.
	Lag                                                           bench.Quantiles `json:"lag_merged"`
	Planned, Sent, Skipped, NeverSent, Dropped, Late, Interrupted int64
	MaxInFlight                                                   int64 // the most requests in flight at once, over the trials (Go)

	Gate *admission.Stats `json:"gate,omitempty"` // summed over trials

	// ClientCPU is the client's CPU time per success, µs (bench.CPUUsage.Client).
	ClientCPU bench.Summary `json:"client_cpu_us_per_success"`
	// Retries per success (a deployment that counts them, Go).
	Retries *bench.Summary `json:"retries_per_success,omitempty"`
	// Batches: requests per batch (mean over the trials), and the largest
	// batch of any trial (a deployment that batches, Go).
	BatchMean *bench.Summary `json:"batch_mean,omitempty"`
	BatchMax  int64          `json:"batch_max,omitempty"`
	// Profile is the client's CPU profile (expProfile: one trial).
	Profile *clientProfile `json:"profile,omitempty"`
}

func summarize(recs []*record) []*summary {
	byKey := map[string][]*record{}
	var order []string
	for _, r := range recs {
		k := r.Cell.key()
		if _, ok := byKey[k]; !ok {
			order = append(order, k)
		}
		byKey[k] = append(byKey[k], r)
	}
	out := make([]*summary, 0, len(order))
	for _, k := range order {
		rs := byKey[k]
		s := &summary{Cell: rs[0].Cell, Trials: len(rs), Waits: map[string]float64{}, Holders: map[string]float64{}}
		var good, thr, p50, p99, wal, syncs, rows, rtt, redisCmds, ctx, cores, last, ccpu, retries, batch []float64
		var held, refused, shed, lag []*hdrhistogram.Histogram
		nWaits, nHolders := 0, 0
		for _, r := range rs {
			t := r.Trial
			run := t.Run
			good = append(good, run.Goodput)
			thr = append(thr, run.Throughput)
			if run.HeldLatency.N > 0 {
				p50 = append(p50, run.HeldLatency.P50)
				p99 = append(p99, run.HeldLatency.P99)
			}
			held = append(held, run.HeldHist())
			refused = append(refused, run.RefusedHist())
			shed = append(shed, run.ShedHist())
			lag = append(lag, run.LagHist())
			s.RefusedN += run.Refused
			s.ShedN += run.Shed
			s.Errors += run.Errors
			s.AfterWindow += run.AfterWindow
			if run.HeldTotal > 0 {
				wal = append(wal, t.PerHeld.WALBytes)
				syncs = append(syncs, t.PerHeld.WALSyncs)
				rows = append(rows, t.PerHeld.RowsWritten)
				if t.Tool != bench.ToolPgbench {
					rtt = append(rtt, t.PerHeld.RoundTrips)
					redisCmds = append(redisCmds, t.PerHeld.RedisCommands)
				}
				ctx = append(ctx, float64(run.CPU.CtxSwitches)/float64(run.HeldTotal))
			}
			cores = append(cores, run.CPU.Busy)
			if t.Cost.Connections > s.MaxConns {
				s.MaxConns = t.Cost.Connections
			}
			if t.Waits != nil && t.Waits.Samples > 0 {
				nWaits++
				for k, v := range t.Waits.Backends {
					s.Waits[k] += v
				}
				if t.Waits.HolderSamples > 0 {
					nHolders++
					for k, v := range t.Waits.Holders {
						s.Holders[k] += v
					}
				}
			}
			if t.SoldOut && r.Cell.Stock == "plenty" {
				s.SoldOutTrials++
			}
			last = append(last, run.LastHeld)
			s.Planned += run.Planned
			s.Sent += run.Sent
			s.Skipped += run.Skipped
			s.NeverSent += run.NeverSent
			s.Dropped += run.Dropped
			s.Interrupted += run.Interrupted
			s.Late += run.Late
			s.MaxInFlight = max(s.MaxInFlight, run.MaxInFlight)
			// Go's client CPU covers the window; pgbench's its whole run.
			if n := run.Held; t.Tool == bench.ToolPgbench && run.HeldTotal > 0 {
				ccpu = append(ccpu, 1e6*run.CPU.Client/float64(run.HeldTotal))
			} else if n > 0 && run.CPU.Client > 0 {
				ccpu = append(ccpu, 1e6*run.CPU.Client/float64(n))
			}
			if t.Retries != nil && run.HeldTotal > 0 {
				retries = append(retries, float64(*t.Retries)/float64(run.HeldTotal))
			}
			if t.Batches != nil && t.Batches.Batches > 0 {
				batch = append(batch, float64(t.Batches.Requests)/float64(t.Batches.Batches))
				s.BatchMax = max(s.BatchMax, t.Batches.Largest)
			}
			if r.Profile != nil {
				s.Profile = r.Profile
			}
			if t.Gate != nil {
				if s.Gate == nil {
					s.Gate = &admission.Stats{}
				}
				g := s.Gate
				g.Admitted += t.Gate.Admitted
				g.AdmittedAfterWait += t.Gate.AdmittedAfterWait
				g.RejectedQueueFull += t.Gate.RejectedQueueFull
				g.RejectedTimeout += t.Gate.RejectedTimeout
				g.RejectedCanceled += t.Gate.RejectedCanceled
				g.MaxInFlight = max(g.MaxInFlight, t.Gate.MaxInFlight)
				g.MaxWaiting = max(g.MaxWaiting, t.Gate.MaxWaiting)
			}
		}
		for k := range s.Waits {
			s.Waits[k] /= float64(nWaits)
		}
		for k := range s.Holders {
			s.Holders[k] /= float64(nHolders)
		}
		s.Goodput, s.Throughput = bench.Summarize(good), bench.Summarize(thr)
		s.P50, s.P99 = bench.Summarize(p50), bench.Summarize(p99)
		s.Held, s.Refused, s.Shed, s.Lag = bench.MergeQuantiles(held...), bench.MergeQuantiles(refused...), bench.MergeQuantiles(shed...), bench.MergeQuantiles(lag...)
		s.WALBytes, s.WALSyncs, s.Rows = bench.Summarize(wal), bench.Summarize(syncs), bench.Summarize(rows)
		s.RoundTrips, s.CtxSw, s.Cores = bench.Summarize(rtt), bench.Summarize(ctx), bench.Summarize(cores)
		s.Redis = bench.Summarize(redisCmds)
		s.LastHeld = bench.Summarize(last)
		s.ClientCPU = bench.Summarize(ccpu)
		if len(retries) > 0 {
			v := bench.Summarize(retries)
			s.Retries = &v
		}
		if len(batch) > 0 {
			v := bench.Summarize(batch)
			s.BatchMean = &v
		}
		out = append(out, s)
	}
	return out
}

// index finds summaries by their parts.
type index struct{ all []*summary }

func (ix index) find(exp, strat string, tool bench.Tool, script string, clients int, admit string) *summary {
	for _, s := range ix.all {
		c := s.Cell
		if c.Exp == exp && c.Strategy == strat && c.Tool == tool && c.Script == script && c.Clients == clients && c.Admit == admit {
			return s
		}
	}
	return nil
}

func (ix index) filter(f func(c cell) bool) []*summary {
	var out []*summary
	for _, s := range ix.all {
		if f(s.Cell) {
			out = append(out, s)
		}
	}
	return out
}

// ratio is Go/pgbench goodput of one point, paired by round: the two trials
// of a round ran back to back, so their ratio cancels most of the machine's
// drift. Summarized like any metric (median, t interval of the mean).
func ratios(recs []*record, strat string, clients int) bench.Summary {
	goBy, pgBy := map[int]float64{}, map[int]float64{}
	for _, r := range recs {
		c := r.Cell
		if c.Exp != expClosed || c.Strategy != strat || c.Clients != clients {
			continue
		}
		switch c.Tool {
		case bench.ToolGo:
			goBy[r.Round] = r.Trial.Run.Goodput
		case bench.ToolPgbench:
			pgBy[r.Round] = r.Trial.Run.Goodput
		}
	}
	var xs []float64
	for round, g := range goBy {
		if p, ok := pgBy[round]; ok && p > 0 {
			xs = append(xs, g/p)
		}
	}
	sort.Float64s(xs)
	return bench.Summarize(xs)
}

// writeBenchfmt writes every trial as a line of the Go benchmark format,
// with the run's configuration as key: value lines, so that
// `benchstat -col /strategy docs/perf/results.txt` (or two such files)
// compares them with its own statistics.
func writeBenchfmt(w io.Writer, m *machine, cfg config, recs []*record) error {
	fmt.Fprintf(w, "goos: %s\ngoarch: %s\ncpu: %s\npkg: github.com/reservebench/reservebench/cmd/reservebench-bench\n", m.GOOS, m.GOARCH, m.CPUModel)
	fmt.Fprintf(w, "cores: %d\npostgres: %s\nfsync: %s\nsynchronous_commit: %s\ngo: %s\nmode: %s\nwindow: %v\n",
		m.Cores, m.PostgresVersion, m.Settings["fsync"], m.Settings["synchronous_commit"], m.GoVersion, cfg.Mode, cfg.Duration)
	sorted := append([]*record(nil), recs...)
	sort.SliceStable(sorted, func(i, j int) bool {
		if a, b := sorted[i].Cell.name(), sorted[j].Cell.name(); a != b {
			return a < b
		}
		return sorted[i].Round < sorted[j].Round
	})
	for _, r := range sorted {
		if _, err := fmt.Fprintln(w, benchLine(r)); err != nil {
			return err
		}
	}
	return nil
}

func benchLine(r *record) string {
	t, run := r.Trial, r.Trial.Run
	n := run.Held + run.Refused + run.Shed + run.Errors
	var b strings.Builder
	b.WriteString(r.Cell.name())
	nsop := math.NaN()
	if n > 0 {
		nsop = run.Window * 1e9 / float64(n)
	}
	fmt.Fprintf(&b, "\t%d", max(n, 1))
	metric := func(v float64, unit string) {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			fmt.Fprintf(&b, "\t%.6g %s", v, unit)
		}
	}
	metric(nsop, "ns/op")
	metric(run.Goodput, "succ/s")
	metric(run.Throughput, "ans/s")
	if run.HeldLatency.N > 0 {
		metric(run.HeldLatency.P50, "p50-ms")
		metric(run.HeldLatency.P90, "p90-ms")
		metric(run.HeldLatency.P99, "p99-ms")
		metric(run.HeldLatency.Max, "max-ms")
	}
	if run.RefusedLatency.N > 0 {
		metric(float64(run.Refused)/run.Window, "refused/s")
		metric(run.RefusedLatency.P99, "refused-p99-ms")
	}
	if run.ShedLatency.N > 0 {
		metric(float64(run.Shed)/run.Window, "shed/s")
		metric(run.ShedLatency.P99, "shed-p99-ms")
	}
	if run.HeldTotal > 0 {
		metric(t.PerHeld.WALBytes, "walB/succ")
		metric(t.PerHeld.WALSyncs, "fsync/succ")
		metric(t.PerHeld.RowsWritten, "rows/succ")
		if t.Tool != bench.ToolPgbench {
			metric(t.PerHeld.RoundTrips, "rtt/succ")
			if t.PerHeld.RedisCommands > 0 {
				metric(t.PerHeld.RedisCommands, "redis/succ")
			}
		}
		metric(float64(run.CPU.CtxSwitches)/float64(run.HeldTotal), "ctxsw/succ")
	}
	metric(run.CPU.Busy, "cores")
	if r.Cell.Exp == expOpen {
		metric(run.Lag.P99, "lag-p99-ms")
		metric(float64(run.NeverSent+run.Skipped+run.Dropped), "unsent")
	}
	if n := run.Held; n > 0 && run.CPU.Client > 0 {
		metric(1e6*run.CPU.Client/float64(max(n, run.HeldTotal)), "client-cpu-us/succ")
	}
	return b.String()
}
