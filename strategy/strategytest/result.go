package strategytest

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/reservebench/reservebench/strategy"
)

// Verdict is how a check, or a scenario, came out for one strategy.
type Verdict string

const (
	// Holds: every check passed in every trial.
	Holds Verdict = "holds"
	// Observed: a check failed whose guarantee the strategy does not claim:
	// a boundary of the design, reported with its counts.
	Observed Verdict = "observed"
	// Violation: a check failed whose guarantee the strategy claims, or one
	// of the contract's base checks failed. It fails `go test ./compare`.
	Violation Verdict = "VIOLATION"
	// NotSupported: the strategy lacks a capability the scenario needs.
	NotSupported Verdict = "n/a"
	// Errored: the scenario could not be run to its end against the
	// strategy (its setup failed, a helper process failed, it panicked or
	// timed out). It fails `go test ./compare` like a violation: a strategy
	// that errors has shown nothing.
	Errored Verdict = "ERROR"
)

// Base marks a check that is part of the contract itself rather than of a
// claim (an acknowledged reservation must exist, a refused one must not):
// failing it is always a violation.
const Base strategy.Claims = 0

// Fact is one count reported for the table.
type Fact struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Check is one assertion, aggregated over the trials of a scenario.
type Check struct {
	Claim  strategy.Claims `json:"-"`
	Claims string          `json:"claim"` // Claim's name, or "contract" for Base
	// Name is the check's name where it has one (Env.Checks): the
	// deployment contract's checks.
	Name   string `json:"name,omitempty"`
	What   string `json:"what"`
	Trials int    `json:"trials"`
	Failed int    `json:"failed"`
	// The first failure: which trial, the counts, and the history excerpt.
	FirstTrial int     `json:"first_trial,omitempty"`
	Detail     string  `json:"detail,omitempty"`
	History    string  `json:"history,omitempty"`
	Verdict    Verdict `json:"verdict"`
}

// Result is one scenario run against one strategy.
type Result struct {
	Scenario string          `json:"scenario"`
	Case     string          `json:"case"`
	Title    string          `json:"title"`
	Strategy string          `json:"strategy"`
	Claims   strategy.Claims `json:"-"`
	Trials   int             `json:"trials"`
	Skipped  string          `json:"skipped,omitempty"`
	// Error says why the scenario could not be run to its end; set by the
	// harness, which reports it as the Errored verdict.
	Error string `json:"error,omitempty"`
	// Facts are deterministic for a given input: they go into the golden
	// table. A fact that differed between trials is shown as "a | b".
	Facts []Fact `json:"facts"`
	// Varying are counts that depend on scheduling (wait counts, the
	// confirm/expire split): reported as ranges, kept out of the golden table.
	Varying  []Fact         `json:"varying,omitempty"`
	Checks   []*Check       `json:"checks"`
	Seed     string         `json:"seed,omitempty"`
	Elapsed  time.Duration  `json:"-"`
	Unstable []string       `json:"unstable,omitempty"` // facts that differed between trials
	Extra    map[string]any `json:"extra,omitempty"`
}

// Verdict is the worst verdict of the checks.
func (r *Result) Verdict() Verdict {
	if r.Error != "" {
		return Errored
	}
	if r.Skipped != "" {
		return NotSupported
	}
	v := Holds
	for _, c := range r.Checks {
		switch c.Verdict {
		case Violation:
			return Violation
		case Observed:
			v = Observed
		}
	}
	return v
}

// Violations returns the checks that are violations.
func (r *Result) Violations() []*Check { return r.with(Violation) }

// Observations returns the checks that failed without being claimed.
func (r *Result) Observations() []*Check { return r.with(Observed) }

func (r *Result) with(v Verdict) []*Check {
	var out []*Check
	for _, c := range r.Checks {
		if c.Verdict == v {
			out = append(out, c)
		}
	}
	return out
}

// Fact returns the value of a fact, or "".
func (r *Result) Fact(name string) string {
	for _, f := range r.Facts {
		if f.Name == name {
			return f.Value
		}
	}
	return ""
}

// Failure describes a check's first failure for a test log: strategy,
// scenario, trial, counts and the history excerpt that broke.
func (r *Result) Failure(c *Check) string {
	var b strings.Builder
	what := c.What
	if c.Name != "" { // a deployment contract's check: its name finds it (docs/adding-a-strategy.md)
		what = c.Name + ": " + what
	}
	fmt.Fprintf(&b, "%s: strategy %s, scenario %s (%s), trial %d of %d: %s [%s] failed %d of the %d times it was checked\n",
		c.Verdict, r.Strategy, r.Scenario, r.Case, c.FirstTrial, r.Trials, what, c.Claims, c.Failed, c.Trials)
	if c.Detail != "" {
		fmt.Fprintf(&b, "  %s\n", c.Detail)
	}
	if c.History != "" {
		b.WriteString("  history:\n")
		for _, line := range strings.Split(c.History, "\n") {
			b.WriteString("    " + line + "\n")
		}
	}
	return b.String()
}

// ClaimName names a claim as the table does: its name, or "contract" for
// Base.
func ClaimName(c strategy.Claims) string {
	if c == Base {
		return "contract"
	}
	return c.String()
}

func judge(c strategy.Claims, claims strategy.Claims, failed int) Verdict {
	switch {
	case failed == 0:
		return Holds
	case c == Base || claims.Has(c):
		return Violation
	default:
		return Observed
	}
}

// aggregate folds the trials of a scenario into one Result.
func aggregate(r *Result, trials []*trial) {
	r.Trials = len(trials)
	// Facts: in the order of the first trial; differing values joined.
	var order []string
	values := map[string][]string{}
	for _, t := range trials {
		for _, f := range t.facts {
			if _, ok := values[f.Name]; !ok {
				order = append(order, f.Name)
			}
			values[f.Name] = appendUnique(values[f.Name], f.Value)
		}
	}
	for _, name := range order {
		vs := values[name]
		if len(vs) > 1 {
			r.Unstable = append(r.Unstable, name)
		}
		r.Facts = append(r.Facts, Fact{Name: name, Value: strings.Join(vs, " | ")})
	}
	// Varying: numeric ranges.
	var vorder []string
	lo, hi := map[string]int{}, map[string]int{}
	for _, t := range trials {
		for _, v := range t.varying {
			if _, ok := lo[v.name]; !ok {
				vorder = append(vorder, v.name)
				lo[v.name], hi[v.name] = v.value, v.value
			}
			lo[v.name] = min(lo[v.name], v.value)
			hi[v.name] = max(hi[v.name], v.value)
		}
	}
	for _, name := range vorder {
		val := fmt.Sprint(lo[name])
		if hi[name] != lo[name] {
			val = fmt.Sprintf("%d..%d", lo[name], hi[name])
		}
		r.Varying = append(r.Varying, Fact{Name: name, Value: val})
	}
	// Checks: keyed by (claim, what), in the order first seen.
	index := map[string]*Check{}
	for _, t := range trials {
		for _, o := range t.checks {
			k := fmt.Sprint(uint64(o.claim), "\x00", o.what)
			c, ok := index[k]
			if !ok {
				c = &Check{Claim: o.claim, Claims: ClaimName(o.claim), Name: o.name, What: o.what}
				index[k] = c
				r.Checks = append(r.Checks, c)
			}
			c.Trials++
			if !o.ok {
				c.Failed++
				if c.FirstTrial == 0 {
					c.FirstTrial, c.Detail, c.History = t.n, o.detail, o.history
				}
			}
		}
	}
	for _, c := range r.Checks {
		c.Verdict = judge(c.Claim, r.Claims, c.Failed)
	}
	sort.SliceStable(r.Checks, func(i, j int) bool { return r.Checks[i].Claim < r.Checks[j].Claim })
}

func appendUnique(vs []string, v string) []string {
	for _, x := range vs {
		if x == v {
			return vs
		}
	}
	return append(vs, v)
}
