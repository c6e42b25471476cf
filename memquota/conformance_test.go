package memquota_test

import (
	"testing"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"

	_ "github.com/reservebench/reservebench/memquota"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func registered(t *testing.T, name string) strategy.Meta {
	t.Helper()
	meta, ok := strategy.Lookup(name)
	if !ok {
		t.Fatalf("strategy %q is not registered", name)
	}
	return meta
}

// TestConformance runs the conformance kit, strategytest.Run, against both
// registrations. memquota does not claim SurvivesRestart: the kit reports its
// restart oversell as an observed boundary, and fails it only if it breaks a
// claim while no node restarts.
func TestConformance(t *testing.T) {
	for _, name := range []string{"memquota", "memquota-recover"} {
		t.Run(name, func(t *testing.T) { strategytest.Run(t, registered(t, name), pgtest.Pools) })
	}
}
