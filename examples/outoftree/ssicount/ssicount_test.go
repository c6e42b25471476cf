package ssicount_test

import (
	"testing"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy/strategytest"

	"example.com/outoftree/ssicount"
)

// TestMain lets the kit re-execute this test binary as a helper process
// (the kill scenarios) and stops the throwaway PostgreSQL afterwards.
func TestMain(m *testing.M) { strategytest.Main(m) }

// TestConformance runs every scenario of table 28-1 against the strategy
// and holds it to its claims.
func TestConformance(t *testing.T) {
	t.Cleanup(func() { t.Logf("Reserve attempts: %s", ssicount.AttemptStats()) })
	strategytest.Run(t, ssicount.Meta(), pgtest.Pools)
}
