package strategytest

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// lastUnitRounds and lastUnitRacers size the second part of
// checkLastUnitRace, whole requests: a counter that checks, then
// decrements (two atomic steps, not one) sold the last unit twice in 1 to
// 3 of 2,000 rounds of 32 racers on a 2-core machine, where the pool's
// hand-out spaces the racers apart. The first part, requests that die
// mid-reserve and so race in memory alone, met it 1,100 to 1,700 times
// in 20,000 SKUs (200 to 600 with three busy loops beside it); this part
// keeps the whole reserve path in the race, a smoke test at that rate
// (300 rounds: a round is 32 round trips, through Redis for rediscounter).
const (
	lastUnitRounds = 300
	lastUnitRacers = 32
)

// checkLastUnitRace: many requests at once for the last unit of a SKU get
// it once. For a strategy that counts stock in a node's memory
// (strategy.ReserveCrasher), the unit is decided by a counter in the
// process, in nanoseconds, where no database serialises the racers; the
// scenarios cross the last unit of a counter a few times a run, so a race
// there is seldom met. Here requests that die mid-reserve race for each of
// lastUnitCrashSKUs units (checkLastUnitCrashes), then
// each of lastUnitRounds SKUs of one unit gets lastUnitRacers requests on
// one node, released together.
func checkLastUnitRace(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dep, stock := openOneUnitSKUs(ctx, t, meta, db, rs, "last-unit", lastUnitRounds)
	defer dep.Close()
	if _, inMemory := dep.(strategy.ReserveCrasher); !inMemory {
		t.Skip("the stock is not counted in a node process's memory (strategy.ReserveCrasher): the database serialises the last unit, as every scenario shows")
	}
	checkLastUnitCrashes(ctx, t, meta, db, rs)
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

// The first part of checkLastUnitRace races requests that die between
// the counter and the database (strategy.ReserveCrasher): they touch only
// the node's memory, so thousands of last units go in well under a second.
// It runs batches of lastUnitCrashSKUs SKUs until lastUnitContested of
// them were contested (every racer began its request within
// lastUnitNear of the others, or within half the time of a quick call
// when a call takes longer: the tenth quickest of the batch, so that a
// crash through a round trip to Redis, whose racers overlap for most of
// it whenever they begin some microseconds apart, is not raced for four
// seconds of spinning that take the processors from Redis and
// PostgreSQL), at most lastUnitBatches batches, and no
// batch begins lastUnitBudget after the first did: a crash that goes
// through Redis (rediscounter) takes a round trip, and on a loaded machine
// ten batches of 5,000 SKUs and their audits outlasted the check's two
// minutes.
const (
	lastUnitCrashSKUs = 1_000
	lastUnitContested = 2_000
	lastUnitBatches   = 20
	lastUnitNear      = 500 * time.Nanosecond
	lastUnitBudget    = 4 * time.Second
)

// checkLastUnitCrashes: one racer per processor (GOMAXPROCS, at least 2)
// sends a request that dies mid-reserve (CrashMidReserve) for each SKU of
// one unit, all of them for one SKU at a time. At most one can take the
// unit: the audit may show it lost (the crash's drift) but never a count
// below zero, a unit taken twice.
//
// The racers spin between SKUs instead of waiting on a channel: woken
// through the scheduler, they reach the counter one after another, and a
// check-then-take counter sold the last unit twice in 66 to 283 of 20,000
// SKUs with the machine idle and in none of them with both cores busy.
// Spinning, both are on a processor when the next SKU is let go, as long
// as the operating system runs both: with both cores busy it often does
// not, so SKUs are counted as contested only when the racers began within
// lastUnitNear of each other, and batches go on until enough were.
func checkLastUnitCrashes(ctx context.Context, t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	contested, twice, batches := 0, []string(nil), 0
	deadline := time.Now().Add(lastUnitBudget)
	for ; batches < lastUnitBatches && contested < lastUnitContested && len(twice) == 0 && (batches == 0 || time.Now().Before(deadline)); batches++ {
		n, found := lastUnitCrashBatch(ctx, t, meta, db, rs)
		contested += n
		twice = append(twice, found...)
	}
	if len(twice) > 0 {
		t.Errorf("requests that died mid-reserve at once, for SKUs of one unit: the count went below zero (the unit taken twice) for %d of them (%v)",
			len(twice), twice[:min(len(twice), 5)])
	}
}

// lastUnitCrashBatch races for lastUnitCrashSKUs SKUs of a deployment of
// its own and returns how many were contested and those taken twice.
func lastUnitCrashBatch(ctx context.Context, t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) (int, []string) {
	t.Helper()
	dep, stock := openOneUnitSKUs(ctx, t, meta, db, rs, "last-crash", lastUnitCrashSKUs)
	defer dep.Close()
	crasher := dep.(strategy.ReserveCrasher)
	racers := max(2, runtime.GOMAXPROCS(0))
	began := make([][]time.Time, racers)
	took := make([][]time.Duration, racers)
	var (
		box   panicBox
		next  atomic.Int64 // the SKU let go
		ended atomic.Int64 // racers done with it
		wg    sync.WaitGroup
	)
	for r := range racers {
		began[r] = make([]time.Time, len(stock))
		took[r] = make([]time.Duration, len(stock))
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer box.catch()
			for i, st := range stock {
				for spins := 0; next.Load() < int64(i); spins++ {
					if spins%1024 == 1023 {
						runtime.Gosched() // a racer whose processor was taken away
					}
				}
				req := strategy.Request{Key: fmt.Sprintf("kit-crash-%d-%s", r, st.SKU), User: fmt.Sprintf("kit-crash-%d", r), SKU: st.SKU, TTL: time.Hour}
				began[r][i] = time.Now()
				_ = crasher.CrashMidReserve(ctx, 0, req) // an error either way: the request died, or found no unit
				took[r][i] = time.Since(began[r][i])
				if ended.Add(1) == int64(racers*(i+1)) {
					next.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	box.rethrow()
	near := contestedWithin(took)
	contested := 0
	for i := range stock {
		first, last := began[0][i], began[0][i]
		for r := 1; r < racers; r++ {
			if began[r][i].Before(first) {
				first = began[r][i]
			}
			if began[r][i].After(last) {
				last = began[r][i]
			}
		}
		if last.Sub(first) <= near {
			contested++
		}
	}
	list, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	var twice []string
	for _, a := range list {
		if a.Available < 0 {
			twice = append(twice, fmt.Sprintf("%s: available %d", a.SKU, a.Available))
		}
	}
	return contested, twice
}

// contestedWithin is how far apart racers may begin for their SKU to count
// as contested: lastUnitNear, or half of the tenth quickest call when that
// is longer (two calls that begin less than half a call apart overlap for
// at least half of it).
func contestedWithin(took [][]time.Duration) time.Duration {
	var all []time.Duration
	for _, r := range took {
		all = append(all, r...)
	}
	if len(all) == 0 {
		return lastUnitNear
	}
	slices.Sort(all)
	return max(lastUnitNear, all[len(all)/10]/2)
}

// openOneUnitSKUs opens a deployment of its own with n SKUs of one unit;
// the caller closes it.
func openOneUnitSKUs(ctx context.Context, t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string, prefix string, n int) (strategy.Deployment, []strategy.Stock) {
	t.Helper()
	base := kitSKU(prefix)
	stock := make([]strategy.Stock, n)
	for i := range stock {
		stock[i] = strategy.Stock{SKU: fmt.Sprintf("%s-%d", base, i), Total: 1}
	}
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: stock})
	if err != nil {
		t.Fatalf("Open of %d SKUs of one unit: %v", n, err)
	}
	return dep, stock
}
