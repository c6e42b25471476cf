package strategytest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// keptDeadline is the strategy.Config.InternalDeadline of
// checkInternalDeadlineKept, and keptWithin how long after its caller
// gave up a request's work may still wait in PostgreSQL.
const (
	keptDeadline = 300 * time.Millisecond
	keptWithin   = 5 * time.Second
)

// checkInternalDeadlineKept: work a strategy does for a request under a
// deadline of its own (combine's batch) ends by strategy.Config's
// InternalDeadline once the request's caller has given up. The request is
// sent while an admin transaction holds every table of the strategy
// (lockTables), given up on once it is seen waiting (pg_blocking_pids),
// and then no backend may still wait behind those tables keptWithin later:
// work bounded by the caller's context ends with it, and work of the
// strategy's own by the 300 ms it was given. A combine whose batch kept
// its 30 s default passed every scenario (outsider round 56's m13):
// commit-timeout's callers give up first, and their answer is unknown
// either way. A request that waits outside PostgreSQL is not judged.
func checkInternalDeadlineKept(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("internal-deadline")
	cfg := strategy.Config{Resources: rs, DB: db, InternalDeadline: keptDeadline, Stock: []strategy.Stock{{SKU: sku, Total: 2}}}
	dep, err := meta.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	internalDeadlineKept(ctx, t, admin, dep, sku, "kit-internal-deadline-"+sku, "")
	// A process that attaches keeps the deadline too (outsider round 56's
	// m36: combine's Attach dropped it).
	if meta.Attach != nil {
		attached, err := meta.Attach(ctx, cfg)
		if err != nil {
			t.Fatalf("Attach: %v", err)
		}
		defer attached.Close()
		internalDeadlineKept(ctx, t, admin, attached, sku, "kit-internal-deadline-attached-"+sku, "on an attached deployment, ")
	}
}

// internalDeadlineKept is checkInternalDeadlineKept's request for sku,
// with key, on dep.
func internalDeadlineKept(ctx context.Context, t tester, admin *pgxpool.Pool, dep strategy.Deployment, sku, key, where string) {
	t.Helper()
	req := strategy.Request{Key: key, User: "kit-internal-deadline", SKU: sku, TTL: time.Hour}
	lockTables(ctx, t, admin, nil, func(holder int32) {
		callerCtx, giveUp := context.WithCancel(ctx)
		defer giveUp()
		var box panicBox
		done := reserveAsync(callerCtx, &box, dep.Node(0), req)
		blocked, err := awaitAnswerOrBlocked(ctx, admin, holder, done)
		giveUp()
		if err != nil {
			t.Fatalf("Reserve with the strategy's tables locked: %v", err)
		}
		givenUpAnswer(t, done, "Reserve waiting behind the locked tables")
		box.rethrow()
		if !blocked {
			if where == "" {
				t.Skip("the request did not wait in PostgreSQL behind the locked tables")
			}
			return
		}
		bound, stop := context.WithTimeout(ctx, keptWithin)
		defer stop()
		if err := awaitNoWaiter(bound, admin, holder); err != nil {
			t.Errorf("%sReserve %q, waiting behind the strategy's locked tables, given up by its caller; with Config.InternalDeadline %v, its work still waits %v later: %v (work no caller bounds ends by InternalDeadline)",
				where, req.Key, keptDeadline, keptWithin, err)
		}
	})
}
