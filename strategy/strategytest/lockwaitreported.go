package strategytest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/reservebench/reservebench/strategy"
)

// lockWaitPause is how long checkLockWaitReported stops the lock's server
// while a request's first take of a free lock is on its way.
const lockWaitPause = time.Second

// checkLockWaitReported: a LockTaker reports a wait for its lock through
// strategy.LockWait only while the lock is held by another. The kit goes on
// as soon as a request reports waiting, so a report that lies makes every
// check that needs a request to wait go on too soon: a weaker test where
// it should be a strict one (outsider round 45's m01, a report never
// cleared, m02, set before the first try of a free lock, and m11, an
// attempt's LockWaiting never cleared). Three steps: a request for a free
// lock, its take held on its way by a stalled lock server, must not report
// waiting; a request that waited behind an attempt held open, and an
// attempt that waited behind another, must not report waiting once they
// have answered.
func checkLockWaitReported(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("lock-wait-reported")
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 4}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	node := dep.Node(0)
	_, addr := lockOf(t, node, rs, sku)
	opener, ok := node.(strategy.SessionOpener)
	if !ok {
		t.Skip("no attempt held open (strategy.SessionOpener)")
	}
	opt, err := redis.ParseURL(addr)
	if err != nil {
		t.Fatalf("the lock's server %s: %v", addr, err)
	}
	opt.ReadTimeout = lockWaitPause + 30*time.Second
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	req := func(name string) strategy.Request {
		return strategy.Request{Key: "kit-lwr-" + name + "-" + sku, User: "kit-lwr-" + name, SKU: sku, TTL: time.Hour}
	}
	var box panicBox
	defer box.rethrow()

	// A free lock, the take on its way: never "waiting".
	paused, err := pauseRedis(ctx, rdb, opt, lockWaitPause)
	if err != nil {
		t.Fatalf("stall the lock's server: %v", err)
	}
	free := reserveAsync(ctx, &box, node, req("free"))
	saidWaiting := false
	tick := time.NewTicker(time.Millisecond) // sampled until the stall ends
	for stalled := true; stalled; {
		saidWaiting = saidWaiting || lockWaiting(free)
		select {
		case <-paused:
			stalled = false
		case <-tick.C:
		}
	}
	tick.Stop()
	<-free
	if saidWaiting {
		t.Errorf("a request for %s, whose lock nobody held, reported waiting for it (strategy.LockWait) while its take was on its way to a stalled server", sku)
	}

	// A wait behind an attempt held open, then answered.
	s, _ := holdInSession(ctx, t, opener, req("held"), "the attempt holding the SKU's lock")
	waiter := reserveAsync(ctx, &box, node, req("waiter"))
	w := lockWaitOf(waiter)
	behind, err := opener.OpenSession(ctx)
	if err != nil {
		_ = s.Rollback(ctx)
		t.Fatalf("OpenSession: %v", err)
	}
	behindDone := reserveAsync(ctx, &box, behind, req("behind"))
	bound, stop := context.WithTimeout(ctx, besideWithin)
	_ = awaitAnswerOr(bound, waiter, func() (bool, error) { return lockWaiting(waiter), nil })
	_ = awaitAnswerOr(bound, behindDone, func() (bool, error) { return lockWaiting(behindDone), nil })
	stop()
	if err := s.Commit(ctx); err != nil {
		t.Fatalf("Commit of the attempt holding the lock: %v", err)
	}
	<-waiter
	<-behindDone
	if w.Waiting() {
		t.Errorf("a request that waited for the lock of %s behind an attempt held open still reported waiting (strategy.LockWait) once it had answered", sku)
	}
	if ls, ok := behind.(strategy.LockedSession); ok && ls.LockWaiting() {
		t.Errorf("an attempt held open whose Reserve waited for the lock of %s behind another still reported waiting (LockedSession.LockWaiting) once its Reserve had answered", sku)
	}
	_ = behind.Rollback(ctx)
}
