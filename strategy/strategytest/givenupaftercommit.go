package strategytest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/reservebench/reservebench/resourcetest"
	"github.com/reservebench/reservebench/strategy"
)

// redisPauseFor bounds checkGivenUpAfterCommit's pause of its Redis's
// writes: a strategy that writes to Redis after its commit through a
// context of its own waits that long at most.
const redisPauseFor = 5 * time.Second

// checkGivenUpAfterCommit: a caller that gives up once its request's
// COMMIT went through, while the strategy still works after it (a lock
// released in Redis, a marker written there, its own bookkeeping), is
// answered HELD or an error (its outcome unknown to it), never an answer
// that says nothing was written: BUSY, SOLD_OUT. A strategy that looks at
// its caller's context after the commit and answers BUSY ("the caller gave
// up: try again") tells the client to send again what it holds (outsider
// round 40's redislock). The commit-timeout scenario gives up during the
// COMMIT, never after it.
//
// The request is held at its COMMIT (holdCommitNaming, seen in pg_locks);
// the strategy's Redis, when it has one the kit started, pauses its
// writes (CLIENT PAUSE WRITE); the COMMIT is let go and its transaction
// seen ended in pg_stat_activity; then the caller gives up, Redis's writes
// go on, and the answer is held to what Lookup says of the key. Without a
// Redis to pause, the work after the commit may end before the caller
// gives up: the check then sees HELD, which holds.
func checkGivenUpAfterCommit(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, res resourcetest.Set) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("given-up-after-commit")
	dep, err := meta.Open(ctx, strategy.Config{Resources: res.Addrs(), DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 2}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	node := dep.Node(0)
	req := strategy.Request{Key: "kit-given-up-after-commit-" + sku, User: "kit-given-up-after-commit", SKU: sku, TTL: time.Hour}
	hold, err := holdCommitNaming(ctx, admin, req.Key)
	if errors.Is(err, errNoTables) {
		t.Skip("the strategy keeps no tables in PostgreSQL: no commit to hold")
	} else if err != nil {
		t.Fatalf("%v", err)
	}
	defer hold.removeOrReport(t)
	reqCtx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	var box panicBox
	done := reserveAsync(reqCtx, &box, node, req)
	pid, err := awaitWaiter(ctx, hold, done, besideWithin)
	if err != nil {
		t.Fatalf("Reserve %q held at its COMMIT: %v", req.Key, err)
	}
	if pid == 0 {
		a := <-done
		box.rethrow()
		t.Skip(fmt.Sprintf("a request was answered (%s) without being seen at a COMMIT after writing a row naming its key: nothing to give up after", summary(a)))
	}
	unpause := func() {}
	if srv, ok := res[strategy.Redis]; ok && srv.Controllable() {
		opt, err := redis.ParseURL(srv.Addr())
		if err != nil {
			t.Fatalf("the strategy's Redis address: %v", err)
		}
		rdb := redis.NewClient(opt)
		defer rdb.Close()
		if err := rdb.Do(ctx, "CLIENT", "PAUSE", redisPauseFor.Milliseconds(), "WRITE").Err(); err != nil {
			t.Fatalf("CLIENT PAUSE of the strategy's Redis: %v", err)
		}
		unpaused := false
		unpause = func() {
			if !unpaused {
				unpaused = true
				if err := rdb.Do(context.WithoutCancel(ctx), "CLIENT", "UNPAUSE").Err(); err != nil {
					t.Errorf("CLIENT UNPAUSE of the strategy's Redis: %v", err)
				}
			}
		}
		defer unpause()
	}
	hold.release()
	if err := awaitBackendDone(ctx, admin, pid); err != nil {
		t.Fatalf("the request's backend %d: %v", pid, err)
	}
	giveUp()
	unpause()
	a := <-done
	box.rethrow()
	r, err := node.Lookup(ctx, req.Key)
	if err != nil {
		t.Fatalf("Lookup %q: %v", req.Key, err)
	}
	switch {
	case a.err != nil:
	case a.res.Outcome == strategy.OutcomeHeld && !r.Status.Active():
		t.Errorf("Reserve %q, its caller gone once its COMMIT went through: HELD, but Lookup says %s", req.Key, r.Status)
	case a.res.Outcome != strategy.OutcomeHeld && r.Status.Active():
		t.Errorf("Reserve %q, its caller gone once its COMMIT went through: %s, which says nothing was written, but Lookup says %s; want HELD or an error (unknown)", req.Key, a.res.Outcome, r.Status)
	}
}
