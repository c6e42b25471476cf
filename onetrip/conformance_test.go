package onetrip_test

import (
	"testing"

	"github.com/reservebench/reservebench/onetrip"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

func TestMain(m *testing.M) { strategytest.Main(m) }

// TestConformance runs the conformance kit: every scenario of table 28-1,
// the races (duplicate key, user limit) 50 times each, judged against
// onetrip's claims.
func TestConformance(t *testing.T) {
	t.Parallel()
	strategytest.Run(t, onetrip.Meta(), pgtest.Pools)
}
