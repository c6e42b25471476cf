package controls_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/compare/internal/controls"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/resourcetest"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

func TestMain(m *testing.M) { strategytest.Main(m) }

// envDetect sets how many times TestDetectionRates runs each control's
// scenarios; unset, the test is skipped (`make detect` sets it).
const envDetect = "RESERVEBENCH_DETECT"

// detectionDoc is where TestDetectionRates writes its report.
const detectionDoc = "../../../docs/detection.md"

// knownEscapes heads the section of detectionDoc written by hand, which
// TestDetectionRates keeps.
const knownEscapes = "## Known escapes"

// ownServer starts a cluster of the test's own, as go test ./compare does
// for the scenarios marked exclusive_server, stopped when the test ends.
func ownServer(t *testing.T) *pgtest.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		t.Fatalf("a server of the test's own: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("stop the test's own server: %v", err)
		}
	})
	return srv
}

// ownDatabase is a fresh database on srv, dropped when the test ends.
func ownDatabase(t *testing.T, srv *pgtest.Server) (db, admin *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	d, err := srv.CreateDatabase(ctx, "rb_detect")
	if err != nil {
		t.Fatal(err)
	}
	if db, err = pgtest.OpenPool(ctx, d.DSN, 32); err != nil {
		t.Fatal(err)
	}
	if admin, err = pgtest.OpenPool(ctx, d.AdminDSN, 4); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		strategytest.ForgetPools(db)
		db.Close()
		admin.Close()
		_ = srv.DropDatabase(context.Background(), d.Name)
	})
	return db, admin
}

// TestEveryClaimHasAControl: every claim a strategy can make has at least
// one negative control that must be flagged with it.
func TestEveryClaimHasAControl(t *testing.T) {
	covered := map[strategy.Claims][]string{}
	for _, c := range controls.All() {
		for _, e := range c.Expect {
			covered[e.Claim] = append(covered[e.Claim], c.Meta.Name+" in "+e.Scenario)
		}
	}
	for _, claim := range strategy.ClaimsAll.List() {
		if len(covered[claim]) == 0 {
			t.Errorf("claim %s has no negative control", claim)
		}
	}
	names := map[string]bool{}
	for _, c := range controls.All() {
		if names[c.Meta.Name] {
			t.Errorf("control %s twice", c.Meta.Name)
		}
		names[c.Meta.Name] = true
		for _, s := range c.Scenarios() {
			strategytest.MustScenario(s)
		}
		for _, e := range c.Expect {
			if !c.Meta.Claims.Has(e.Claim) {
				t.Errorf("control %s must be caught with %s, which it does not claim", c.Meta.Name, strategytest.ClaimName(e.Claim))
			}
		}
	}
}

// TestDetectionRates runs every control's scenarios many times, exactly as
// `go test ./compare` runs them (the scenario's repetitions, not -short),
// and reports for each expectation how many trials flagged it: the
// per-trial detection rate, and from it the chance that one run of
// `go test ./compare` misses the control.
func TestDetectionRates(t *testing.T) {
	runs, _ := strconv.Atoi(os.Getenv(envDetect))
	if runs <= 0 {
		t.Skipf("set %s=N to run every control's scenarios N times (make detect)", envDetect)
	}
	type tally struct {
		control, scenario, claim string
		race                     bool
		trials, caught           int // trials in which a check of the claim failed (the most of any one check)
		runsPerTable             int // trials of the scenario in one go test ./compare
		runsMissed               int // runs (a whole scenario: all its trials) with no flag
		runs                     int
	}
	var rows []*tally
	start := time.Now()
	for _, c := range controls.All() {
		byKey := map[string]*tally{}
		for _, e := range c.Expect {
			k := e.Scenario + "|" + strategytest.ClaimName(e.Claim)
			if byKey[k] == nil {
				byKey[k] = &tally{control: c.Meta.Name, scenario: e.Scenario, claim: strategytest.ClaimName(e.Claim), race: c.Race}
				rows = append(rows, byKey[k])
			}
		}
		t.Run(c.Meta.Name, func(t *testing.T) {
			db, admin := pgtest.Pools(t) // closed when the subtest ends
			res := resourcetest.New(t, c.Meta)
			var own *pgtest.Server // for the scenarios that crash, fail over or reconfigure their server
			for run := 0; run < runs; run++ {
				var results []*strategytest.Result
				for _, name := range c.Scenarios() {
					in := strategytest.MustScenario(name)
					env := strategytest.Env{Meta: c.Meta, DB: db, Admin: admin, Resources: res, Short: name == "storm", Admission: c.Admission, Checks: c.Checks(name)}
					if in.ExclusiveServer {
						if own == nil {
							own = ownServer(t)
						}
						env.DB, env.Admin = ownDatabase(t, own)
						env.Server = own
					}
					r, err := strategytest.RunScenario(context.Background(), env, in)
					if err != nil {
						t.Fatalf("%s run %d: %v", c.Meta.Name, run, err)
					}
					results = append(results, r)
				}
				for _, r := range results {
					for _, e := range c.Expect {
						if e.Scenario != r.Scenario {
							continue
						}
						tl := byKey[e.Scenario+"|"+strategytest.ClaimName(e.Claim)]
						best := 0
						for _, ch := range r.Checks {
							if ch.Claim == e.Claim && (e.Check == "" || ch.Name == e.Check) && ch.Verdict == strategytest.Violation {
								best = max(best, ch.Failed)
							}
						}
						tl.trials += r.Trials
						tl.caught += min(best, r.Trials)
						tl.runsPerTable = r.Trials
						tl.runs++
						if best == 0 {
							tl.runsMissed++
						}
					}
				}
			}
		})
		t.Logf("%s: %d runs, %v so far", c.Meta.Name, runs, time.Since(start).Round(time.Second))
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].control < rows[j].control })

	var b strings.Builder
	fmt.Fprintf(&b, "# Detection power of the negative controls\n\n")
	fmt.Fprintf(&b, "<!-- Generated by `make detect` (compare/internal/controls/detection_test.go, %s=%d). -->\n\n", envDetect, runs)
	fmt.Fprintf(&b, "Each negative control (compare/internal/controls) is a correct strategy with one deliberate\n")
	fmt.Fprintf(&b, "mistake, claiming the guarantee it breaks. Here every control's scenarios ran %d times, exactly as\n", runs)
	fmt.Fprintf(&b, "`go test ./compare` runs them, but every trial to its end (`go test ./compare` ends a control's\n")
	fmt.Fprintf(&b, "scenario at its first trial, or deployment-contract part, with the expected violation: the\n")
	fmt.Fprintf(&b, "chance of a miss is the same). In deployment-contract a control names the check that must\n")
	fmt.Fprintf(&b, "catch it (table 28-1 prints it beside the claim), the scenario runs that check alone (with any\n")
	fmt.Fprintf(&b, "it reads the work of), and only that check failing counts. A *trial* is one repetition of a scenario on a fresh deployment;\n")
	fmt.Fprintf(&b, "*caught* counts trials in which a check of the expected claim (the named one, where a check is\n")
	fmt.Fprintf(&b, "named) failed (the most of any one check, so a lower bound).\n\n")
	fmt.Fprintf(&b, "A *deterministic* mistake shows in every trial by construction (the scenario drives the exact\n")
	fmt.Fprintf(&b, "sequence that exposes it); a *race* needs an interleaving, which the scenario provokes many\n")
	fmt.Fprintf(&b, "times per trial behind the gate (strategy/strategytest/gate.go). For a race, *P(miss per\n")
	fmt.Fprintf(&b, "table run)* is the chance that one `go test ./compare` misses the control in that scenario:\n")
	fmt.Fprintf(&b, "the per-trial miss rate raised to the trials of one run, where the per-trial miss rate is\n")
	fmt.Fprintf(&b, "the observed one, or, when every trial was caught, its 95%% upper bound 1 - 0.05^(1/n) for\n")
	fmt.Fprintf(&b, "n trials (so it is an upper bound on the miss, and shrinks as `make detect` runs longer).\n\n")
	fmt.Fprintf(&b, "| control | scenario | claim | mistake | runs caught | trials caught | per-trial rate | trials per run | P(miss per table run) |\n")
	fmt.Fprintf(&b, "| --- | --- | --- | --- | --- | --- | --- | ---: | --- |\n")
	for _, r := range rows {
		rate := float64(r.caught) / float64(max(r.trials, 1))
		kind, pMiss := "deterministic", "0 (by construction)"
		if r.race {
			kind = "race"
			missTrial, bound := 1-rate, ""
			if r.caught == r.trials {
				missTrial, bound = 1-math.Pow(0.05, 1/float64(max(r.trials, 1))), "< "
			}
			pMiss = fmt.Sprintf("%s%.1e", bound, math.Pow(missTrial, float64(r.runsPerTable)))
		}
		if r.caught < r.trials && !r.race {
			// A scenario whose trials take turns over faults (partition)
			// shows some mistakes only in the trials of one fault: every run
			// has them, so every run must catch it.
			kind = "deterministic per run (the trials of one fault)"
			pMiss = fmt.Sprintf("missed in %d trials", r.trials-r.caught)
			if r.runsMissed == 0 {
				pMiss = "0 (every run has those trials)"
			}
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %d of %d | %d of %d | %.3f | %d | %s |\n",
			r.control, r.scenario, r.claim, kind, r.runs-r.runsMissed, r.runs, r.caught, r.trials, rate, r.runsPerTable, pMiss)
		if r.runsMissed > 0 {
			t.Errorf("%s in %s (%s): missed in %d of %d runs", r.control, r.scenario, r.claim, r.runsMissed, r.runs)
		}
		if !r.race && r.caught < r.trials {
			t.Logf("%s in %s (%s): a deterministic mistake shows in %d of %d trials (those of the faults that expose it)", r.control, r.scenario, r.claim, r.caught, r.trials)
		}
	}
	fmt.Fprintf(&b, "\nMeasured in %v on PostgreSQL %s.\n", time.Since(start).Round(time.Second), pgtest.Shared(t).Version)
	// The known escapes are written by hand: kept as they are.
	if old, err := os.ReadFile(detectionDoc); err == nil {
		if i := strings.Index(string(old), "\n"+knownEscapes); i >= 0 {
			b.WriteString(string(old[i:]))
		}
	}
	if err := os.WriteFile(detectionDoc, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s:\n%s", detectionDoc, b.String())
}

// TestControlNamesUnique: a control's name is its row in table 28-1 and
// how the kill scenarios' helper processes find it (RegisterForHelpers):
// two controls of one name would share a row, and a helper would run the
// wrong one. One such pair was written and caught only by a docs table.
func TestControlNamesUnique(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range controls.All() {
		if seen[c.Meta.Name] {
			t.Errorf("two negative controls are named %q", c.Meta.Name)
		}
		seen[c.Meta.Name] = true
	}
}
