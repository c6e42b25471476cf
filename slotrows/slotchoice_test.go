package slotrows_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/slotrows"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

var choices = []slotrows.SlotChoice{slotrows.LowestFirst, slotrows.KeyHashFirst}

// The kill and process scenarios run the variant in helper processes,
// which find it by name.
func init() {
	strategytest.RegisterForHelpers(slotrows.New(slotrows.Options{SlotChoice: slotrows.KeyHashFirst}))
}

// TestKeyHashFirstConforms runs the kit's scenarios (short) on the
// KeyHashFirst variant: the slot choice changes which slot a claim takes,
// never what it answers.
func TestKeyHashFirstConforms(t *testing.T) {
	db, admin := pgtest.Pools(t)
	meta := slotrows.New(slotrows.Options{SlotChoice: slotrows.KeyHashFirst})
	if meta.Name != "slotrows-key-hash-first" {
		t.Errorf("name %q", meta.Name)
	}
	results, err := strategytest.Verify(context.Background(), meta, db, admin, strategytest.Options{Short: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		for _, c := range r.Violations() {
			t.Error(r.Failure(c))
		}
		if r.Scenario == "contention" {
			if got := r.Fact("storm: sku-lab-01"); got != "HELD 40, SOLD_OUT 80" {
				t.Errorf("contention: %q, want HELD 40, SOLD_OUT 80", got)
			}
		}
	}
}

// TestAttemptLocksOneSlot: an attempt held open locks exactly the one slot it
// claimed, whatever the slot choice and wherever its start falls, so the
// other free slots stay claimable.
func TestAttemptLocksOneSlot(t *testing.T) {
	for _, choice := range choices {
		t.Run(choice.String(), func(t *testing.T) {
			ctx := testCtx(t)
			db, admin := pgtest.Pools(t)
			const sku = "sku-five"
			dep := deployWith(t, slotrows.New(slotrows.Options{SlotChoice: choice}), db, 1, strategy.Stock{SKU: sku, Total: 5})
			holdMany(t, dep, 1, 3, sku)
			free := len(freeSlots(t, admin, sku))
			if free != 2 {
				t.Fatalf("%d free slots, want 2", free)
			}
			opener := dep.Node(0).(strategy.SessionOpener)
			for i := 0; i < 12; i++ {
				s, err := opener.OpenSession(ctx)
				if err != nil {
					t.Fatal(err)
				}
				req := request(fmt.Sprintf("probe-%d", i), fmt.Sprintf("probe-%d", i), sku)
				if res, err := s.Reserve(ctx, req); err != nil || res.Outcome != strategy.OutcomeHeld {
					t.Fatalf("%s: %+v, %v", req.Key, res, err)
				}
				if got := lockableFreeSlots(t, admin, sku); len(got) != free-1 {
					t.Errorf("%s holds its attempt open: lockable free slots %v, want %d", req.Key, got, free-1)
				}
				if err := s.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
