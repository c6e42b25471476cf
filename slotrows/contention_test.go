package slotrows_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
)

// TestContention is seed case C28-13: 120 users at once for 40 units over
// two nodes. Seed counts for B: 40 HELD, 80 no slot, 40 distinct holders.
func TestContention(t *testing.T) {
	db, admin := pgtest.Pools(t)
	const sku = "sku-lab-01"
	dep := deploy(t, db, 2, strategy.Stock{SKU: sku, Total: 40})
	reqs := make([]strategy.Request, 120)
	for i := range reqs {
		reqs[i] = request(fmt.Sprintf("%04d", i), fmt.Sprintf("%04d", i), sku)
	}
	results := reserveAll(t, dep, 2, reqs)
	c := count(results)
	if c[strategy.OutcomeHeld] != 40 || c[strategy.OutcomeSoldOut] != 80 || len(c) != 2 {
		t.Errorf("outcomes %s, want HELD=40 SOLD_OUT=80", outcomes(c))
	}

	// Every HELD answer holds exactly one slot, and every slot one of them.
	held := map[string]bool{}
	for i, r := range results {
		if r.Outcome == strategy.OutcomeHeld {
			held[reqs[i].Key] = true
		}
	}
	slots := holders(t, admin, sku)
	byKey := map[string]int{}
	for _, key := range slots {
		byKey[key]++
		if !held[key] {
			t.Errorf("slot held by %s, which was not answered HELD", key)
		}
	}
	if len(slots) != 40 || len(byKey) != 40 {
		t.Errorf("%d slots held by %d distinct holders, want 40 and 40", len(slots), len(byKey))
	}
	var users int
	if err := admin.QueryRow(testCtx(t), `
SELECT count(DISTINCT r.user_id) FROM slotrows_slot s JOIN slotrows_reservation r ON r.id = s.holder
WHERE s.sku = $1`, sku).Scan(&users); err != nil {
		t.Fatal(err)
	}
	if users != 40 {
		t.Errorf("%d distinct users hold a slot, want 40", users)
	}
	if a := auditOf(t, dep, sku); a.Total != 40 || a.Available != 0 || a.Active != 40 {
		t.Errorf("audit %+v, want total 40, available 0, active 40 (drift 0)", a)
	}
}

// TestStormBoundedPool is the storm of seed 002: 10,000 requests at once for
// one unit through a pool of 16 connections. Exactly one is HELD, and the
// database never sees more backends of the strategy than the pool allows:
// the other requests queue for a connection in the process, and each one
// that gets one is told SOLD_OUT without waiting for a lock.
//
// To keep it lean under -race the requests run in 10,000 goroutines released
// at once (as the kit's storm does), and the sampler asks pg_stat_activity
// once a millisecond, on a pool of its own, until the storm is over.
func TestStormBoundedPool(t *testing.T) {
	const (
		requests = 10000
		poolSize = 16
		sku      = "sku-storm-01"
	)
	d := pgtest.NewDatabase(t)
	db := d.Pool(t, poolSize)
	admin := d.AdminPool(t, 1)
	dep := deploy(t, db, 2, strategy.Stock{SKU: sku, Total: 1})

	// The sampler counts the client backends in this database other than
	// its own: the strategy's connections.
	var maxBackends, samples atomic.Int64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		ctx := testCtx(t)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			var n int64
			err := admin.QueryRow(ctx, `
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()`).Scan(&n)
			if err != nil {
				t.Errorf("sample pg_stat_activity: %v", err)
				return
			}
			samples.Add(1)
			if n > maxBackends.Load() {
				maxBackends.Store(n)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()

	reqs := make([]strategy.Request, requests)
	for i := range reqs {
		reqs[i] = request(fmt.Sprintf("%05d", i), fmt.Sprintf("%05d", i), sku)
	}
	results := reserveAll(t, dep, 2, reqs)
	close(stop)
	sampler.Wait()

	c := count(results)
	if c[strategy.OutcomeHeld] != 1 || c[strategy.OutcomeSoldOut] != requests-1 {
		t.Errorf("outcomes %s, want HELD=1 SOLD_OUT=%d", outcomes(c), requests-1)
	}
	if a := auditOf(t, dep, sku); a.Available != 0 || a.Active != 1 {
		t.Errorf("audit %+v, want available 0, active 1", a)
	}
	if m := maxBackends.Load(); m > poolSize || m == 0 {
		t.Errorf("at most %d backends of the strategy seen in %d samples, want 1..%d (the pool size)", m, samples.Load(), poolSize)
	}
	if got := db.Stat().MaxConns(); got != poolSize {
		t.Errorf("pool MaxConns %d, want %d", got, poolSize)
	}
	t.Logf("%d requests: %s; at most %d backends in %d samples of pg_stat_activity (pool %d)",
		requests, outcomes(c), maxBackends.Load(), samples.Load(), poolSize)
}
