// Package reservebench compares ways of handing out N scarce units to many
// simultaneous requests without ever selling N+1. It holds the scenario inputs
// (testdata/scenarios) shared by the conformance kit and the harness; the code
// lives in the packages below it:
//
//	strategy               the contract every strategy implements, and its registry
//	strategy/strategytest  the conformance kit each strategy's tests run
//	hotrow, slotrows, memquota  the strategies of table 28-1
//	compare                the harness: `go test ./compare` rewrites docs/table-28-1.md
//	internal/pgtest        a real PostgreSQL for tests
package reservebench

import "embed"

// ScenarioFiles holds the scenario inputs, one JSON file per scenario. They
// are the single definition of what every strategy is run against.
//
//go:embed testdata/scenarios/*.json
var ScenarioFiles embed.FS
