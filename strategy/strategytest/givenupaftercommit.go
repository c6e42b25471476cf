package strategytest

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
// seen ended in pg_stat_activity, and the strategy's next Redis write seen
// blocked by the pause (CLIENT LIST); then the caller gives up, Redis's
// writes go on, and the answer is held to what Lookup says of the key.
// Without a Redis to pause, or with no write to it after the commit, the
// work after the commit may end before the caller gives up: the check then
// sees HELD, which holds.
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
	var rdb *redis.Client
	if srv, ok := res[strategy.Redis]; ok && srv.Controllable() {
		opt, err := redis.ParseURL(srv.Addr())
		if err != nil {
			t.Fatalf("the strategy's Redis address: %v", err)
		}
		rdb = redis.NewClient(opt)
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
	// The backend is idle once it has sent the COMMIT's answer, not once
	// the strategy has read it: a caller that gives up in between makes
	// pgx fail the read, and the strategy rightly answers an error. A
	// client of the paused Redis seen blocked is the strategy past its
	// commit, writing; an answer first means it had nothing to write.
	var a answer
	answered := false
	if rdb != nil {
		a, answered, err = awaitPausedWriter(ctx, rdb, done)
		if err != nil {
			t.Fatalf("Reserve %q, its COMMIT gone through: %v", req.Key, err)
		}
	}
	giveUp()
	unpause()
	if !answered {
		a = <-done
	}
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

// awaitPausedWriter waits until one of rdb's clients is blocked by its
// CLIENT PAUSE WRITE (flag b in CLIENT LIST), or the request is answered
// first (answered true). The pause ends by itself after redisPauseFor, so
// one of the two comes.
func awaitPausedWriter(ctx context.Context, rdb *redis.Client, done <-chan answer) (a answer, answered bool, err error) {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		list, err := rdb.ClientList(ctx).Result()
		if err != nil {
			return answer{}, false, fmt.Errorf("CLIENT LIST of the strategy's Redis: %w", err)
		}
		if pausedWriter(list) {
			return answer{}, false, nil
		}
		select {
		case a := <-done:
			return a, true, nil
		case <-ctx.Done():
			return answer{}, false, fmt.Errorf("neither answered nor seen writing to Redis: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// pausedWriter reports whether a CLIENT LIST reply has a client blocked
// (flag b): under CLIENT PAUSE WRITE, one waiting to write.
func pausedWriter(list string) bool {
	for _, line := range strings.Split(list, "\n") {
		for _, field := range strings.Fields(line) {
			if flags, ok := strings.CutPrefix(field, "flags="); ok && strings.Contains(flags, "b") {
				return true
			}
		}
	}
	return false
}
