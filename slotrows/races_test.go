package slotrows_test

import (
	"fmt"
	"testing"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

// TestDuplicateKeyAndUserLimitStorms is seed case C28-04, repeated: its
// failures are intermittent (the seed's {HELD=1, REPLAY=14, USER_LIMIT=1}),
// so every one of strategytest.RaceRepetitions trials must be exact:
//
//   - 16 concurrent requests with one key: HELD 1, REPLAY 15, each REPLAY
//     describing the one reservation;
//   - 8 concurrent requests of one user with different keys: HELD 1,
//     USER_LIMIT 7;
//   - the stock is down by exactly 2.
func TestDuplicateKeyAndUserLimitStorms(t *testing.T) {
	db, _ := pgtest.Pools(t)
	trials := strategytest.RaceRepetitions
	failed := 0
	for trial := 1; trial <= trials; trial++ {
		sku := fmt.Sprintf("sku-lab-01-%d", trial)
		dep := deploy(t, db, 2, strategy.Stock{SKU: sku, Total: 10})

		dup := make([]strategy.Request, 16)
		for i := range dup {
			dup[i] = request(fmt.Sprintf("dup-%d", trial), fmt.Sprintf("0042-%d", trial), sku)
		}
		dupRes := reserveAll(t, dep, 2, dup)
		c := count(dupRes)
		ok := c[strategy.OutcomeHeld] == 1 && c[strategy.OutcomeReplay] == 15
		for _, r := range dupRes {
			if r.Reservation.Key != dup[0].Key || r.Reservation.User != dup[0].User || r.Reservation.Status != strategy.StatusHeld || r.Reservation.ExpiresAt.IsZero() {
				ok = false
				t.Errorf("trial %d: same key x16: answer %+v does not describe the one HELD reservation", trial, r)
				break
			}
		}
		if !ok {
			t.Errorf("trial %d: same key x16: %s, want HELD=1 REPLAY=15", trial, outcomes(c))
		}

		user := make([]strategy.Request, 8)
		for i := range user {
			user[i] = request(fmt.Sprintf("user-%d-%d", trial, i), fmt.Sprintf("0043-%d", trial), sku)
		}
		u := count(reserveAll(t, dep, 2, user))
		if u[strategy.OutcomeHeld] != 1 || u[strategy.OutcomeUserLimit] != 7 {
			ok = false
			t.Errorf("trial %d: one user x8: %s, want HELD=1 USER_LIMIT=7", trial, outcomes(u))
		}
		if a := auditOf(t, dep, sku); a.Available != 8 || a.Active != 2 {
			ok = false
			t.Errorf("trial %d: audit %+v, want available 8 (stock down by 2), active 2", trial, a)
		}
		if !ok {
			failed++
		}
	}
	t.Logf("%d trials, %d inexact", trials, failed)
}

// TestKeyReused: a known key with another user or another SKU is KEY_REUSED,
// answered with the reservation that owns the key, and writes nothing.
func TestKeyReused(t *testing.T) {
	ctx := testCtx(t)
	db, _ := pgtest.Pools(t)
	dep := deploy(t, db, 1, strategy.Stock{SKU: "sku-a", Total: 3}, strategy.Stock{SKU: "sku-b", Total: 3})
	n := dep.Node(0)
	owner := request("k", "0042", "sku-a")
	if res, err := n.Reserve(ctx, owner); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("owner: %+v, %v", res, err)
	}
	for _, req := range []strategy.Request{request("k", "0043", "sku-a"), request("k", "0042", "sku-b")} {
		res, err := n.Reserve(ctx, req)
		if err != nil || res.Outcome != strategy.OutcomeKeyReused {
			t.Errorf("%+v: %+v, %v; want KEY_REUSED", req, res, err)
		}
		if res.Reservation.User != owner.User || res.Reservation.SKU != owner.SKU || res.Reservation.Status != strategy.StatusHeld {
			t.Errorf("%+v: KEY_REUSED with %+v, want the owner's reservation", req, res.Reservation)
		}
	}
	if a := auditOf(t, dep, "sku-a"); a.Active != 1 {
		t.Errorf("sku-a: %+v", a)
	}
	if a := auditOf(t, dep, "sku-b"); a.Active != 0 || a.Available != 3 {
		t.Errorf("sku-b: %+v", a)
	}
}

// TestReplayWhenSoldOut: a repeated key is REPLAY even when the stock is
// gone, never SOLD_OUT, and a user at the limit is USER_LIMIT even then: the
// insert, which decides both, comes before the claim.
func TestReplayWhenSoldOut(t *testing.T) {
	ctx := testCtx(t)
	db, _ := pgtest.Pools(t)
	const sku = "sku-one"
	dep := deploy(t, db, 1, strategy.Stock{SKU: sku, Total: 1})
	n := dep.Node(0)
	first := request("a", "0001", sku)
	if res, err := n.Reserve(ctx, first); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("first: %+v, %v", res, err)
	}
	for _, tc := range []struct {
		req  strategy.Request
		want strategy.Outcome
	}{
		{first, strategy.OutcomeReplay},
		{request("b", "0001", sku), strategy.OutcomeUserLimit},
		{request("c", "0002", sku), strategy.OutcomeSoldOut},
	} {
		if res, err := n.Reserve(ctx, tc.req); err != nil || res.Outcome != tc.want {
			t.Errorf("%s: %+v, %v; want %s", tc.req.Key, res, err, tc.want)
		}
	}
	if r, _ := n.Lookup(ctx, "req-c"); r.Status != strategy.StatusNotFound {
		t.Errorf("SOLD_OUT left a reservation: %+v", r)
	}
}
