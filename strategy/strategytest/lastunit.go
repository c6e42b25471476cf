package strategytest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// lastUnitRounds and lastUnitRacers size checkLastUnitRace: a counter
// that checks, then decrements (two atomic steps, not one) sold the last
// unit twice in 74 of 20,000 rounds of 32 racers on this 2-core machine,
// and about a hundred times less often with 8. At that rate 2,000 rounds
// miss it with probability 6e-4 (e^-7.4), in about 2.5 s.
const (
	lastUnitRounds = 2000
	lastUnitRacers = 32
)

// checkLastUnitRace: many requests at once for the last unit of a SKU get
// it once. For a strategy that counts stock in a node's memory
// (strategy.ReserveCrasher), the unit is decided by a counter in the
// process, in nanoseconds, where no database serialises the racers; the
// scenarios cross the last unit of a counter a few times a run, so a race
// there is seldom met. Here each of lastUnitRounds SKUs of one unit gets
// lastUnitRacers requests on one node, released together.
func checkLastUnitRace(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	base := kitSKU("last-unit")
	stock := make([]strategy.Stock, lastUnitRounds)
	for i := range stock {
		stock[i] = strategy.Stock{SKU: fmt.Sprintf("%s-%d", base, i), Total: 1}
	}
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: stock})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	if _, inMemory := dep.(strategy.ReserveCrasher); !inMemory {
		t.Skip("the stock is not counted in a node process's memory (strategy.ReserveCrasher): the database serialises the last unit, as every scenario shows")
	}
	node := dep.Node(0)
	var twice []string
	for _, st := range stock {
		gate := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		held, errs := 0, 0
		var box panicBox
		for r := range lastUnitRacers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer box.catch()
				req := strategy.Request{Key: fmt.Sprintf("kit-last-%d-%s", r, st.SKU), User: fmt.Sprintf("kit-last-%d", r), SKU: st.SKU, TTL: time.Hour}
				<-gate
				res, err := node.Reserve(ctx, req)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					errs++
				case res.Outcome == strategy.OutcomeHeld:
					held++
				}
			}()
		}
		close(gate)
		wg.Wait()
		box.rethrow()
		if held > 1 {
			twice = append(twice, fmt.Sprintf("%s: %d HELD", st.SKU, held))
		}
		if errs > 0 {
			t.Fatalf("%d of %d requests for the last unit of %s failed", errs, lastUnitRacers, st.SKU)
		}
	}
	if len(twice) > 0 {
		t.Errorf("%d requests at once for a SKU of one unit, %d rounds: the unit was HELD more than once in %d of them (%v)", lastUnitRacers, lastUnitRounds, len(twice), twice)
	}
	list, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	for _, a := range list {
		if a.Active > a.Total {
			t.Errorf("Audit of %s: %d active of %d", a.SKU, a.Active, a.Total)
		}
	}
}
