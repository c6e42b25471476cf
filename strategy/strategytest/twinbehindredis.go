package strategytest

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest/internal/redisproxy"
)

// checkTwinBehindRedis: a request for a SKU's last unit is held in
// PostgreSQL at its first write naming its key (whatever it took in Redis
// before, a lock or a unit, stays taken); its twin, the same request sent
// again, is sent then, and the proxy in front of Redis holds the twin's
// first command that names the SKU (a lock's key, a counter's), so the
// twin has read whatever it reads in PostgreSQL first, with the first
// request not yet committed. The first request then commits the last unit,
// and the twin's command goes on. The twin must answer the key's
// reservation (REPLAY: a known key first), never SOLD_OUT: a design that
// looked its key up before it queued for the lock and checks only the
// stock under the lock tells the client that its own reservation's unit
// is sold out (redislock until 2026-12-06; outsider round 29 took that
// fix out again, and nothing in the kit noticed: checkConflictBehind makes
// a twin wait in PostgreSQL, which a request that waits for a Redis lock
// never does). A strategy without Redis, or whose twin sends Redis nothing
// naming the SKU, is not applicable.
func checkTwinBehindRedis(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	addr, usesRedis := rs[strategy.Redis]
	if !usesRedis {
		t.Skip("keeps nothing in Redis")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	proxy, err := redisproxy.Start(addr)
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer proxy.Close()
	prs := maps.Clone(rs)
	prs[strategy.Redis] = proxy.URL()
	dep, sku := openOneSKU(ctx, t, meta, db, prs, "twin-redis", 1)
	defer dep.Close()
	node := dep.Node(0)
	req := strategy.Request{Key: "kit-twin-redis-" + sku, User: "kit-twin-redis", SKU: sku, TTL: time.Hour}

	hold := holdWritesOrSkip(ctx, t, admin, req.Key)
	defer hold.removeOrReport(t)
	var box panicBox
	defer box.rethrow()
	first := reserveAsync(ctx, &box, node, req)
	pid, err := awaitWaiter(ctx, hold, first, besideWithin)
	if err != nil {
		t.Fatalf("Reserve %q held at its first write: %v", req.Key, err)
	}
	if pid == 0 {
		hold.release()
		a := <-first
		t.Skip(fmt.Sprintf("the request wrote no row naming its key before it answered (%s, %v): nothing to hold it by", a.res.Outcome, a.err))
	}
	heldTwin, letTwin := proxy.Hold(sku)
	defer letTwin()
	twin := reserveAsync(ctx, &box, node, req)
	select {
	case <-heldTwin:
	case a := <-twin:
		hold.release()
		<-first
		t.Skip(fmt.Sprintf("the twin answered (%s, %v) without sending Redis a command naming the SKU while the first request was held", a.res.Outcome, a.err))
	case <-ctx.Done():
		t.Fatalf("the twin: neither answered nor sent Redis a command naming the SKU: %v", ctx.Err())
	}
	hold.release()
	a1 := <-first
	letTwin()
	a2 := <-twin
	if a1.err != nil || a1.res.Outcome != strategy.OutcomeHeld {
		t.Skip(fmt.Sprintf("the first request, let go: %s, %v; the twin's answer says nothing then", a1.res.Outcome, a1.err))
	}
	if a2.err == nil && a2.res.Outcome != strategy.OutcomeReplay && a2.res.Outcome != strategy.OutcomeBusy {
		t.Errorf("the twin of a request for a SKU's last unit, its first Redis command naming the SKU held until the request had committed HELD: %s, want REPLAY (a known key first; its own reservation holds the unit)", a2.res.Outcome)
	}
}
