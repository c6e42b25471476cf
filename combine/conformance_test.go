package combine_test

import (
	"testing"

	"github.com/reservebench/reservebench/combine"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

func TestMain(m *testing.M) { strategytest.Main(m) }

// TestConformance runs the conformance kit: every scenario of table 28-1,
// the races (duplicate key, user limit) 50 times each, judged against
// combine's claims.
func TestConformance(t *testing.T) {
	t.Parallel()
	strategytest.Run(t, combine.Meta(), pgtest.Pools)
}
