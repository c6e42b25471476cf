// Package strategytest is the conformance kit for reservebench strategies,
// in the manner of testing/fstest.TestFS: a strategy's own tests call Run
// with its Meta and a way to get a fresh PostgreSQL database, and the kit
// runs every scenario of table 28-1 against it, judging each check against
// the strategy's Claims. It checks requirements 1, 2, 3 and 5 of the
// reservation contract, bad input, the deployment config, and the session
// semantics when the strategy holds attempts open.
//
//	func TestConformance(t *testing.T) {
//		strategytest.Run(t, mystrategy.Meta(), pgtest.Pools)
//	}
//
// A broken claim fails the test with the strategy, scenario, trial, counts
// and the history excerpt that broke it. A boundary the strategy does not
// claim is logged, not failed. A scenario whose capability is missing is
// skipped with the name of the missing interface.
package strategytest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// RaceRepetitions is how often the kit repeats scenarios marked "race"
// (duplicate key, user limit): their failures are intermittent, so every one
// of at least this many trials must be exact.
const RaceRepetitions = 50

// NewDB returns a fresh database for the kit: db is what the strategy gets
// (ideally a non-superuser role, with room for at least 8 connections) and
// admin is used for the kit's lock probes (pg_blocking_pids); it may be db.
// pgtest.Pools has this signature.
type NewDB func(tb testing.TB) (db, admin *pgxpool.Pool)

// Options tune Verify. The zero value is what Run uses, except Short, which
// Run takes from testing.Short().
type Options struct {
	Short bool
	// RaceRepetitions overrides RaceRepetitions when > 0.
	RaceRepetitions int
	// Only runs just these scenarios (by name) when non-empty.
	Only []string
	Logf func(format string, args ...any)
}

// Run runs the kit as subtests of t.
func Run(t *testing.T, meta strategy.Meta, newDB NewDB) {
	t.Helper()
	db, admin := newDB(t)
	t.Run("config", func(t *testing.T) { checkConfig(t, meta, db) })
	t.Run("session", func(t *testing.T) { checkSession(t, meta, db) })
	ins, err := Scenarios()
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range ins {
		t.Run(in.Name, func(t *testing.T) {
			r, err := runOne(context.Background(), meta, db, admin, in, Options{Short: testing.Short(), Logf: t.Logf})
			if err != nil {
				t.Fatal(err)
			}
			Report(t, r)
		})
	}
}

// Report turns a scenario result into test output: skipped, a failure per
// violation, a log line per observed boundary.
func Report(t testing.TB, r *Result) {
	t.Helper()
	if r.Skipped != "" {
		t.Skipf("%s: %s", r.Scenario, r.Skipped)
	}
	for _, c := range r.Violations() {
		t.Error(r.Failure(c))
	}
	for _, c := range r.Observations() {
		t.Logf("boundary observed (not claimed by %s): %s: %s", r.Strategy, c.What, c.Detail)
	}
	for _, f := range r.Facts {
		t.Logf("%s: %s", f.Name, f.Value)
	}
}

// Verify runs the scenarios against meta and returns their results without
// failing anything: for tests about the kit itself and for tools.
func Verify(ctx context.Context, meta strategy.Meta, db, admin *pgxpool.Pool, opts Options) ([]*Result, error) {
	ins, err := Scenarios()
	if err != nil {
		return nil, err
	}
	var out []*Result
	for _, in := range ins {
		if len(opts.Only) > 0 && !contains(opts.Only, in.Name) {
			continue
		}
		r, err := runOne(ctx, meta, db, admin, in, opts)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

func runOne(ctx context.Context, meta strategy.Meta, db, admin *pgxpool.Pool, in *Scenario, opts Options) (*Result, error) {
	env := Env{Meta: meta, DB: db, Admin: admin, Short: opts.Short, Logf: opts.Logf}
	if in.Race && !opts.Short {
		env.Repetitions = max(in.Repetitions, RaceRepetitions)
		if opts.RaceRepetitions > 0 {
			env.Repetitions = opts.RaceRepetitions
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	return RunScenario(ctx, env, in)
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

var kitSeq int

// kitSKU names a SKU no scenario uses.
func kitSKU(prefix string) string {
	kitSeq++
	return fmt.Sprintf("kit-%s-%d-%d", prefix, time.Now().UnixNano()%1e9, kitSeq)
}
