package strategytest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkOthersGiveUp: three requests for one SKU, X, A and B, reach node 0
// one after another while their writes wait (the harness holds the
// strategy's tables in SHARE mode). X's caller gives up; once X has
// answered, or its work goes on without it, A's caller gives up while A is
// on its way; then the tables are let go. B's caller never gave up and met
// no fault: it gets a definite answer, HELD (a unit is left for it
// whatever X and A did) or BUSY. A strategy that serves requests together
// and runs their work under one caller's context (combine's batch under
// its first request's) ends B with that caller's cancellation; the kit's
// other give-ups are one request at a time (outsider round 19).
//
// The waits are read from pg_stat_activity; the bound on X's answer only
// lets a strategy whose work outlives its caller go on, and orders nothing
// the verdict relies on. Whether A and B are both in the queue when X's
// work ends is the scheduler's doing (their calls have begun, nothing
// more can be seen): a batch under its first caller was missed in 1 run
// of 18 with one round, so the check runs giveUpRounds of them.
func checkOthersGiveUp(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	for range giveUpRounds {
		othersGiveUp(t, meta, db, admin, rs)
	}
}

// giveUpRounds is how many times checkOthersGiveUp runs its round.
const giveUpRounds = 3

// othersGiveUp is one round of checkOthersGiveUp, on a SKU of its own.
func othersGiveUp(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "give-up", 3)
	defer dep.Close()
	release := holdTablesOrSkip(ctx, t, admin)
	defer func() { release() }()
	var box panicBox
	defer box.rethrow()
	req := func(name string) strategy.Request {
		return strategy.Request{Key: "kit-gu-" + name + "-" + sku, User: "kit-gu-" + name, SKU: sku, TTL: time.Hour}
	}
	xCtx, giveUpX := context.WithCancel(ctx)
	defer giveUpX()
	x := reserveAsync(xCtx, &box, dep.Node(0), req("x"))
	if err := awaitLockWaiters(ctx, admin, 1, x); err != nil {
		t.Fatalf("X while the tables are held: %v", err)
	}
	aCtx, giveUpA := context.WithCancel(ctx)
	defer giveUpA()
	a := reserveAsync(aCtx, &box, dep.Node(0), req("a"))
	if err := awaitQueued(ctx, dep.Node(0), sku, 1, x, a); err != nil {
		t.Fatalf("A behind X: %v", err)
	}
	b := reserveAsync(ctx, &box, dep.Node(0), req("b"))
	if err := awaitQueued(ctx, dep.Node(0), sku, 2, x, a, b); err != nil {
		t.Fatalf("A and B behind X: %v", err)
	}
	giveUpX()
	xCame := func() bool {
		bound, stop := context.WithTimeout(ctx, giveUpSeenWithin/4)
		defer stop()
		return awaitAnswerOr(bound, x, func() (bool, error) { return false, nil }) == nil
	}()
	// A and B are on their way: two writes wait, or one that began after X
	// answered (a batch of both, sent once X's ended). X's own statement
	// may still be seen waiting for a moment after its caller has its
	// error, so it does not count.
	var since time.Time
	if err := admin.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&since); err != nil {
		t.Fatalf("read the server's clock: %v", err)
	}
	seenCtx, seenCancel := context.WithTimeout(ctx, giveUpSeenWithin)
	err := awaitAnswerOr(seenCtx, a, func() (bool, error) {
		var all, fresh int
		err := admin.QueryRow(seenCtx, sqlWaitingSince, since).Scan(&all, &fresh)
		return all >= 2 || fresh > 0, err
	})
	seenCancel()
	if err != nil && ctx.Err() != nil {
		t.Fatalf("A and B, once X's caller gave up: %v", err)
	}
	giveUpA()
	release()
	release = func() {}
	var ab answer
	select {
	case ab = <-b:
	case <-time.After(giveUpAnswerWithin):
		// A node that blocks on delivering an answer nobody waits for
		// (outsider round 30's cb5: an unbuffered channel to a caller that
		// gave up) never answers B: a verdict now, not the round's
		// minute, three rounds over, and every later check's.
		t.Fatalf("three requests for a SKU of 3 units while their writes waited; the callers of the first two gave up; the third's caller did not, and no fault was made: no answer %v after the writes could go on; want HELD (or BUSY)", giveUpAnswerWithin)
	}
	if ab.err != nil || (ab.res.Outcome != strategy.OutcomeHeld && ab.res.Outcome != strategy.OutcomeBusy) {
		t.Errorf("three requests for a SKU of 3 units while their writes waited; the callers of the first two gave up (the first answered before the writes could go on: %v); the third's caller did not, and no fault was made: %s, %v; want HELD (or BUSY)",
			xCame, ab.res.Outcome, ab.err)
	}
	<-x
	<-a
}

// sqlWaitingSince counts the backends of the database that wait for a
// heavyweight lock, and those of them whose statement began after $1.
const sqlWaitingSince = `
SELECT count(*), count(*) FILTER (WHERE query_start > $1) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'`

// giveUpSeenWithin bounds checkOthersGiveUp's waits for an answer, or a
// write seen waiting, that may not come.
const giveUpSeenWithin = 2 * time.Second

// giveUpAnswerWithin bounds the wait for B's answer once the tables are
// let go: B's write takes milliseconds then, a busy machine's seconds.
const giveUpAnswerWithin = 20 * time.Second
