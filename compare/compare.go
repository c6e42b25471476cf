// Package compare is the harness behind table 28-1: it runs every scenario of
// strategy/strategytest/scenarios, with identical inputs, against every registered
// strategy on a real PostgreSQL, and renders the results.
//
// `go test ./compare` runs it (TestTable28_1) and rewrites
// docs/table-28-1.md and docs/table-28-1.json; the test fails when a
// strategy breaks a guarantee it claims, when a negative control is not
// caught, or (in CI) when the regenerated table differs from the committed
// one. The harness never names a strategy: it works from strategy.Registered(),
// each strategy's Claims, and its Meta.Needs, which package resourcetest
// starts for it alone (a redis-server with the settings it declares).
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

	"github.com/reservebench/reservebench/admission"
	"github.com/reservebench/reservebench/resourcetest"
	"github.com/reservebench/reservebench/service"
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
	// requests as surely as 2,000 of 2,000, in half the time).
	ShortScenarios []string
	// Parallel is how many cells run at once, heaviest first (default 1;
	// the paced and the long scenarios have slots of their own, slots.go).
	Parallel int
	// slots, when set, are the slots of the run instead of Parallel's:
	// Table shares them between the strategies and the controls.
	slots *slots
	// control marks a run of negative controls: their cells take a slot
	// only when no strategy's cell waits for one (slots.go).
	control bool
	// stopOn, for a negative control, is what each scenario must catch:
	// the scenario ends at its first violation of one of these claims
	// (strategytest.Env.StopOnViolation).
	stopOn map[string][]strategy.Claims
	// checks, for a negative control, is the checks of the deployment
	// contract each scenario runs: those the control's expectations name
	// (strategytest.Env.Checks).
	checks map[string][]string
	// Database gives each strategy a fresh database: db for the strategy (a
	// bounded pool, ideally a non-superuser role), admin for lock probes.
	// done is called when the strategy's scenarios have run.
	Database func(ctx context.Context, strategy string) (db, admin *pgxpool.Pool, done func(), err error)
	// ExclusiveDatabase gives a strategy a database on a server nothing else
	// uses, with control over that server, for the scenarios marked
	// exclusive_server (crash, commit timeout, failover); its ctx names the
	// scenario's lane (laneOf), which may have a server of its own. A lane
	// runs one strategy at a time. Nil: they are reported as not supported.
	ExclusiveDatabase func(ctx context.Context, strategy string) (db, admin *pgxpool.Pool, srv strategytest.ServerControl, done func(), err error)
	// Logf receives progress lines.
	Logf func(format string, args ...any)
	// Admission, when set, is the admission the http-* scenarios put in
	// front of the strategy (strategytest.Env.Admission): the negative
	// controls that break the front set it.
	Admission func(inner strategy.Strategy, l admission.Limits) (service.Admission, error)
	// Cost measures each strategy's cost per successful reservation
	// (measureCost) before its scenarios.
	Cost bool
	// ScenarioTimeout bounds one cell; zero is ScenarioTimeout. A strategy
	// whose cell runs into it is not run in its remaining scenarios.
	ScenarioTimeout time.Duration
}

// scenarioTimeout is the bound of one cell.
func (o Options) scenarioTimeout() time.Duration {
	if o.ScenarioTimeout > 0 {
		return o.ScenarioTimeout
	}
	return ScenarioTimeout
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
	// Race says the mistake shows only in some interleavings (see
	// docs/detection.md for how often a full run misses it).
	Race bool
	// Caught lists, per expectation, whether the run found that violation.
	Caught []bool
}

// Expectation is a violation a negative control must produce.
type Expectation struct {
	Scenario string
	Claim    strategy.Claims
	// Check, when set, is the check that must fail (strategytest.Check.Name).
	Check string
}

// String says what the expectation wants, as table 28-1 prints it.
func (e Expectation) String() string {
	s := fmt.Sprintf("%s violation in %s", strategytest.ClaimName(e.Claim), e.Scenario)
	if e.Check != "" {
		s += " (" + e.Check + ")"
	}
	return s
}

// ScenarioTimeout bounds one scenario against one strategy, every trial: a
// strategy that hangs gets an ERROR in that scenario instead of stalling the
// table. It bounds a hang, not a speed: on a 2-core machine whose process
// creation had slowed to 4 ms a fork, advisorylock's storm took 1m53s and
// then 2m0s of the 2 minutes this was, a false ERROR.
const ScenarioTimeout = 5 * time.Minute

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
		sem = newSlots(max(opts.Parallel, 1), pacedSlots)
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
// need a server of their own run in their lanes (lanes.go), one strategy at
// a time per lane; its long ones (Scenario.Work) beside the rest, each on
// a database of its own; the others run one after the other on a database
// of the strategy's own, heaviest first, each cell with a slot of sem (slots.go):
// the lanes overlap the slots, so the exclusive scenarios of every
// strategy, added up, never queue behind the rest. Whatever goes wrong
// becomes an ERROR result of the scenario it happened in.
func runStrategy(ctx context.Context, opts Options, meta strategy.Meta, scenarios []*strategytest.Scenario, sem *slots) *StrategyReport {
	sr := &StrategyReport{Meta: meta, Results: make([]*strategytest.Result, len(scenarios))}
	logf := func(r *strategytest.Result, in *strategytest.Scenario) {
		if opts.Logf != nil {
			opts.Logf("%-16s %-18s %-9s %d trial(s) in %v", meta.Name, in.Name, r.Verdict(), r.Trials, r.Elapsed.Round(time.Millisecond))
		}
	}
	failAll := func(err error) *StrategyReport {
		for i, in := range scenarios {
			if sr.Results[i] == nil {
				sr.Results[i] = errored(meta, in, err)
			}
		}
		return sr
	}
	exclusive := func(in *strategytest.Scenario) bool { return in.ExclusiveServer && opts.ExclusiveDatabase != nil }
	bonus := strategyWeight
	if opts.control {
		bonus = 0
	}
	// What the strategy needs besides PostgreSQL (its Redis), started for
	// it alone: some scenarios kill it.
	res, err := resourcetest.Start(ctx, meta)
	if err != nil {
		return failAll(fmt.Errorf("resources for %s: %w", meta.Name, err))
	}
	defer res.Close()
	env := func(in *strategytest.Scenario) strategytest.Env {
		return strategytest.Env{Meta: meta, Resources: res, Short: opts.Short || slices.Contains(opts.ShortScenarios, in.Name), Logf: opts.Logf, Admission: opts.Admission,
			StopOnViolation: opts.stopOn[in.Name], Checks: opts.checks[in.Name]}
	}
	var lane sync.WaitGroup
	for i, in := range scenarios {
		if exclusive(in) {
			lane.Add(1)
			go func() {
				defer lane.Done()
				// The lane overlaps the scenarios below, one of which
				// kills and restarts the strategy's Redis
				// (redis-restart): a scenario of the lane gets a Redis of
				// its own, as it gets a server of its own.
				own, err := resourcetest.Start(ctx, meta)
				if err != nil {
					sr.Results[i] = errored(meta, in, fmt.Errorf("resources for %s: %w", meta.Name, err))
					logf(sr.Results[i], in)
					return
				}
				defer own.Close()
				e := env(in)
				e.Resources = own
				sr.Results[i], _ = runScenarioBounded(ctx, opts, e, in)
				logf(sr.Results[i], in)
			}()
		}
	}
	defer lane.Wait()
	// Heaviest first; the results keep the table's order.
	order := make([]int, 0, len(scenarios))
	for i, in := range scenarios {
		if !exclusive(in) {
			order = append(order, i)
		}
	}
	sort.SliceStable(order, func(a, b int) bool { return weight(scenarios[order[a]]) > weight(scenarios[order[b]]) })
	if opts.control {
		if err := sem.controlRows.acquire(ctx, 0); err != nil {
			return failAll(fmt.Errorf("not run: waiting for a slot: %w", err))
		}
		defer sem.controlRows.release()
	}
	start := time.Now()

	if opts.Cost && sem.work.acquire(ctx, bonus+costWeight) == nil {
		sr.Cost = costOnItsOwn(ctx, opts, meta)
		sem.work.release()
	}
	var (
		hungMu sync.Mutex
		hung   string // the first scenario that ran into its deadline
	)
	hungFirst := func() string {
		hungMu.Lock()
		defer hungMu.Unlock()
		return hung
	}
	// run runs one cell once it has its slot, on the database and
	// resources open gives it then.
	run := func(i int, open func(e *strategytest.Env) (cleanup func(), err error)) {
		in := scenarios[i]
		if h := hungFirst(); h != "" {
			sr.Results[i] = errored(meta, in, fmt.Errorf("not run: scenario %s ran into its %v deadline, and a strategy that hung once is not waited for again", h, opts.scenarioTimeout()))
			return
		}
		pool := sem.pool(in)
		if err := pool.acquire(ctx, bonus+weight(in)); err != nil {
			sr.Results[i] = errored(meta, in, fmt.Errorf("not run: waiting for a slot: %w", err))
			return
		}
		e := env(in)
		cleanup, err := open(&e)
		if err != nil {
			pool.release()
			sr.Results[i] = errored(meta, in, err)
			logf(sr.Results[i], in)
			return
		}
		defer cleanup()
		r, abandoned := runScenarioBounded(ctx, opts, e, in)
		pool.release()
		// A cell that ran into its deadline hung, or nearly: the strategy's
		// other scenarios would each wait it out as well (a deadlock that
		// heeds its context), and the table with them.
		if abandoned || r.Elapsed >= opts.scenarioTimeout() {
			hungMu.Lock()
			if hung == "" {
				hung = in.Name
			}
			hungMu.Unlock()
		}
		sr.Results[i] = r
		logf(r, in)
	}
	// The long cells (Scenario.Work) run beside the rest of the row, each
	// on a database and resources of its own, as the lanes do: one after
	// the other, the deployment contract (20 to 45 s) and redis-restart
	// (10 to 15 s) made the longest rows 60 to 80 s, the table's floor.
	var beside sync.WaitGroup
	rest := order[:0:0]
	for _, i := range order {
		if scenarios[i].Work == 0 || len(order) == 1 {
			rest = append(rest, i)
			continue
		}
		beside.Add(1)
		go func() {
			defer beside.Done()
			run(i, func(e *strategytest.Env) (func(), error) {
				db, admin, done, err := opts.Database(ctx, meta.Name+"-"+scenarios[i].Name)
				if err != nil {
					return nil, fmt.Errorf("database for %s: %w", meta.Name, err)
				}
				rs, err := resourcetest.Start(ctx, meta)
				if err != nil {
					done()
					return nil, fmt.Errorf("resources for %s: %w", meta.Name, err)
				}
				e.DB, e.Admin, e.Resources = db, admin, rs
				return func() { rs.Close(); done() }, nil
			})
		}()
	}
	// The row's database is made when its first cell has its slot: some
	// forty strategies and controls are under way at once, and their pools
	// close what stays idle (pgtest.IdleClose) while they wait for the next.
	// A database that could not be made is every cell's error.
	var (
		db, admin *pgxpool.Pool
		dbDone    func()
		dbErr     error
	)
	defer func() {
		if dbDone != nil {
			dbDone()
		}
	}()
	for _, i := range rest {
		run(i, func(e *strategytest.Env) (func(), error) {
			if db == nil && dbErr == nil {
				db, admin, dbDone, dbErr = opts.Database(ctx, meta.Name)
				if dbErr != nil {
					dbErr = fmt.Errorf("database for %s: %w", meta.Name, dbErr)
				}
			}
			e.DB, e.Admin = db, admin
			return func() {}, dbErr
		})
	}
	beside.Wait()
	if opts.Logf != nil {
		opts.Logf("%-16s all scenarios but the exclusive ones in %v (from its first cell, slots shared)", meta.Name, time.Since(start).Round(time.Millisecond))
	}
	return sr
}

// costOnItsOwn measures meta's cost per reservation on a database and
// resources of its own: the scenarios' tables are created by Meta.Setup's
// owner role, which could not grant on tables the cost run had created
// first, and the scenarios running in the lanes meanwhile must not add to
// the commands its Redis counts.
func costOnItsOwn(ctx context.Context, opts Options, meta strategy.Meta) (c *Cost) {
	// The strategy's code runs here outside any scenario: a panic in it
	// must cost its cost column, not the table (the scenarios then report
	// it where it happens).
	defer func() {
		if p := recover(); p != nil {
			c = &Cost{Unmeasured: fmt.Sprintf("the strategy panicked: %v", p)}
		}
	}()
	db, admin, done, err := opts.Database(ctx, meta.Name+"-cost")
	if err != nil {
		return &Cost{Unmeasured: "database: " + err.Error()}
	}
	defer done()
	res, err := resourcetest.Start(ctx, meta)
	if err != nil {
		return &Cost{Unmeasured: "resources: " + err.Error()}
	}
	defer res.Close()
	for attempt := 1; ; attempt++ {
		c, err = measureCost(ctx, meta, db, admin, res, attempt)
		if !walGone(err) || attempt == 3 {
			break
		}
	}
	if err != nil {
		return &Cost{Unmeasured: err.Error()}
	}
	return c
}

// abandonGrace is how long a scenario may take to return after its
// deadline before the harness gives up on it.
const abandonGrace = 30 * time.Second

// runScenarioBounded is runScenario with an upper bound on the wall time
// even when the strategy ignores its context (a goroutine stuck on a lock
// of its own): past ScenarioTimeout + abandonGrace the cell is ERROR, the
// call is abandoned where it hangs, and abandoned reports it, so the
// strategy's remaining scenarios are not run either. A scenario that needs
// a server of its own first waits for its lane; its time starts once it
// has it, and the lane is free again when it returns or is abandoned.
func runScenarioBounded(ctx context.Context, opts Options, env strategytest.Env, in *strategytest.Scenario) (r *strategytest.Result, abandoned bool) {
	if in.ExclusiveServer && opts.ExclusiveDatabase != nil {
		lane, free, err := takeLane(ctx, in.Name)
		if err != nil {
			return errored(env.Meta, in, err), false
		}
		defer free()
		ctx = withLane(ctx, lane)
	}
	res := make(chan *strategytest.Result, 1)
	go func() { res <- runScenario(ctx, opts, env, in) }()
	timer := time.NewTimer(opts.scenarioTimeout() + abandonGrace)
	defer timer.Stop()
	select {
	case r := <-res:
		return r, false
	case <-timer.C:
		return errored(env.Meta, in, fmt.Errorf("did not return within %v of its %v deadline; abandoned", abandonGrace, opts.scenarioTimeout())), true
	}
}

// runScenario runs one cell of the table, turning an error, a panic or a
// timeout into an ERROR result.
func runScenario(ctx context.Context, opts Options, env strategytest.Env, in *strategytest.Scenario) (r *strategytest.Result) {
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			r = errored(env.Meta, in, fmt.Errorf("panic: %v\n%s", p, debug.Stack()))
		}
		if r.Error != "" {
			r.Elapsed = time.Since(start)
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, opts.scenarioTimeout())
	defer cancel()
	var err error
	if in.ExclusiveServer {
		r, err = runExclusive(ctx, opts, env, in)
	} else {
		r, err = strategytest.RunScenario(ctx, env, in)
	}
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (timeout %v)", err, opts.scenarioTimeout())
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

// runExclusive runs a scenario that crashes or reconfigures its server on
// its lane's server (the caller holds the lane).
func runExclusive(ctx context.Context, opts Options, env strategytest.Env, in *strategytest.Scenario) (*strategytest.Result, error) {
	if opts.ExclusiveDatabase == nil {
		return strategytest.RunScenario(ctx, env, in) // Env.Server is nil: reported as not supported
	}
	if laneOf(ctx) == "" {
		ctx = withLane(ctx, in.Name)
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

// skipped says why a scenario was not applicable to the control in this
// run (a slow fault under -short), or "".
func (c *ControlReport) skipped(scenario string) string {
	for _, r := range c.Results {
		if r.Scenario == scenario {
			return r.Skipped
		}
	}
	return ""
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
				if v.Claim == e.Claim && (e.Check == "" || v.Name == e.Check) {
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
