package compare_test

import (
	"bytes"
	"flag"
	"os"
	"testing"

	"github.com/reservebench/reservebench/compare"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestRenderGolden pins the layout of table 28-1 on a hand-made report, so a
// change to the renderer shows up as a diff of testdata/render.golden.md
// (a .got file is written next to it on mismatch; -update accepts it).
func TestRenderGolden(t *testing.T) {
	in := []*strategytest.Scenario{
		{Name: "contention", Case: "C28-13", Title: "120 users, 40 units", Summary: "counts"},
		{Name: "phantom", Case: "C28-14", Title: "2 units, t1 holds", Summary: "boundary"},
	}
	meta := func(name string, claims strategy.Claims) strategy.Meta {
		return strategy.Meta{Name: name, Description: "mechanism of " + name, Correctness: "why " + name + " is right", Claims: claims,
			Isolation: "read committed", Retry: "none"}
	}
	res := func(s, name string, claims strategy.Claims, facts []strategytest.Fact, checks ...*strategytest.Check) *strategytest.Result {
		return &strategytest.Result{Scenario: s, Case: "C", Strategy: name, Claims: claims, Trials: 1, Facts: facts, Checks: checks}
	}
	a := strategy.NoOversell | strategy.NoPhantomSoldOut
	b := strategy.NoOversell | strategy.NoWait
	rep := &compare.Report{
		Server:    "15",
		Scenarios: in,
		Strategies: []*compare.StrategyReport{
			{Meta: meta("alpha", a), Cost: &compare.Cost{Reservations: 20, RoundTrips: 20, Statements: 30, RowsWritten: 40, WALFlushes: 21}, Results: []*strategytest.Result{
				res("contention", "alpha", a, []strategytest.Fact{{Name: "storm", Value: "HELD 40, SOLD_OUT 80"}}),
				res("phantom", "alpha", a, []strategytest.Fact{{Name: "seed order: t1, t2", Value: "t2 HELD after waiting"}},
					&strategytest.Check{Claims: "no-wait", What: "no waiting", Trials: 2, Failed: 1, Verdict: strategytest.Observed, Detail: "t2 waited"}),
			}},
			{Meta: meta("beta", b), Cost: &compare.Cost{Unmeasured: "pg_walinspect is not available"}, Results: []*strategytest.Result{
				res("contention", "beta", b, []strategytest.Fact{{Name: "storm", Value: "HELD 40 | HELD 39"}},
					&strategytest.Check{Claims: "no-oversell", What: "active <= total", Trials: 1, Failed: 1, Verdict: strategytest.Violation, Detail: "41 > 40"}),
				{Scenario: "phantom", Strategy: "beta", Skipped: "strategy does not implement SessionOpener"},
			}},
		},
		Controls: []*compare.ControlReport{{
			StrategyReport: &compare.StrategyReport{Meta: meta("ctl", a)},
			Case:           "C28-10", Breaks: "no status check",
			Expect: []compare.Expectation{{Scenario: "contention", Claim: strategy.NoOversell}},
			Caught: []bool{true},
		}},
	}
	got := rep.Markdown()
	if !bytes.Equal(got, rep.Markdown()) {
		t.Fatal("rendering the same report twice gave different bytes")
	}
	const golden = "testdata/render.golden.md"
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./compare -run TestRenderGolden -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		_ = os.WriteFile(golden+".got", got, 0o644)
		t.Errorf("table layout differs from %s; see %s.got, and rerun with -update if the change is intended", golden, golden)
	}
}
