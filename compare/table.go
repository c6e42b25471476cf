package compare

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/compare/internal/controls"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

// TableOptions configure Table.
type TableOptions struct {
	// Strategies to run; nil means strategy.Registered(). A module of its
	// own passes its strategies here next to the registered ones.
	Strategies []strategy.Meta
	// Controls runs the negative controls too; the test fails when one of
	// them is not caught with the claim and scenario it must be caught by.
	Controls bool
	// Markdown and JSON receive the deterministic table (committed), LastRun
	// what varies between runs (ranges, timings, histories). Empty: not
	// written. Under -short, and when the server is one the harness does not
	// own (pgtest.EnvDSN), Markdown and JSON are written next to LastRun with
	// a ".short" or ".partial" suffix instead, so a committed table is never
	// overwritten by a smaller or partial one.
	Markdown, JSON, LastRun string
	// Parallel is how many cells (a scenario against a strategy or a
	// control) run at once (0 means 8 on the 2 cores CI has: a cell waits
	// on locks, round trips and holds part of the time), heaviest first
	// (slots.go). The paced scenarios have slots of their own, and the
	// scenarios that need a server of their own run in lanes beside them.
	Parallel int
	// Source says what the table's header links to (the zero value suits
	// this repository's docs/); a module of its own names its own command.
	Source Source
}

// tableNeeds is the least time the table asks of go test's -timeout: go
// test's default (10 minutes) leaves it enough, so that `go test ./compare`
// is the whole command. It took 2m10s on a 2-core VM alone on 2026-12-07.
const tableNeeds = 6 * time.Minute

// tableWrapUp is the time the table keeps from go test's deadline to end
// its cells, write what it has and say why, before go test's own timeout
// panics with nothing but stacks.
const tableWrapUp = 30 * time.Second

// Table runs table 28-1 as a test, on a real PostgreSQL that pgtest provides:
// every scenario against every strategy, each strategy on a database of its
// own, the server-crashing scenarios on a cluster of their own. It writes
// the table, then fails t for every violation of a claimed guarantee, every
// scenario that could not be run (ERROR), and every negative control that
// was not caught. One strategy's failure never hides another's row: the
// table is written first, for everyone. The test binary's TestMain must call
// pgtest.Main (or strategytest.Main).
func Table(t *testing.T, opts TableOptions) *Report {
	t.Helper()
	strategies := opts.Strategies
	if strategies == nil {
		strategies = strategy.Registered()
	}
	if len(strategies) == 0 {
		t.Fatal("no strategy to run: none is registered and TableOptions.Strategies is empty")
	}
	// A -timeout too short for the table ends it with a panic that names
	// no cause: say so at once instead (-short runs fewer trials).
	if d, ok := t.Deadline(); ok && !testing.Short() && time.Until(d) < tableNeeds {
		t.Fatalf("table 28-1 needs more time than go test's -timeout leaves it (%v): it took 2m10s on a 2-core VM alone, and more beside other tests; run `make table`, or go test -timeout 60m ./compare",
			time.Until(d).Round(time.Second))
	}
	// A bound on a hang, not a speed: make runs the table with -timeout 60m.
	// Within go test's own deadline, so that a table that runs past it on a
	// loaded machine ends its cells as ERRORs, written and named, rather
	// than in go test's panic.
	bound := 50 * time.Minute
	if d, ok := t.Deadline(); ok {
		bound = min(bound, time.Until(d)-tableWrapUp)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	srv := pgtest.Shared(t)
	newDB := databases(t, srv)
	exclusiveDB, partial := exclusiveDatabases(t)
	par := opts.Parallel
	if par == 0 {
		// With 3 the machine sat 49% idle over a table of 311 s (vmstat,
		// 2026-12-07): most checks wait on a hold, a lock or a bound, and
		// the controls run only the check they name. With 5 it was 34%
		// idle and the table took 216 s; once Redis's stalls no longer
		// spun a core, 49% idle again at 170 s, and with 8, 124 s, the
		// middle of the run under 10% idle. (In 2026-12-06's tree, when
		// each control ran every check, 4 had been slower than 3.)
		par = 8
	}

	start := time.Now()
	// The strategies and the controls take turns on the same par slots
	// (and the paced ones): a control's cell waits until no strategy's
	// does, so the controls fill the slots the strategies' tail leaves idle.
	slots := newSlots(par, pacedSlots)
	var controlReports []*ControlReport
	controlsDone := make(chan struct{})
	go func() {
		defer close(controlsDone)
		if opts.Controls {
			controlReports = runControls(ctx, Options{Short: testing.Short(), ShortScenarios: []string{"storm"}, Database: newDB, ExclusiveDatabase: exclusiveDB, Logf: t.Logf, slots: slots, control: true})
		}
	}()
	rep, err := Run(ctx, Options{Strategies: strategies, Short: testing.Short(), Database: newDB, ExclusiveDatabase: exclusiveDB, Logf: t.Logf, Cost: true, slots: slots})
	<-controlsDone
	if err != nil {
		t.Fatal(err)
	}
	rep.Controls = controlReports
	rep.Server = serverMajor(t, srv)
	rep.Source = opts.Source
	t.Logf("all strategies and controls in %v", time.Since(start).Round(time.Millisecond))

	writeTable(t, rep, opts, partial)
	for _, v := range rep.Violations() {
		t.Error(v)
	}
	for _, c := range rep.Controls {
		for i, e := range c.Expect {
			if c.Caught[i] {
				continue
			}
			if why := c.skipped(e.Scenario); testing.Short() && why != "" {
				t.Logf("negative control %s is not judged in %s, which is n/a under -short: %s", c.Meta.Name, e.Scenario, why)
				continue
			}
			msg := fmt.Sprintf("negative control %s (%s) was not caught: want a %s; it breaks: %s",
				c.Meta.Name, c.Case, e, c.Breaks)
			if testing.Short() && c.Race {
				// -short runs a few trials of each race: a miss there says
				// nothing about the full run, whose odds docs/detection.md
				// measures.
				t.Logf("-short: %s", msg)
				continue
			}
			t.Error(msg)
		}
	}
	return rep
}

// runControls runs each negative control against the scenarios that must
// catch it, on opts.slots, and judges them.
func runControls(ctx context.Context, opts Options) []*ControlReport {
	all := controls.All()
	out := make([]*ControlReport, len(all))
	sem := opts.slots
	var wg sync.WaitGroup
	for i, c := range all {
		cr := &ControlReport{StrategyReport: &StrategyReport{Meta: c.Meta}, Case: c.Case, Breaks: c.Breaks, Race: c.Race}
		stopOn := map[string][]strategy.Claims{}
		for _, e := range c.Expect {
			cr.Expect = append(cr.Expect, Expectation{Scenario: e.Scenario, Claim: e.Claim, Check: e.Check})
			stopOn[e.Scenario] = append(stopOn[e.Scenario], e.Claim)
		}
		out[i] = cr
		var scenarios []*strategytest.Scenario
		for _, name := range c.Scenarios() {
			scenarios = append(scenarios, strategytest.MustScenario(name))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			copts := opts
			copts.Admission = c.Admission
			copts.stopOn = stopOn
			copts.checks = map[string][]string{}
			for _, sc := range c.Scenarios() {
				copts.checks[sc] = c.Checks(sc)
			}
			cr.StrategyReport = runStrategy(ctx, copts, c.Meta, ordered(scenarios), sem)
			cr.Judge()
		}()
	}
	wg.Wait()
	return out
}

// databases gives each strategy its own database on the shared server: a
// pool as the application role for the strategy, a superuser pool for the
// harness's probes.
func databases(t *testing.T, srv *pgtest.Server) func(ctx context.Context, name string) (*pgxpool.Pool, *pgxpool.Pool, func(), error) {
	return func(ctx context.Context, name string) (*pgxpool.Pool, *pgxpool.Pool, func(), error) {
		d, err := srv.CreateDatabase(ctx, "rb_compare_"+strings.ReplaceAll(name, "-", "_"))
		if err != nil {
			return nil, nil, nil, err
		}
		db, err := pgtest.OpenPool(ctx, d.DSN, 32)
		if err != nil {
			return nil, nil, nil, err
		}
		admin, err := pgtest.OpenPool(ctx, d.AdminDSN, 4)
		if err != nil {
			db.Close()
			return nil, nil, nil, err
		}
		done := func() {
			strategytest.ForgetPools(db)
			if err := pgtest.CloseWithin(db, poolCloseWait); err != nil {
				// The trial that leaked it has a failed check; the pool
				// must only not hang the table.
				t.Logf("%s: %v", name, err)
			}
			admin.Close()
			if err := srv.DropDatabase(context.Background(), d.Name); err != nil {
				t.Errorf("%v", err)
			}
		}
		return db, admin, done, nil
	}
}

// poolCloseWait bounds the wait for a strategy's pool to close: a
// connection it leaked never comes back.
const poolCloseWait = 10 * time.Second

// exclusiveDatabases starts, on first use of each lane (lanes.go), a
// cluster of the harness's own for the scenarios that crash, fail over or
// reconfigure the server; they are stopped when the test ends. With
// pgtest.EnvDSN set those scenarios cannot run (the harness does not own
// that server): it returns nil and partial = true.
func exclusiveDatabases(t *testing.T) (open func(context.Context, string) (*pgxpool.Pool, *pgxpool.Pool, strategytest.ServerControl, func(), error), partial bool) {
	if os.Getenv(pgtest.EnvDSN) != "" {
		t.Logf("%s is set: server-crash, commit-timeout and the failovers need a server of their own and are reported n/a; the table is partial", pgtest.EnvDSN)
		return nil, true
	}
	if _, err := pgtest.FindBinDir(); err != nil {
		t.Logf("no local PostgreSQL binaries (%v): server-crash, commit-timeout and the failovers need a cluster the harness can crash and are reported n/a; the table is partial", err)
		return nil, true
	}
	// One server per lane (lanes.go), started on first use.
	type lane struct {
		once sync.Once
		srv  *pgtest.Server
		err  error
	}
	var mu sync.Mutex
	servers := map[string]*lane{}
	return func(ctx context.Context, name string) (*pgxpool.Pool, *pgxpool.Pool, strategytest.ServerControl, func(), error) {
		mu.Lock()
		l := servers[laneOf(ctx)]
		if l == nil {
			l = &lane{}
			servers[laneOf(ctx)] = l
		}
		mu.Unlock()
		l.once.Do(func() {
			s, err := pgtest.Start(ctx, pgtest.Options{})
			if err != nil {
				l.err = err
				return
			}
			t.Cleanup(func() {
				if err := s.Stop(); err != nil {
					t.Errorf("stop the exclusive server: %v", err)
				}
			})
			if s.Kind != pgtest.KindLocal {
				l.err = fmt.Errorf("the exclusive server is a %s server, not a local cluster", s.Kind)
				return
			}
			l.srv = s
		})
		if l.err != nil {
			return nil, nil, nil, nil, l.err
		}
		db, admin, done, err := databases(t, l.srv)(ctx, name)
		return db, admin, l.srv, done, err
	}, false
}

func serverMajor(t *testing.T, srv *pgtest.Server) string {
	m := regexp.MustCompile(`^\d+`).FindString(srv.Version)
	if m == "" {
		t.Fatalf("cannot read the major version from %q", srv.Version)
	}
	return m
}

// writeTable writes the report where opts says (see tablePaths).
func writeTable(t *testing.T, rep *Report, opts TableOptions, partial bool) {
	md, js, why := tablePaths(opts, testing.Short(), partial)
	if why != "" {
		t.Logf("%s: the committed table is left alone; this run's table goes to %s", why, md)
	}
	if md == "" && js == "" && opts.LastRun == "" {
		md = filepath.Join(t.TempDir(), "table-28-1.md")
	}
	for path, data := range map[string][]byte{md: rep.Markdown(), js: rep.JSON(false), opts.LastRun: rep.JSON(true)} {
		if path == "" {
			continue
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if testing.Short() {
		t.Logf("table 28-1 (-short):\n%s", rep.Markdown())
	} else {
		t.Logf("wrote %s, %s and %s", md, js, opts.LastRun)
	}
}

// tablePaths decides where the tables go. A table from -short inputs, or
// one without the server-crashing scenarios, goes next to LastRun with a
// ".short" or ".partial" suffix instead of over the committed one; why
// says which, or is "" when the committed paths are used.
func tablePaths(opts TableOptions, short, partial bool) (md, js, why string) {
	suffix := ""
	switch {
	case short:
		suffix, why = ".short", "-short run (smaller inputs)"
	case partial:
		suffix, why = ".partial", pgtest.EnvDSN+" run (server-crash, commit-timeout and the failovers need a server of their own)"
	default:
		return opts.Markdown, opts.JSON, ""
	}
	dir := os.TempDir()
	if opts.LastRun != "" {
		dir = filepath.Dir(opts.LastRun)
	}
	relocate := func(p string) string {
		if p == "" {
			return ""
		}
		ext := filepath.Ext(p)
		return filepath.Join(dir, strings.TrimSuffix(filepath.Base(p), ext)+suffix+ext)
	}
	return relocate(opts.Markdown), relocate(opts.JSON), why
}
