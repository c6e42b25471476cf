// Package compare is the harness behind table 28-1: it runs every scenario of
// strategy/strategytest/scenarios, with identical inputs, against every registered
// strategy on a real PostgreSQL, and renders the results.
//
// `go test ./compare` runs it (TestTable28_1) and rewrites
// docs/table-28-1.md and docs/table-28-1.json; the test fails when a
// strategy breaks a guarantee it claims, when a negative control is not
// caught, or (in CI) when the regenerated table differs from the committed
// one. The harness never names a strategy: it works from strategy.Registered()
// and each strategy's Claims.
package compare

import (
	"context"
	"fmt"
	"runtime/debug"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

// Options configure a run.
type Options struct {
	// Strategies to run; nil means strategy.Registered().
	Strategies []strategy.Meta
	// Scenarios to run; nil means every scenario the kit embeds (strategytest.Load).
	Scenarios []*strategytest.Scenario
	// Short runs fewer repetitions and smaller storms.
	Short bool
	// ShortScenarios run at their -short size whatever Short says (the
	// negative controls' storm: a broken decrement sells 1,000 of 1,000
	// requests as surely as 10,000 of 10,000, in a tenth of the time).
	ShortScenarios []string
	// Parallel is how many strategies run at once (default 1).
	Parallel int
	// Database gives each strategy a fresh database: db for the strategy (a
	// bounded pool, ideally a non-superuser role), admin for lock probes.
	// done is called when the strategy's scenarios have run.
	Database func(ctx context.Context, strategy string) (db, admin *pgxpool.Pool, done func(), err error)
	// ExclusiveDatabase gives a strategy a database on a server nothing else
	// uses, with control over that server, for the scenarios marked
	// exclusive_server (crash, commit timeout). Those scenarios run one
	// strategy at a time. Nil: they are reported as not supported.
	ExclusiveDatabase func(ctx context.Context, strategy string) (db, admin *pgxpool.Pool, srv strategytest.ServerControl, done func(), err error)
	// Logf receives progress lines.
	Logf func(format string, args ...any)
	// Cost measures each strategy's cost per successful reservation
	// (measureCost) before its scenarios.
	Cost bool

	// slots, when set, replaces the Parallel slots: Table shares one set
	// between the strategies and the negative controls, so that the
	// controls start in the strategies' tail instead of after it.
	slots chan struct{}
}

// Report is the outcome of a run.
type Report struct {
	Scenarios  []*strategytest.Scenario
	Strategies []*StrategyReport
	// Controls are the negative controls, when the caller ran them.
	Controls []*ControlReport
	// Server is the PostgreSQL major version the run used, e.g. "15".
	Server string
	// Source says where the rendered table lives relative to what it links
	// to; the zero value is this repository's docs/table-28-1.md.
	Source Source
}

// Source is what the rendered table says about where it comes from.
type Source struct {
	// Generator is the command that writes the table, for its header.
	Generator string
	// Scenarios is the link to the scenario files, relative to the table;
	// empty: the scenarios are named without a link.
	Scenarios string
	// Tradeoffs is the link to the guide on reading the table; empty: none.
	Tradeoffs string
	// Performance is the link to the timings (docs/performance.md); empty:
	// none.
	Performance string
	// LastRun names the file with what varies between runs.
	LastRun string
}

func (s Source) orDefault() Source {
	if s == (Source{}) {
		return Source{
			Generator:   "`go test ./compare` (compare/table_test.go)",
			Scenarios:   "../strategy/strategytest/scenarios",
			Tradeoffs:   "tradeoffs.md",
			Performance: "performance.md",
			LastRun:     "compare/last-run.json",
		}
	}
	return s
}

// link is text linked to file (under Scenarios; the directory when file is
// empty), or plain text without a Scenarios base.
func (s Source) link(text, file string) string {
	if s.Scenarios == "" {
		return text
	}
	if file == "" {
		return fmt.Sprintf("[%s](%s)", text, s.Scenarios)
	}
	return fmt.Sprintf("[%s](%s/%s)", text, s.Scenarios, file)
}

// StrategyReport is every scenario's result for one strategy.
type StrategyReport struct {
	Meta    strategy.Meta
	Results []*strategytest.Result // in the order of Report.Scenarios
	// Cost is what a successful reservation costs, when Options.Cost.
	Cost *Cost
}

// ControlReport is a negative control: a deliberately broken strategy that
// claims what it cannot keep, and the verdict the harness must reach.
type ControlReport struct {
	*StrategyReport
	Case   string // the seed's case, e.g. "C28-10"
	Breaks string // what is broken, in one line
	Expect []Expectation
	// Caught lists, per expectation, whether the run found that violation.
	Caught []bool
}

// Expectation is a violation a negative control must produce.
type Expectation struct {
	Scenario string
	Claim    strategy.Claims
}

// ScenarioTimeout bounds one scenario against one strategy, every trial: a
// strategy that hangs gets an ERROR in that scenario instead of stalling the
// table.
const ScenarioTimeout = 3 * time.Minute

// Run runs the scenarios against the strategies. A scenario that cannot be
// run to its end against a strategy (its setup fails, it panics, it times
// out) is that strategy's ERROR in that scenario; every other cell is still
// run. The error Run returns is only about the harness itself.
func Run(ctx context.Context, opts Options) (*Report, error) {
	if opts.Database == nil {
		return nil, fmt.Errorf("compare: Options.Database is required")
	}
	if opts.Strategies == nil {
		opts.Strategies = strategy.Registered()
	}
	if opts.Scenarios == nil {
		all, err := strategytest.Scenarios()
		if err != nil {
			return nil, err
		}
		opts.Scenarios = all
	}
	scenarios := ordered(opts.Scenarios)
	rep := &Report{Scenarios: scenarios, Strategies: make([]*StrategyReport, len(opts.Strategies))}
	sem := opts.slots
	if sem == nil {
		sem = make(chan struct{}, max(opts.Parallel, 1))
	}
	var wg sync.WaitGroup
	for i, meta := range opts.Strategies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep.Strategies[i] = runStrategy(ctx, opts, meta, scenarios, sem)
		}()
	}
	wg.Wait()
	return rep, ctx.Err()
}

// runStrategy runs every scenario against one strategy. The scenarios that
// need a server of their own run in a lane of their own, one at a time
// over every strategy (they crash or reconfigure that server), while the
// others run on a database of the strategy's own with a slot of sem: the
// two lanes overlap, so the exclusive scenarios of every strategy, added
// up, never queue behind the rest. Whatever goes wrong becomes an ERROR
// result of the scenario it happened in.
func runStrategy(ctx context.Context, opts Options, meta strategy.Meta, scenarios []*strategytest.Scenario, sem chan struct{}) *StrategyReport {
	sr := &StrategyReport{Meta: meta, Results: make([]*strategytest.Result, len(scenarios))}
	start := time.Now()
	logf := func(r *strategytest.Result, in *strategytest.Scenario) {
		if opts.Logf != nil {
			opts.Logf("%-16s %-18s %-9s %d trial(s) in %v", meta.Name, in.Name, r.Verdict(), r.Trials, r.Elapsed.Round(time.Millisecond))
		}
	}
	env := func(in *strategytest.Scenario) strategytest.Env {
		return strategytest.Env{Meta: meta, Short: opts.Short || slices.Contains(opts.ShortScenarios, in.Name), Logf: opts.Logf}
	}
	var lane sync.WaitGroup
	for i, in := range scenarios {
		if in.ExclusiveServer && opts.ExclusiveDatabase != nil {
			lane.Add(1)
			go func() {
				defer lane.Done()
				sr.Results[i] = runScenario(ctx, opts, env(in), in)
				logf(sr.Results[i], in)
			}()
		}
	}
	defer lane.Wait()
	sem <- struct{}{}
	defer func() { <-sem }()
	start = time.Now() // from here on the strategy has its slot

	db, admin, done, err := opts.Database(ctx, meta.Name)
	if err != nil {
		for i, in := range scenarios {
			if sr.Results[i] == nil && !(in.ExclusiveServer && opts.ExclusiveDatabase != nil) {
				sr.Results[i] = errored(meta, in, fmt.Errorf("database for %s: %w", meta.Name, err))
			}
		}
		return sr
	}
	defer done()
	if opts.Cost {
		if sr.Cost, err = measureCost(ctx, meta, db, admin); err != nil {
			sr.Cost = &Cost{Unmeasured: err.Error()}
		}
	}
	for i, in := range scenarios {
		if in.ExclusiveServer && opts.ExclusiveDatabase != nil {
			continue
		}
		e := env(in)
		e.DB, e.Admin = db, admin
		sr.Results[i] = runScenario(ctx, opts, e, in)
		logf(sr.Results[i], in)
	}
	if opts.Logf != nil {
		opts.Logf("%-16s all scenarios but the exclusive ones in %v (from its slot)", meta.Name, time.Since(start).Round(time.Millisecond))
	}
	return sr
}

// runScenario runs one cell of the table, turning an error, a panic or a
// timeout into an ERROR result. A scenario that needs a server of its own
// waits for it first; its timeout starts once it has it.
func runScenario(ctx context.Context, opts Options, env strategytest.Env, in *strategytest.Scenario) (r *strategytest.Result) {
	if in.ExclusiveServer && opts.ExclusiveDatabase != nil {
		exclusive.Lock()
		defer exclusive.Unlock()
	}
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			r = errored(env.Meta, in, fmt.Errorf("panic: %v\n%s", p, debug.Stack()))
		}
		if r.Error != "" {
			r.Elapsed = time.Since(start)
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, ScenarioTimeout)
	defer cancel()
	var err error
	if in.ExclusiveServer {
		r, err = runExclusive(ctx, opts, env, in)
	} else {
		r, err = strategytest.RunScenario(ctx, env, in)
	}
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (timeout %v)", err, ScenarioTimeout)
		}
		return errored(env.Meta, in, err)
	}
	return r
}

// errored is the result of a scenario that could not be run to its end.
func errored(meta strategy.Meta, in *strategytest.Scenario, err error) *strategytest.Result {
	return &strategytest.Result{
		Scenario: in.Name, Case: in.Case, Title: in.Title, Strategy: meta.Name, Claims: meta.Claims,
		Seed: in.SeedFor(meta.Name), Error: err.Error(),
	}
}

// exclusive serialises the scenarios that crash or reconfigure their server
// (runScenario holds it).
var exclusive sync.Mutex

func runExclusive(ctx context.Context, opts Options, env strategytest.Env, in *strategytest.Scenario) (*strategytest.Result, error) {
	if opts.ExclusiveDatabase == nil {
		return strategytest.RunScenario(ctx, env, in) // Env.Server is nil: reported as not supported
	}
	db, admin, srv, done, err := opts.ExclusiveDatabase(ctx, env.Meta.Name)
	if err != nil {
		return nil, fmt.Errorf("exclusive database for %s: %w", env.Meta.Name, err)
	}
	defer done()
	env.DB, env.Admin, env.Server = db, admin, srv
	return strategytest.RunScenario(ctx, env, in)
}

// ordered sorts scenarios by the seed's case number, then name; scenarios
// that are not the seed's come last.
func ordered(in []*strategytest.Scenario) []*strategytest.Scenario {
	out := append([]*strategytest.Scenario(nil), in...)
	rank := func(s *strategytest.Scenario) string {
		if len(s.Case) == 6 && s.Case[:4] == "C28-" {
			return "0" + s.Case
		}
		return "1" + s.Case
	}
	sort.SliceStable(out, func(i, j int) bool {
		ri, rj := rank(out[i]), rank(out[j])
		if ri != rj {
			return ri < rj
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// Judge fills in Caught for each expectation of a control.
func (c *ControlReport) Judge() {
	c.Caught = make([]bool, len(c.Expect))
	for i, e := range c.Expect {
		for _, r := range c.Results {
			if r.Scenario != e.Scenario {
				continue
			}
			for _, v := range r.Violations() {
				if v.Claim == e.Claim {
					c.Caught[i] = true
				}
			}
		}
	}
}

// Violations returns every violation of the registered strategies, as
// failure messages naming strategy, scenario, trial and history.
func (r *Report) Violations() []string {
	var out []string
	for _, s := range r.Strategies {
		if s == nil {
			continue
		}
		for _, res := range s.Results {
			if res.Error != "" {
				out = append(out, fmt.Sprintf("ERROR: strategy %s, scenario %s (%s) could not be run: %s", res.Strategy, res.Scenario, res.Case, res.Error))
			}
			for _, c := range res.Violations() {
				out = append(out, res.Failure(c))
			}
		}
	}
	return out
}
