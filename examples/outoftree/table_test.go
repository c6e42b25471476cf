// Package outoftree holds the tests of the example module as a whole: table
// 28-1 with its own strategy next to the built-in ones, and the check that
// docs/adding-a-strategy.md quotes this module's code as it is.
package outoftree

import (
	"testing"

	_ "github.com/reservebench/reservebench/all" // the built-in strategies
	"github.com/reservebench/reservebench/compare"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"

	"example.com/outoftree/ssicount" // registers itself from init
)

func TestMain(m *testing.M) { strategytest.Main(m) }

// checked are the rows TestTable28_1 wants, each without ERROR: this
// module's strategy and five built-in ones.
var checked = []string{ssicount.Name, "advisorylock", "hotrow", "memquota", "memquota-recover", "slotrows"}

// checkedUnderShort is nil (every registered strategy) but under -short,
// where it is the strategies of checked.
func checkedUnderShort(t *testing.T) []strategy.Meta {
	if !testing.Short() {
		return nil
	}
	var metas []strategy.Meta
	for _, name := range checked {
		m, ok := strategy.Lookup(name)
		if !ok {
			t.Fatalf("no strategy %s is registered", name)
		}
		metas = append(metas, m)
	}
	return metas
}

// TestTable28_1 runs every scenario against every registered strategy, this
// module's included, and writes the table here. Under -short (or with
// RESERVEBENCH_DSN set) it writes table-28-1.short.md (.partial.md) next to
// last-run.json instead, leaving the committed table alone; under -short
// its rows are those of checked.
func TestTable28_1(t *testing.T) {
	rep := compare.Table(t, compare.TableOptions{
		Markdown: "table-28-1.md",
		JSON:     "table-28-1.json",
		LastRun:  "last-run.json",
		// Under -short only the rows this test checks: CI runs it after
		// ./compare's table of every built-in strategy.
		Strategies: checkedUnderShort(t),
		Source: compare.Source{
			Generator: "`go test ./...` in examples/outoftree (table_test.go)",
			LastRun:   "examples/outoftree/last-run.json",
		},
	})

	rows := map[string]*compare.StrategyReport{}
	for _, s := range rep.Strategies {
		rows[s.Meta.Name] = s
	}
	for _, name := range checked {
		s, ok := rows[name]
		if !ok {
			t.Errorf("table 28-1 has no row for %s", name)
			continue
		}
		for _, r := range s.Results {
			if r.Verdict() == strategytest.Errored {
				t.Errorf("%s: scenario %s is ERROR: %s", name, r.Scenario, r.Error)
			}
		}
	}
	if s := rows[ssicount.Name]; s != nil {
		for _, r := range s.Results {
			t.Logf("%s %-18s %s", ssicount.Name, r.Scenario, r.Verdict())
		}
	}
}
