package hotrow_test

import (
	"testing"

	"github.com/reservebench/reservebench/hotrow"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestConformance runs the conformance kit: every scenario of table 28-1,
// the races (duplicate key, user limit) 50 times each, judged against
// hotrow's claims.
func TestConformance(t *testing.T) {
	t.Parallel()
	strategytest.Run(t, hotrow.Meta(), pgtest.Pools)
}
