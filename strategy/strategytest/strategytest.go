// Package strategytest is the conformance kit for reservebench strategies and
// the harness behind table 28-1, in the manner of testing/fstest.TestFS: a
// strategy's own tests, in this repository or in a module of their own, call
// Run with its Meta and a way to get a fresh PostgreSQL database, and the kit
// runs every scenario of table 28-1 against it, judging each check against
// the strategy's Claims. It checks requirements 1, 2, 3 and 5 of the
// reservation contract, bad input, the deployment config, and the session
// semantics when the strategy holds attempts open.
//
//	func TestMain(m *testing.M) { strategytest.Main(m) }
//
//	func TestConformance(t *testing.T) {
//		strategytest.Run(t, mystrategy.Meta(), pgtest.Pools)
//	}
//
// A broken claim fails the test with the strategy, scenario, trial, counts
// and the history excerpt that broke it. A boundary the strategy does not
// claim is logged, not failed. A scenario whose capability is missing is
// skipped with the name of the missing interface.
//
// The scenarios are JSON files embedded in this package (scenarios/*.json;
// Scenarios loads them). RunScenario runs one against one strategy and
// returns a Result: its checks, each judged against the claims (holds,
// observed, VIOLATION), and the deterministic facts table 28-1 shows.
// Package compare runs them all against every registered strategy.
//
// A strategy that needs more than PostgreSQL (Meta.Needs: a Redis) gets it
// from package resourcetest, real and of its own, and helper processes
// attach with the same addresses. A BUSY answer counts as a definite
// refusal with nothing written, like SOLD_OUT.
package strategytest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/resourcetest"
	"github.com/reservebench/reservebench/strategy"
)

// RaceRepetitions is how often the kit repeats scenarios marked "race"
// (duplicate key, user limit) at least. Each trial already runs its race
// dozens of times behind the gate (gate.go), which docs/detection.md
// measures; the repetitions add fresh deployments on top.
const RaceRepetitions = 12

// NewDB returns a fresh database for the kit: db is what the strategy gets
// (ideally a non-superuser role, with room for at least 8 connections) and
// admin is used for the kit's lock probes (pg_blocking_pids); it may be db.
// pgtest.Pools has this signature.
type NewDB func(tb testing.TB) (db, admin *pgxpool.Pool)

// Options tune RunWith and Verify. The zero value is what Run uses.
type Options struct {
	// Short runs fewer repetitions (Verify only; RunWith follows -short).
	Short bool
	// RaceRepetitions overrides RaceRepetitions when > 0.
	RaceRepetitions int
	// Only runs just these scenarios (by name) when non-empty.
	Only []string
	// Skip leaves these scenarios out (by name).
	Skip []string
	// Logf gets progress lines (Verify only; RunWith logs to t).
	Logf func(format string, args ...any)
}

func (o Options) wants(name string) bool {
	return (len(o.Only) == 0 || contains(o.Only, name)) && !contains(o.Skip, name)
}

// ErrUnknownScenario is returned (Verify) or fails the test (RunWith) when
// Options.Only or Options.Skip names no scenario: a misspelt name would
// otherwise run nothing, or skip nothing, and pass.
var ErrUnknownScenario = errors.New("strategytest: no scenario of that name")

// ErrUnknownCheck is returned by RunScenario when Env.Checks names a
// check the scenario does not have.
var ErrUnknownCheck = errors.New("strategytest: no check of that name")

// checkNames reports the names of Only and Skip that are no scenario of ins.
func (o Options) checkNames(ins []*Scenario) error {
	known := make(map[string]bool, len(ins))
	for _, in := range ins {
		known[in.Name] = true
	}
	var bad []string
	for _, n := range append(append([]string(nil), o.Only...), o.Skip...) {
		if !known[n] {
			bad = append(bad, fmt.Sprintf("%q", n))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	names := make([]string, 0, len(ins))
	for _, in := range ins {
		names = append(names, in.Name)
	}
	return fmt.Errorf("%w: Options.Only or Options.Skip names %s; the scenarios are %s", ErrUnknownScenario, strings.Join(bad, ", "), strings.Join(names, ", "))
}

// Run runs the kit as subtests of t: every scenario, the deployment's own
// contract (configs, Attach, Restart, sessions) among them. The scenarios
// that crash, fail over or reconfigure the server (server-crash, commit-timeout, failover-*) run on a throwaway cluster the kit starts
// for them when local PostgreSQL binaries are found (pgtest.Start); against
// a server named by pgtest.EnvDSN they are skipped. The test binary's
// TestMain must call Main, so the kill scenarios' helper processes work.
// Under -short, and under the race detector (which multiplies the cost of
// every goroutine), it runs the scenarios' -short sizes: the same checks on
// fewer repetitions and smaller storms.
func Run(t *testing.T, meta strategy.Meta, newDB NewDB) {
	t.Helper()
	RunWith(t, meta, newDB, Options{})
}

// RunWith is Run with options: a subset of the scenarios, more race
// repetitions.
func RunWith(t *testing.T, meta strategy.Meta, newDB NewDB, opts Options) {
	t.Helper()
	db, admin := newDB(t)
	db, lp := leastPrivilegeFor(t, meta, db, admin)
	res := resourcetest.New(t, meta) // what the strategy needs besides PostgreSQL
	ins, err := Scenarios()
	if err != nil {
		t.Fatal(err)
	}
	if err := opts.checkNames(ins); err != nil {
		t.Fatal(err)
	}
	var own *ownServer
	parent := t
	for _, in := range ins {
		if !opts.wants(in.Name) {
			continue
		}
		t.Run(in.Name, func(t *testing.T) {
			// Under the race detector every goroutine costs several times
			// more; the kit then runs the -short sizes (its checks are the
			// same), and the full sizes run in compare's table.
			env := Env{Meta: meta, DB: db, Admin: admin, Resources: res, Short: testing.Short() || raceDetector, Logf: t.Logf, lp: lp}
			if in.ExclusiveServer {
				if own == nil {
					own = startOwnServer(parent)
				}
				env = own.env(t, env)
			}
			r, err := runOne(context.Background(), env, in, opts)
			if err != nil {
				t.Fatal(err)
			}
			Report(t, r)
		})
	}
}

// ownServer is the cluster Run starts for the scenarios that crash it.
type ownServer struct {
	srv *pgtest.Server
	why string // why there is none
}

func startOwnServer(t *testing.T) *ownServer {
	if os.Getenv(pgtest.EnvDSN) != "" {
		return &ownServer{why: pgtest.EnvDSN + " names a server the kit does not own"}
	}
	if _, err := pgtest.FindBinDir(); err != nil {
		return &ownServer{why: "no local PostgreSQL binaries to start a cluster of its own: " + err.Error()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		t.Fatalf("start a cluster for the server-crashing scenarios: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("stop the kit's own cluster: %v", err)
		}
	})
	return &ownServer{srv: srv}
}

// env points env at a fresh database on the kit's own cluster, or leaves
// env.Server nil (the scenario is then reported n/a with the reason).
func (o *ownServer) env(t *testing.T, env Env) Env {
	if o.srv == nil {
		t.Logf("%s is skipped: %s", t.Name(), o.why)
		return env
	}
	d := pgtest.NewDatabaseOn(t, o.srv)
	env.DB, env.Admin, env.Server, env.lp = d.Pool(t, 32), d.AdminPool(t, 4), o.srv, nil
	t.Cleanup(func() { ForgetPools(env.DB) })
	return env
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
// failing anything: for tests about the kit itself and for tools. The
// resources the strategy needs are started for the run and stopped after.
func Verify(ctx context.Context, meta strategy.Meta, db, admin *pgxpool.Pool, opts Options) ([]*Result, error) {
	ins, err := Scenarios()
	if err != nil {
		return nil, err
	}
	if err := opts.checkNames(ins); err != nil {
		return nil, err
	}
	res, err := resourcetest.Start(ctx, meta)
	if err != nil {
		return nil, err
	}
	defer res.Close()
	var out []*Result
	for _, in := range ins {
		if !opts.wants(in.Name) {
			continue
		}
		env := Env{Meta: meta, DB: db, Admin: admin, Resources: res, Short: opts.Short, Logf: opts.Logf}
		r, err := runOne(ctx, env, in, opts)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

func runOne(ctx context.Context, env Env, in *Scenario, opts Options) (*Result, error) {
	if in.Race && !env.Short {
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

var kitSeq atomic.Int64

// kitSKU names a SKU no scenario uses.
func kitSKU(prefix string) string {
	return fmt.Sprintf("kit-%s-%d-%d", prefix, time.Now().UnixNano()%1e9, kitSeq.Add(1))
}
