package compare_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/compare"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

// TestErrorsAreVerdicts: a strategy whose setup fails, that panics, or
// whose Open returns neither a deployment nor an error, is an ERROR in the
// scenarios it could not run and has no cost (the cost run, outside any
// scenario, once took the whole table down with a nil deployment); the
// other strategies' cells are still run, and the report's violations name
// the broken one.
func TestErrorsAreVerdicts(t *testing.T) {
	t.Parallel() // beside the table: mostly waits
	broken := func(name string, open func(context.Context, strategy.Config) (strategy.Deployment, error)) strategy.Meta {
		return strategy.Meta{Name: name, Description: "broken on purpose", Claims: strategy.NoOversell, Open: open}
	}
	metas := []strategy.Meta{
		broken("setup-fails", func(context.Context, strategy.Config) (strategy.Deployment, error) {
			return nil, errors.New("the schema cannot be created")
		}),
		broken("panics", func(context.Context, strategy.Config) (strategy.Deployment, error) { panic("boom") }),
		broken("opens-nothing", func(context.Context, strategy.Config) (strategy.Deployment, error) { return nil, nil }),
		broken("panics-in-reserve", func(_ context.Context, cfg strategy.Config) (strategy.Deployment, error) {
			return panicking{cfg}, nil
		}),
	}
	if m, ok := strategy.Lookup("hotrow"); ok {
		metas = append(metas, m)
		// A Restart that panics while requests are in flight: the kit calls
		// it from a goroutine of its own (restart-in-flight).
		metas = append(metas, strategy.Meta{Name: "panics-in-restart", Description: "broken on purpose",
			Claims: m.Claims | strategy.SurvivesRestart,
			Open: func(ctx context.Context, cfg strategy.Config) (strategy.Deployment, error) {
				d, err := m.Open(ctx, cfg)
				return restartPanics{d}, err
			}})
	}
	srv := pgtest.Shared(t)
	rep, err := compare.Run(context.Background(), compare.Options{
		Strategies: metas,
		Scenarios:  []*strategytest.Scenario{strategytest.MustScenario("bad-input"), strategytest.MustScenario("contention"), strategytest.MustScenario("restart-in-flight")},
		Database: func(ctx context.Context, name string) (*pgxpool.Pool, *pgxpool.Pool, func(), error) {
			d := pgtest.NewDatabaseOn(t, srv)
			return d.Pool(t, 8), d.AdminPool(t, 2), func() {}, nil
		},
		Cost: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Strategies {
		if broken := s.Meta.Description == "broken on purpose" && s.Meta.Name != "panics-in-restart"; broken && (s.Cost == nil || s.Cost.Unmeasured == "") {
			t.Errorf("%s has a cost: %+v", s.Meta.Name, s.Cost)
		}
		for _, r := range s.Results {
			got, want := r.Verdict(), strategytest.Errored
			switch {
			case r.Scenario == "restart-in-flight" && s.Meta.Name != "panics-in-restart":
				continue // not what this case is about
			case s.Meta.Name == "hotrow", s.Meta.Name == "panics-in-restart" && r.Scenario != "restart-in-flight":
				want = strategytest.Holds
			}
			if got != want {
				t.Errorf("%s in %s: verdict %s, want %s (%s)", s.Meta.Name, r.Scenario, got, want, r.Error)
			}
		}
	}
	all := strings.Join(rep.Violations(), "\n")
	for _, want := range []string{"ERROR: strategy setup-fails, scenario bad-input", "the schema cannot be created", "ERROR: strategy panics", "panic: boom", "ERROR: strategy opens-nothing",
		"ERROR: strategy panics-in-reserve, scenario contention", "reserve panics (in a concurrent call)",
		"ERROR: strategy panics-in-restart, scenario restart-in-flight", "restart panics (in a concurrent call)"} {
		if !strings.Contains(all, want) {
			t.Errorf("violations lack %q:\n%s", want, all)
		}
	}
	if md := string(rep.Markdown()); !strings.Contains(md, "| `panics` | – | could not be run: panic: boom | ERROR |") {
		t.Errorf("the table does not show the ERROR cell:\n%s", md)
	}
}

// panicking is a deployment whose every Reserve panics: in contention the
// harness calls it from 120 goroutines at once.
type panicking struct{ cfg strategy.Config }

func (p panicking) Node(i int) strategy.Strategy { strategy.CheckNode(i, p.cfg.NodeCount()); return p }
func (p panicking) Close() error                 { return nil }
func (p panicking) Audit(context.Context) ([]strategy.StockAudit, error) {
	var out []strategy.StockAudit
	for _, s := range p.cfg.Stock {
		out = append(out, strategy.StockAudit{SKU: s.SKU, Total: s.Total, Available: s.Total})
	}
	return out, nil
}
func (p panicking) Reserve(_ context.Context, req strategy.Request) (strategy.Result, error) {
	if err := req.Validate(); err != nil {
		return strategy.BadRequest(err)
	}
	for _, s := range p.cfg.Stock {
		if s.SKU == req.SKU {
			panic("reserve panics")
		}
	}
	return strategy.BadRequest(strategy.UnknownSKU(req.SKU))
}
func (p panicking) Lookup(_ context.Context, key string) (strategy.Reservation, error) {
	return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, nil
}

// restartPanics is a working deployment whose Restart panics.
type restartPanics struct{ strategy.Deployment }

func (restartPanics) Restart(context.Context, int) error { panic("restart panics") }

// TestHangIsNotWaitedForAgain: a strategy whose every call waits until its
// caller gives up runs into the deadline of the first scenario it is run
// in, and is not run in the others: the table waits for a hang once, not
// once a scenario (a hidden deadlock would otherwise hold the table for
// ScenarioTimeout times the scenarios).
func TestHangIsNotWaitedForAgain(t *testing.T) {
	t.Parallel() // beside the table: a 3 s wait
	const timeout = 3 * time.Second
	hang := strategy.Meta{Name: "hangs", Description: "broken on purpose", Claims: strategy.NoOversell,
		Open: func(_ context.Context, cfg strategy.Config) (strategy.Deployment, error) { return hanging{cfg}, nil }}
	srv := pgtest.Shared(t)
	names := []string{"sell-out", "contention", "user-limit"}
	var scenarios []*strategytest.Scenario
	for _, n := range names {
		scenarios = append(scenarios, strategytest.MustScenario(n))
	}
	rep, err := compare.Run(context.Background(), compare.Options{
		Strategies: []strategy.Meta{hang},
		Scenarios:  scenarios,
		Database: func(ctx context.Context, name string) (*pgxpool.Pool, *pgxpool.Pool, func(), error) {
			d := pgtest.NewDatabaseOn(t, srv)
			return d.Pool(t, 8), d.AdminPool(t, 2), func() {}, nil
		},
		ScenarioTimeout: timeout,
	})
	if err != nil {
		t.Fatal(err)
	}
	ran, skipped := 0, 0
	for _, r := range rep.Strategies[0].Results {
		if r.Verdict() != strategytest.Errored {
			t.Errorf("%s: verdict %s, want ERROR", r.Scenario, r.Verdict())
		}
		switch {
		case strings.Contains(r.Error, "timeout "+timeout.String()):
			ran++
		case strings.Contains(r.Error, "a strategy that hung once is not waited for again"):
			skipped++
		default:
			t.Errorf("%s: %s; want the deadline, or not run after it", r.Scenario, r.Error)
		}
	}
	if ran != 1 || skipped != len(names)-1 {
		t.Errorf("%d scenarios ran into the deadline and %d were not run; want 1 and %d", ran, skipped, len(names)-1)
	}
}

// hanging is a deployment whose every call waits until its context ends.
type hanging struct{ cfg strategy.Config }

func (h hanging) Node(i int) strategy.Strategy { strategy.CheckNode(i, h.cfg.NodeCount()); return h }
func (h hanging) Close() error                 { return nil }
func (h hanging) Audit(ctx context.Context) ([]strategy.StockAudit, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
func (h hanging) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	<-ctx.Done()
	return strategy.Result{}, ctx.Err()
}
func (h hanging) Lookup(ctx context.Context, key string) (strategy.Reservation, error) {
	<-ctx.Done()
	return strategy.Reservation{}, ctx.Err()
}
