package strategytest

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/reservebench/reservebench/strategy"
)

// runRequests runs the phases of a KindRequests scenario: every request of a
// phase is sent at once (all goroutines released together), restarts happen
// between phases. A request answered BUSY is sent again, as a client told
// "busy, try again" does (reserveDefinite): the counts are of each
// request's final answer.
func runRequests(ctx context.Context, t *trial) error {
	heldOn := map[int][]string{} // node -> keys it answered HELD, in order
	for pi, ph := range t.in.Phases {
		label := ph.Name
		if label == "" {
			label = fmt.Sprintf("phase %d", pi+1)
		}
		if ph.FirstTrialOnly && t.n > 1 {
			continue
		}
		if len(ph.Restart) > 0 {
			if err := t.confirmHeld(ctx, ph, heldOn); err != nil {
				return err
			}
			if len(ph.InFlight) > 0 {
				if err := t.restartWithInFlight(ctx, ph, label); err != nil {
					return err
				}
				continue
			}
			for _, n := range ph.Restart {
				if err := t.dep.(strategy.Restarter).Restart(ctx, n); err != nil {
					return fmt.Errorf("restart node %d: %w", n, err)
				}
			}
			t.restarted = true
			continue
		}
		// Outcome counts per SKU (the first two SKUs by name, the rest
		// summed), over every round of the phase.
		perSKU := map[string]map[strategy.Outcome]int{}
		var order []string
		for _, g := range ph.Requests {
			if _, ok := perSKU[g.SKU]; !ok {
				perSKU[g.SKU] = map[strategy.Outcome]int{}
				order = append(order, g.SKU)
			}
		}
		unknown, sent := 0, 0
		var phantoms, over, drift []string
		for round := 0; round < max(ph.Repeat, 1); round++ {
			roundSuffix := ""
			if ph.Repeat > 1 {
				roundSuffix = fmt.Sprintf("-r%d", round)
			}
			jobs := t.phaseJobs(pi, ph, roundSuffix)
			ops := make([]Op, len(jobs))
			call := func(i int) {
				ops[i] = t.reserveDefinite(ctx, fmt.Sprintf("c%d", i), jobs[i].node, jobs[i].req)
			}
			if hold := time.Duration(ph.HoldGateMs) * time.Millisecond; t.in.Gate || hold > 0 {
				if err := t.gated(ctx, len(jobs), call, gateOptions{hold: hold}); err != nil {
					return err
				}
			} else {
				Together(len(jobs), call)
			}
			sent += len(ops)
			for i, op := range ops {
				if op.Type != OpInfo && op.Outcome == strategy.OutcomeHeld {
					n := jobs[i].node % t.cfg.NodeCount()
					heldOn[n] = append(heldOn[n], op.Req.Key)
				}
			}
			roundSoldOut := map[string]int{}
			for _, op := range ops {
				if op.Type == OpInfo {
					unknown++
					continue
				}
				perSKU[t.plain(op.Req.SKU)][op.Outcome]++
				if op.Outcome == strategy.OutcomeSoldOut {
					roundSoldOut[t.plain(op.Req.SKU)]++
				}
			}
			audit, err := t.audit(ctx)
			if err != nil {
				return err
			}
			for _, sku := range order {
				a := audit[t.sku(sku)]
				// A SOLD_OUT answered while units are still free once every
				// attempt has finished is a phantom sold-out (seed C28-14),
				// across nodes too.
				if n := roundSoldOut[sku]; n > 0 && a.Available > 0 {
					phantoms = append(phantoms, fmt.Sprintf("%s: %d SOLD_OUT while %d units stayed free", sku, n, a.Available))
				}
				if a.Oversold() > 0 {
					over = append(over, fmt.Sprintf("%s: %d active for %d units", sku, a.Active, a.Total))
				}
				if a.Drift() != 0 {
					drift = append(drift, fmt.Sprintf("%s: total %d - available %d - active %d = drift %d", sku, a.Total, a.Available, a.Active, a.Drift()))
				}
			}
		}
		lines := outcomeLines(order, perSKU)
		if ph.SumSKUs {
			lines = outcomeLines([]string{strings.Join(order, " + ")}, map[string]map[strategy.Outcome]int{strings.Join(order, " + "): sumOutcomes(perSKU)})
		}
		for _, line := range lines {
			t.fact(label+": "+line.name, "%s", line.value)
		}
		t.check(Base, "every request gets an answer", unknown == 0,
			fmt.Sprintf("%d of %d requests ended without a known outcome", unknown, sent))
		t.check(strategy.NoPhantomSoldOut, "no SOLD_OUT while units remain", len(phantoms) == 0, sample(phantoms))
		if len(phantoms) > 0 {
			t.fact(label+": phantom sold-out", "%s", sample(phantoms))
		}
		// Each phase is audited on its own, so a failure is charged to the
		// claim that broke when it broke: before any restart to NoOversell
		// and Conserves, after one to SurvivesRestart.
		if t.restarted {
			t.check(strategy.SurvivesRestart, "a restarted node oversells nothing", len(over)+len(drift) == 0, sample(append(over, drift...)))
		} else {
			t.check(strategy.NoOversell, label+": active reservations never exceed the stock", len(over) == 0, sample(over))
			t.check(strategy.Conserves, label+": total - available == active (drift 0)", len(drift) == 0, sample(drift))
		}
	}

	// Final state, per SKU: what the audit says, and distinct holders.
	audit, err := t.audit(ctx)
	if err != nil {
		return err
	}
	var skus []string
	for _, s := range t.in.Stock {
		skus = append(skus, s.SKU)
	}
	holders := map[string]map[string]bool{}
	var keys []string
	for _, op := range t.hist.Ops() {
		if op.Type == OpOK {
			keys = append(keys, op.Req.Key)
		}
	}
	durable, err := t.lookupAll(ctx, uniq(keys))
	if err != nil {
		return err
	}
	t.settled = durable
	for _, d := range durable {
		if d.Status.Active() {
			sku := t.plain(d.SKU)
			if holders[sku] == nil {
				holders[sku] = map[string]bool{}
			}
			holders[sku][d.User] = true
		}
	}
	for _, g := range groupSKUs(skus) {
		total, avail, active, nh := 0, 0, 0, 0
		for _, sku := range g.skus {
			a := audit[t.sku(sku)]
			total += a.Total
			avail += a.Available
			active += a.Active
			nh += len(holders[sku])
		}
		t.fact("end: "+g.name, "total %d, available %d, active %d, %d distinct holders", total, avail, active, nh)
	}
	return nil
}

// job is one request of a phase and the node it goes to.
type job struct {
	node int
	req  strategy.Request
}

// phaseJobs builds the requests of one round of a phase. Keys and users
// get the round's suffix, and a group's copies their own (-g0, -g1, ...).
// confirmHeld confirms, before a restart phase, the first ph.Confirm
// reservations each restarted node held (when the strategy confirms at
// all); a fact says how many moved.
func (t *trial) confirmHeld(ctx context.Context, ph Phase, heldOn map[int][]string) error {
	if ph.Confirm == 0 {
		return nil
	}
	if _, ok := t.node(0).(strategy.Confirmer); !ok {
		return nil
	}
	for _, n := range ph.Restart {
		keys := heldOn[n][:min(ph.Confirm, len(heldOn[n]))]
		moved := 0
		for _, k := range keys {
			ok, err := t.confirm(ctx, "confirm", n, k, strategy.ConfirmUntilExpired)
			if err != nil {
				return fmt.Errorf("confirm %s before the restart: %w", t.plain(k), err)
			}
			if ok {
				moved++
			}
		}
		t.fact(fmt.Sprintf("confirmed on node %d before its restart", n), "%d of %d", moved, len(keys))
	}
	return nil
}

func (t *trial) phaseJobs(pi int, ph Phase, roundSuffix string) []job {
	var jobs []job
	for gi, g := range ph.Requests {
		count := t.scaled(g.Count)
		for copyNo := 0; copyNo < max(g.Groups, 1); copyNo++ {
			suffix := roundSuffix
			if g.Groups > 0 {
				suffix += fmt.Sprintf("-g%d", copyNo)
			}
			for i := 0; i < count; i++ {
				node := i
				if g.Node != nil {
					node = *g.Node
				}
				key := fmt.Sprintf("req-p%d-g%d-%05d", pi, gi, i)
				if g.Key != "" {
					key = g.Key
				}
				user := fmt.Sprintf("user-p%d-g%d-%05d", pi, gi, i)
				if g.User != "" {
					user = g.User
				}
				jobs = append(jobs, job{node: node, req: strategy.Request{
					Key: t.key(key + suffix), User: t.user(user + suffix), SKU: t.sku(g.SKU), TTL: strategy.TTLForever,
				}})
			}
		}
	}
	return jobs
}

func sumOutcomes(per map[string]map[strategy.Outcome]int) map[strategy.Outcome]int {
	sum := map[strategy.Outcome]int{}
	for _, counts := range per {
		for o, n := range counts {
			sum[o] += n
		}
	}
	return sum
}

type namedValue struct{ name, value string }

// outcomeLines formats outcome counts: the first two SKUs alone, the rest
// summed as one line, so a long tail stays one row of the table.
func outcomeLines(order []string, per map[string]map[strategy.Outcome]int) []namedValue {
	var out []namedValue
	for _, g := range groupSKUs(order) {
		sum := map[strategy.Outcome]int{}
		for _, sku := range g.skus {
			for o, n := range per[sku] {
				sum[o] += n
			}
		}
		out = append(out, namedValue{g.name, formatOutcomes(sum)})
	}
	return out
}

type skuGroup struct {
	name string
	skus []string
}

func groupSKUs(skus []string) []skuGroup {
	if len(skus) <= 2 {
		var out []skuGroup
		for _, s := range skus {
			out = append(out, skuGroup{s, []string{s}})
		}
		return out
	}
	rest := append([]string(nil), skus[1:]...)
	return []skuGroup{{skus[0], skus[:1]}, {fmt.Sprintf("%d others", len(rest)), rest}}
}

func formatOutcomes(m map[strategy.Outcome]int) string {
	var parts []string
	for _, o := range strategy.Outcomes {
		if m[o] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", o, m[o]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func uniq(xs []string) []string {
	sort.Strings(xs)
	out := xs[:0]
	for i, x := range xs {
		if i == 0 || x != xs[i-1] {
			out = append(out, x)
		}
	}
	return out
}
