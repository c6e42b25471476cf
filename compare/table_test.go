package compare_test

import (
	"testing"

	_ "github.com/reservebench/reservebench/all"
	"github.com/reservebench/reservebench/compare"
	"github.com/reservebench/reservebench/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestTable28_1 runs every scenario against every registered strategy and
// the negative controls, rewrites table 28-1, and fails on any violation of
// a claimed guarantee, any scenario that could not be run, and any negative
// control that is not caught. The Markdown and JSON tables are committed and
// hold only deterministic facts; last-run.json is not committed and also
// holds what varies (ranges, timings, histories).
func TestTable28_1(t *testing.T) {
	// Beside the package's other slow tests, which mostly wait: they ran
	// 6 s one after the other before the table began, and now 3 s side by
	// side (go test's -parallel is GOMAXPROCS, 2 here, and they come first).
	t.Parallel()
	compare.Table(t, compare.TableOptions{
		Controls: true,
		Markdown: "../docs/table-28-1.md",
		JSON:     "../docs/table-28-1.json",
		LastRun:  "last-run.json",
	})
}
