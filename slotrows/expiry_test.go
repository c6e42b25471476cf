package slotrows_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

// holdMany makes n HELD reservations of sku at once, over the nodes, and
// returns their keys.
func holdMany(t *testing.T, dep strategy.Deployment, nodes, n int, sku string) []string {
	t.Helper()
	reqs := make([]strategy.Request, n)
	keys := make([]string, n)
	for i := range reqs {
		reqs[i] = request(fmt.Sprintf("%s-%04d", sku, i), fmt.Sprintf("%04d", i), sku)
		keys[i] = reqs[i].Key
	}
	if c := count(reserveAll(t, dep, nodes, reqs)); c[strategy.OutcomeHeld] != n {
		t.Fatalf("setup: %d reservations: %s", n, outcomes(c))
	}
	return keys
}

func makeDue(t *testing.T, dep strategy.Deployment, keys []string) {
	t.Helper()
	n, err := dep.(strategy.Ager).MakeDue(testCtx(t), keys)
	if err != nil || n != len(keys) {
		t.Fatalf("MakeDue: %d, %v; want %d", n, err, len(keys))
	}
}

// expireConcurrently runs ExpireDue on workers nodes at once and returns the
// units they reported in total.
func expireConcurrently(t *testing.T, dep strategy.Deployment, nodes, workers int) int {
	t.Helper()
	ctx := testCtx(t)
	units := make([]int, workers)
	errs := make([]error, workers)
	strategytest.Together(workers, func(i int) {
		units[i], errs[i] = dep.Node(i % nodes).(strategy.Expirer).ExpireDue(ctx)
	})
	sum := 0
	for i := range units {
		if errs[i] != nil {
			t.Fatalf("ExpireDue: %v", errs[i])
		}
		sum += units[i]
	}
	return sum
}

// TestExpiryReplay is seed case C28-07 with A's counts: 20 held, 8 expire:
// the release returns 8; a replay returns 0; 4 concurrent replays return 0
// in total; the other 12 expire and 4 concurrent releases return exactly 12
// in total. Each count is also checked against the audit: available rises by
// exactly what the job reports.
func TestExpiryReplay(t *testing.T) {
	db, _ := pgtest.Pools(t)
	const sku = "sku-lab-01"
	dep := deploy(t, db, 2, strategy.Stock{SKU: sku, Total: 40})
	keys := holdMany(t, dep, 2, 20, sku)
	avail := func() int { return auditOf(t, dep, sku).Available }

	step := func(name string, want int, run func() int) {
		t.Helper()
		before := avail()
		got := run()
		back := avail() - before
		if got != want || back != want {
			t.Errorf("%s: reported %d units, available rose by %d; want %d", name, got, back, want)
		}
	}
	makeDue(t, dep, keys[:8])
	step("release 8 due", 8, func() int { return expireConcurrently(t, dep, 2, 1) })
	step("replay", 0, func() int { return expireConcurrently(t, dep, 2, 1) })
	step("4 concurrent replays", 0, func() int { return expireConcurrently(t, dep, 2, 4) })
	makeDue(t, dep, keys[8:])
	step("4 concurrent releases of 12 due", 12, func() int { return expireConcurrently(t, dep, 2, 4) })

	for _, k := range keys {
		if r, err := dep.Node(0).Lookup(testCtx(t), k); err != nil || r.Status != strategy.StatusExpired {
			t.Errorf("%s: %+v, %v; want EXPIRED", k, r, err)
		}
	}
	if a := auditOf(t, dep, sku); a.Available != 40 || a.Active != 0 {
		t.Errorf("audit at the end: %+v, want available 40, active 0", a)
	}
}

// TestConfirmVsExpire is seed case C28-08 with A's counts: 40 due HELD
// reservations; 4 confirmers (the late payment callback, ConfirmUntilExpired)
// and 4 runs of the expiry job race for them. Each row is handled by exactly
// one side (every key gets a confirm call, which moves it unless the job
// already did), the confirm calls that moved a row are the CONFIRMED rows,
// and units come back only for EXPIRED rows. The split varies; three trials.
func TestConfirmVsExpire(t *testing.T) {
	db, _ := pgtest.Pools(t)
	const workers = 4
	for trial := 1; trial <= 3; trial++ {
		sku := fmt.Sprintf("sku-cve-%d", trial)
		dep := deploy(t, db, 2, strategy.Stock{SKU: sku, Total: 40})
		keys := holdMany(t, dep, 2, 40, sku)
		makeDue(t, dep, keys)
		before := auditOf(t, dep, sku).Available

		ctx := testCtx(t)
		queue := make(chan string, len(keys))
		for _, i := range rand.Perm(len(keys)) {
			queue <- keys[i]
		}
		close(queue)
		var mu sync.Mutex
		movedByConfirm := map[string]bool{}
		expiredUnits := 0
		strategytest.Together(2*workers, func(i int) {
			if i < workers {
				c := dep.Node(i % 2).(strategy.Confirmer)
				for k := range queue {
					moved, err := c.Confirm(ctx, k, strategy.ConfirmUntilExpired)
					if err != nil {
						t.Errorf("Confirm %s: %v", k, err)
					}
					if moved {
						mu.Lock()
						movedByConfirm[k] = true
						mu.Unlock()
					}
				}
				return
			}
			u, err := dep.Node(i % 2).(strategy.Expirer).ExpireDue(ctx)
			if err != nil {
				t.Errorf("ExpireDue: %v", err)
			}
			mu.Lock()
			expiredUnits += u
			mu.Unlock()
		})
		status := map[strategy.Status]int{}
		for _, k := range keys {
			r, err := dep.Node(0).Lookup(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			status[r.Status]++
			if movedByConfirm[k] && r.Status != strategy.StatusConfirmed {
				t.Errorf("trial %d: %s: a confirm moved it, but it is %s", trial, k, r.Status)
			}
		}
		back := auditOf(t, dep, sku).Available - before
		confirmed, expired := status[strategy.StatusConfirmed], status[strategy.StatusExpired]
		if confirmed+expired != len(keys) || len(movedByConfirm) != confirmed || back != expired || expiredUnits != expired {
			t.Errorf("trial %d: statuses %v, %d confirm calls moved a row, job reported %d units, available rose by %d",
				trial, status, len(movedByConfirm), expiredUnits, back)
		}
		t.Logf("trial %d: confirmed %d + expired %d = %d", trial, confirmed, expired, confirmed+expired)
	}
}

// TestConfirmModes: ConfirmBeforeExpiry refuses a due reservation that
// ConfirmUntilExpired still confirms; a confirmed reservation keeps its slot
// and cannot be released or expired; a released one cannot be confirmed.
func TestConfirmModes(t *testing.T) {
	ctx := testCtx(t)
	db, _ := pgtest.Pools(t)
	const sku = "sku-lab-01"
	dep := deploy(t, db, 1, strategy.Stock{SKU: sku, Total: 3})
	n := dep.Node(0)
	c, r, e := n.(strategy.Confirmer), n.(strategy.Releaser), n.(strategy.Expirer)
	keys := holdMany(t, dep, 1, 3, sku)

	if moved, err := c.Confirm(ctx, keys[0], strategy.ConfirmBeforeExpiry); err != nil || !moved {
		t.Errorf("ConfirmBeforeExpiry of a live HELD: %v, %v; want moved", moved, err)
	}
	makeDue(t, dep, keys[1:2])
	if moved, err := c.Confirm(ctx, keys[1], strategy.ConfirmBeforeExpiry); err != nil || moved {
		t.Errorf("ConfirmBeforeExpiry of a due HELD: %v, %v; want not moved", moved, err)
	}
	if moved, err := c.Confirm(ctx, keys[1], strategy.ConfirmUntilExpired); err != nil || !moved {
		t.Errorf("ConfirmUntilExpired of a due HELD: %v, %v; want moved", moved, err)
	}
	if moved, _ := c.Confirm(ctx, keys[1], strategy.ConfirmUntilExpired); moved {
		t.Errorf("a second Confirm moved the row again")
	}
	if units, err := r.Release(ctx, keys[0]); err != nil || units != 0 {
		t.Errorf("Release of a CONFIRMED: %d, %v; want 0", units, err)
	}
	if units, err := e.ExpireDue(ctx); err != nil || units != 0 {
		t.Errorf("ExpireDue with only CONFIRMED due: %d, %v; want 0", units, err)
	}
	if a := auditOf(t, dep, sku); a.Available != 0 || a.Active != 3 {
		t.Errorf("audit: %+v, want the confirmed reservations to keep their slots", a)
	}
	if units, err := r.Release(ctx, keys[2]); err != nil || units != 1 {
		t.Errorf("Release of a HELD: %d, %v; want 1", units, err)
	}
	if units, err := r.Release(ctx, keys[2]); err != nil || units != 0 {
		t.Errorf("Release replayed: %d, %v; want 0", units, err)
	}
	if moved, _ := c.Confirm(ctx, keys[2], strategy.ConfirmUntilExpired); moved {
		t.Errorf("Confirm moved a RELEASED reservation")
	}
	if units, err := r.Release(ctx, "req-nobody"); err != nil || units != 0 {
		t.Errorf("Release of an unknown key: %d, %v; want 0", units, err)
	}
	if a := auditOf(t, dep, sku); a.Available != 1 || a.Active != 2 {
		t.Errorf("audit at the end: %+v, want available 1, active 2", a)
	}
	// The released unit is taken again, by the same user too.
	if res, err := n.Reserve(ctx, request("again", "0002", sku)); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Errorf("reserve after release: %+v, %v; want HELD", res, err)
	}
}
