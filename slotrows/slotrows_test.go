package slotrows_test

import (
	"context"
	"testing"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/slotrows"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestConformance runs the conformance kit on strategy B with its full
// claims, no-wait among them (the kit judges no-wait only where attempts
// compete for stock alone, as in the phantom scenario).
func TestConformance(t *testing.T) {
	strategytest.Run(t, slotrows.Meta(), pgtest.Pools)
}

// TestNoWait runs the phantom sold-out interleaving (every ordering of t1
// holding an attempt open while t2 and t3 reserve) with B's full claims: no
// attempt may be seen blocked in pg_blocking_pids, and nothing else may be
// violated. TestPhantomSoldOut checks the seed's ordering step by step.
func TestNoWait(t *testing.T) {
	db, admin := pgtest.Pools(t)
	meta := slotrows.Meta()
	if !meta.Claims.Has(strategy.NoWait) || meta.Claims.Has(strategy.NoPhantomSoldOut) {
		t.Fatalf("claims %v: B claims no-wait and not no-phantom-sold-out", meta.Claims)
	}
	r, err := strategytest.RunScenario(context.Background(), strategytest.Env{Meta: meta, DB: db, Admin: admin}, strategytest.MustScenario("phantom"))
	if err != nil {
		t.Fatal(err)
	}
	strategytest.Report(t, r)
	waits := 0
	for _, c := range r.Checks {
		if c.Claim == strategy.NoWait {
			waits++
			if c.Failed > 0 || c.Trials == 0 {
				t.Errorf("no-wait check: %+v", c)
			}
		}
	}
	if waits == 0 {
		t.Errorf("the phantom scenario ran no no-wait check")
	}
}
