package strategytest

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/reservebench/reservebench/redistest"
	"github.com/reservebench/reservebench/strategy"
)

// checkGivenUpLeavesLock: a request that waits for its SKU's lock (a
// strategy.LockTaker; the wait seen through strategy.LockWait) and whose
// caller gives up leaves the lock to its holder: the lock's key holds what
// it held before. A take that gives up must remove only what it may have
// set itself (a SET that ran after its client stopped waiting), by its own
// token; one that deletes the key outright frees the SKU under a holder
// still at work, and the next request works beside it. The answers stay
// right where the database's condition holds the stock, so the key is what
// is checked: the lock faults check that an unlock leaves another's lock,
// and no check looked after a take given up (outsider round 45's
// m09abandondel).
func checkGivenUpLeavesLock(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("lock-given-up")
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 2}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	node := dep.Node(0)
	info, addr := lockOf(t, node, rs, sku)
	opener, ok := node.(strategy.SessionOpener)
	if !ok {
		t.Skip("no attempt held open (strategy.SessionOpener)")
	}
	rdb, err := redistest.Client(addr)
	if err != nil {
		t.Fatalf("connect to the lock's server: %v", err)
	}
	defer rdb.Close()

	s, _ := holdInSession(ctx, t, opener, strategy.Request{Key: "kit-lgu-held-" + sku, User: "kit-lgu-a", SKU: sku, TTL: time.Hour},
		"the attempt holding the SKU's lock")
	defer func() { _ = s.Rollback(context.Background()) }()
	before, err := rdb.Get(ctx, info.Key).Result()
	if errors.Is(err, redis.Nil) {
		t.Skip("the attempt held open holds no key at " + info.Key)
	} else if err != nil {
		t.Fatalf("GET %s: %v", info.Key, err)
	}
	giveUpCtx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	var box panicBox
	done := reserveAsync(giveUpCtx, &box, node, strategy.Request{Key: "kit-lgu-waiter-" + sku, User: "kit-lgu-b", SKU: sku, TTL: time.Hour})
	bound, stop := context.WithTimeout(ctx, besideWithin)
	waits := false
	_ = awaitAnswerOr(bound, done, func() (bool, error) {
		waits = lockWaiting(done)
		return waits, nil
	})
	stop()
	giveUp()
	givenUpAnswer(t, done, "a request waiting for its SKU's lock")
	box.rethrow()
	if !waits {
		t.Skip("the request did not report a wait for the lock (strategy.LockWait)")
	}
	after, err := rdb.Get(ctx, info.Key).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatalf("GET %s: %v", info.Key, err)
	}
	if after != before {
		t.Errorf("a request waiting for the lock of %s, held by an attempt held open, was given up by its caller; then the lock's key %s held %q, where it held %q before: a take given up removes only what it set, by its token, or the SKU is free under a holder still at work",
			sku, info.Key, after, before)
	}
}
