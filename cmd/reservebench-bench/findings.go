package main

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/reservebench/reservebench/bench"
)

// The report states a finding only when its condition holds on the run's
// data. These are the thresholds; docs/performance-method.md lists them
// ("What the report states, and when"): change both together.
const (
	// fallShare: a strategy falls when its goodput at the most clients is
	// below this share of its peak.
	fallShare = 0.6
	// serialFsync: at or above this many WAL flushes per success, commits did
	// not share flushes.
	serialFsync = 0.9
	// queueShare: a wait state holding at least this share of the backends
	// (on average) is a queue worth naming.
	queueShare = 0.1
	// walGrowth: WAL per success growing at least this much from the fewest
	// to the most clients.
	walGrowth = 2.0
	// saturatedShare: cores busy at or above this share of the machine's.
	saturatedShare = 0.85
	// admissionGain: an admission policy helps when it reaches at least this
	// multiple of the goodput without admission.
	admissionGain = 1.2
	// ratioBand: Go and pgbench agree when a median ratio lies within
	// [1/ratioBand, ratioBand].
	ratioBand = 1.5
	// roundTripPenalty: a control holding its lock across a round trip is
	// slower when below this share of the one that does not.
	roundTripPenalty = 0.9
	// nearPeak: admission keeps goodput near the peak when it reaches this
	// share of it.
	nearPeak = 0.8
	// fewHeads: at most this many heads of lock queues per pg_locks sample
	// (on average): however many backends wait, few hold what they wait for.
	fewHeads = 2.0
)

// methodDoc is the hand-written companion of the report, next to it.
const methodDoc = "performance-method.md"

// see links a section of the method doc.
func see(anchor, text string) string {
	return fmt.Sprintf("[%s](%s#%s)", text, methodDoc, anchor)
}

// waitSum sums the labels of m that start with one of prefixes, in a fixed
// order (the report must come out the same twice).
func waitSum(m map[string]float64, prefixes ...string) float64 {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	sum := 0.0
	for _, k := range keys {
		for _, p := range prefixes {
			if strings.HasPrefix(k, p) {
				sum += m[k]
				break
			}
		}
	}
	return sum
}

// topWith returns the label with the most backends among those starting
// with prefix, and its value ("" if none is above zero).
func topWith(m map[string]float64, prefix string) (string, float64) {
	for _, k := range bench.Top(m) {
		if strings.HasPrefix(k, prefix) && m[k] > 0 {
			return k, m[k]
		}
	}
	return "", 0
}

// diag is what the closed loop of one strategy says about its fall, at the
// most clients against its peak. Every field is computed from the run.
type diag struct {
	name            string
	mx              int
	peakC           int
	one, peak, last *summary
	pgPeak, pgLast  *summary // pgbench, same cells
	falls, pgFalls  bool
	lock, lockPeak  float64 // Lock:* backends at mx / at the peak
	lockLabel       string  // the largest Lock:* label at mx
	lockTop         float64
	rowLock         float64 // Lock:transactionid + Lock:tuple at mx
	serial          bool    // one WAL flush per success at mx
	wake, wakePeak  float64 // LWLock:LockManager + LWLock:BufferContent at mx / at the peak
	clientWait      float64 // idle, idle in transaction, Client:ClientRead at mx
	saturated       bool
	walFactor       float64 // WAL per success at mx ÷ at the fewest clients
	mxact           float64 // LWLock:MultiXact* at mx
	heads           float64 // heads of lock queues per pg_locks sample at mx
	ratioLast       bench.Summary
	admitted        []*summary // admission cells at mx
	bestAdmit       *summary
}

// hotRow: commits went one at a time and backends queued on other
// transactions' row locks.
func (d diag) hotRow() bool {
	return d.serial && d.rowLock >= queueShare*float64(d.mx)
}

// oneLock: more than half the backends queued on one kind of lock.
func (d diag) oneLock() bool { return d.lockTop > float64(d.mx)/2 }

// wakeups: the strategy falls while waiters crowd the lock manager and the
// buffer locks, more than at its peak.
func (d diag) wakeups() bool {
	return d.falls && d.wake >= queueShare*float64(d.mx) && d.wake > d.wakePeak
}

// multiXact: WAL per success grows with the clients and MultiXact waits
// were sampled.
func (d diag) multiXact() bool { return d.walFactor >= walGrowth && d.mxact > 0 }

// fewHolders: backends waited on locks, behind few holders at a time.
func (d diag) fewHolders() bool { return d.heads > 0 && d.heads <= fewHeads && d.lock > 0 }

// clientBound: no lock queue, most backends wait for their client, and the
// machine is saturated.
func (d diag) clientBound() bool {
	return !d.oneLock() && d.clientWait > float64(d.mx)/2 && d.saturated
}

// admissionNearPeak: admission helps and its best policy reaches nearPeak
// of the strategy's peak.
func (d diag) admissionNearPeak() bool {
	return d.admissionHelps() && d.bestAdmit.Goodput.Median >= nearPeak*d.peak.Goodput.Median
}

// admissionHelps reports whether the best admission policy at mx reached
// admissionGain times the goodput without it.
func (d diag) admissionHelps() bool {
	return d.bestAdmit != nil && d.last.Goodput.Median > 0 && d.bestAdmit.Goodput.Median >= admissionGain*d.last.Goodput.Median
}

// diagnose computes the diag of a strategy; ok is false without the
// closed-loop cells it needs.
func (r *results) diagnose(ix index, name string) (diag, bool) {
	mx := r.maxClients()
	d := diag{name: name, mx: mx}
	d.peakC, d.peak = r.peak(ix, name)
	d.one = ix.find(expClosed, name, bench.ToolGo, "", r.Config.Clients[0], "")
	d.last = ix.find(expClosed, name, bench.ToolGo, "", mx, "")
	if d.peak == nil || d.last == nil || d.one == nil {
		return d, false
	}
	d.falls = d.peakC < mx && d.last.Goodput.Median < fallShare*d.peak.Goodput.Median
	d.pgLast = ix.find(expClosed, name, bench.ToolPgbench, "", mx, "")
	for _, s := range ix.filter(func(c cell) bool { return c.Exp == expClosed && c.Strategy == name && c.Tool == bench.ToolPgbench }) {
		if d.pgPeak == nil || s.Throughput.Median > d.pgPeak.Throughput.Median {
			d.pgPeak = s
		}
	}
	if d.pgPeak != nil && d.pgLast != nil {
		d.pgFalls = d.pgPeak.Cell.Clients < mx && d.pgLast.Throughput.Median < fallShare*d.pgPeak.Throughput.Median
	}
	w, wp := d.last.Waits, d.peak.Waits
	d.lock, d.lockPeak = waitSum(w, "Lock:"), waitSum(wp, "Lock:")
	d.lockLabel, d.lockTop = topWith(w, "Lock:")
	d.rowLock = waitSum(w, "Lock:transactionid", "Lock:tuple")
	d.serial = d.last.WALSyncs.N > 0 && d.last.WALSyncs.Median >= serialFsync
	d.wake = waitSum(w, "LWLock:LockManager", "LWLock:BufferContent")
	d.wakePeak = waitSum(wp, "LWLock:LockManager", "LWLock:BufferContent")
	for _, k := range []string{"idle", "idle in transaction", "Client:ClientRead"} {
		d.clientWait += w[k]
	}
	d.saturated = r.Machine.Cores > 0 && d.last.Cores.Median >= saturatedShare*float64(r.Machine.Cores)
	if d.one.WALBytes.Median > 0 {
		d.walFactor = d.last.WALBytes.Median / d.one.WALBytes.Median
	}
	d.mxact = waitSum(w, "LWLock:MultiXact")
	d.heads = waitSum(d.last.Holders, "")
	d.ratioLast = ratios(r.Trials, name, mx)
	d.admitted = ix.filter(func(c cell) bool { return c.Exp == expAdmission && c.Strategy == name && c.Clients == mx })
	sort.Slice(d.admitted, func(i, j int) bool { return d.admitted[i].Cell.Admit < d.admitted[j].Cell.Admit })
	for _, s := range d.admitted {
		if d.bestAdmit == nil || s.Goodput.Median > d.bestAdmit.Goodput.Median {
			d.bestAdmit = s
		}
	}
	return d, true
}

// why is the headline's one-clause summary of a falling strategy's cause,
// from the conditions that hold ("" when none does).
func (d diag) why(cores int) string {
	var parts []string
	switch {
	case d.hotRow():
		parts = append(parts, fmt.Sprintf("one WAL flush per success (%.2f) and %.1f of %d backends waiting for another transaction's row lock", d.last.WALSyncs.Median, d.rowLock, d.mx))
	case d.oneLock():
		parts = append(parts, fmt.Sprintf("%.0f of %d backends waiting on `%s`", d.lockTop, d.mx, d.lockLabel))
	case d.clientBound():
		parts = append(parts, fmt.Sprintf("%.2f of %d cores busy while %.0f of %d backends waited for their client", d.last.Cores.Median, cores, d.clientWait, d.mx))
	}
	if d.wakeups() {
		parts = append(parts, fmt.Sprintf("%.1f backends waiting on the lock manager and buffer locks on %d cores", d.wake, cores))
	}
	if d.multiXact() {
		parts = append(parts, fmt.Sprintf("WAL per success %.1f× that at %s, with MultiXact waits", d.walFactor, clientsStr(d.one.Cell.Clients)))
	}
	return strings.Join(parts, "; ")
}

// withinBand reports whether a ratio lies within [1/ratioBand, ratioBand].
func withinBand(x float64) bool { return x >= 1/ratioBand && x <= ratioBand }

// overlapping returns the pairs of strategies whose goodput intervals
// overlap at every client count of the closed loop, with the largest gap
// between their medians relative to the larger one.
func (r *results) overlapping(ix index) []string {
	names := r.strategies()
	var out []string
	for i := 0; i < len(names); i++ {
		for j := i + 1; j < len(names); j++ {
			all, gap, n := true, 0.0, 0
			for _, c := range r.Config.Clients {
				a := ix.find(expClosed, names[i], bench.ToolGo, "", c, "")
				b := ix.find(expClosed, names[j], bench.ToolGo, "", c, "")
				if a == nil || b == nil || a.Goodput.N < 2 || b.Goodput.N < 2 {
					all = false
					break
				}
				if a.Goodput.Hi < b.Goodput.Lo || b.Goodput.Hi < a.Goodput.Lo {
					all = false
					break
				}
				n++
				if m := math.Max(a.Goodput.Median, b.Goodput.Median); m > 0 {
					gap = math.Max(gap, math.Abs(a.Goodput.Median-b.Goodput.Median)/m)
				}
			}
			if all && n > 0 {
				out = append(out, fmt.Sprintf("`%s` and `%s` (medians at most %.0f%% apart)", names[i], names[j], 100*gap))
			}
		}
	}
	return out
}
