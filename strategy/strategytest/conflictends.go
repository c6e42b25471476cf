package strategytest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkConflictEndsBeforeLookup: a request refused by a unique index for
// its user's active reservation, whose conflict ends (the reservation is
// released) before the strategy's next statement asks why, is never SOLD_OUT:
// the SKU had units the whole time. It is USER_LIMIT (true when the index
// refused it) or HELD (asked again once nothing conflicts). A strategy that
// reads "refused, but nothing conflicts any more" as SOLD_OUT answers a
// phantom sold-out (outsider round 35's m2otinvisiblesoldout, onetrip):
// no scenario released the conflicting reservation in that moment, one
// round trip long, so every scenario passed. The kit holds the statement
// that follows the refusal on the same connection (holdTracer), releases
// the reservation through the node meanwhile, then lets it go. Where the
// release waits for the refused request's transaction (seen in
// pg_blocking_pids), the statement is let go first, and the check still
// holds the request to the same answers. A strategy that sends no
// statement after a refusal by a unique index, or claims no
// no-phantom-sold-out, is not checked.
func checkConflictEndsBeforeLookup(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	if !meta.Claims.Has(strategy.NoPhantomSoldOut) {
		t.Skip("no-phantom-sold-out is not claimed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conflictEndsBeforeLookup(ctx, t, meta, db, admin, rs, false)
	// Again inside an attempt held open, where a strategy explains a
	// refusal on a path of its own (it cannot run the request again):
	// onetrip's attempt answered SOLD_OUT there while its plain path
	// passed (outsider round 55's m33).
	conflictEndsBeforeLookup(ctx, t, meta, db, admin, rs, true)
}

// conflictEndsBeforeLookup is checkConflictEndsBeforeLookup's sequence on
// a deployment of its own, the user's second request sent plainly or, with
// inSession, inside an attempt held open (then rolled back); a strategy
// without attempts is not asked the second.
func conflictEndsBeforeLookup(ctx context.Context, t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string, inSession bool) {
	t.Helper()
	name, where := "conflict-ends", ""
	if inSession {
		name, where = "conflict-ends-s", "in an attempt held open, "
	}
	h, dep, sku, closeAll := openTraced(ctx, t, meta, db, rs, name, 3)
	defer closeAll()
	node := dep.Node(0)
	releaser, ok := node.(strategy.Releaser)
	if !ok {
		t.Skip("no Release (strategy.Releaser)")
	}
	var via reserver = node
	if inSession {
		s, ok := sessionOn(ctx, t, node)
		if !ok {
			return
		}
		defer func() { _ = s.Rollback(ctx) }()
		via = s
	}
	first := strategy.Request{Key: "kit-ce-first-" + sku, User: "kit-ce-user", SKU: sku, TTL: time.Hour}
	holdForCheck(ctx, t, node, first)
	second := first
	second.Key = "kit-ce-second-" + sku

	var box panicBox
	defer box.rethrow()
	h.arm(afterUniqueViolation)
	done := reserveAsync(ctx, &box, via, second)
	pid, held, err := awaitHeld(ctx, h, done)
	if err != nil {
		t.Fatalf("%sthe second request of the user: %v", where, err)
	}
	if !held {
		h.arm(nil)
		a := <-done
		if a.err == nil && a.res.Outcome == strategy.OutcomeUserLimit {
			if inSession {
				return
			}
			t.Skip("the request was answered with no statement after a refusal by a unique index: no moment between the refusal and the reading of why")
		}
		t.Errorf("%sa second request of a user who holds the SKU (3 units, 1 held): %s, %v; want USER_LIMIT", where, a.res.Outcome, a.err)
		return
	}
	released := make(chan answer, 1)
	go func() {
		var a answer
		defer func() { released <- a }()
		defer box.catch()
		var n int
		n, a.err = releaser.Release(ctx, first.Key)
		if a.err == nil && n != 1 {
			a.res.Outcome = strategy.OutcomeSoldOut // a marker: read below
		}
	}()
	if _, err := awaitAnswerOrBlocked(ctx, admin, int32(pid), released); err != nil {
		t.Fatalf("%sRelease of the user's reservation while the statement after the refusal waits: %v", where, err)
	}
	h.letGo()
	a := <-done
	if s, ok := via.(strategy.Session); ok {
		_ = s.Rollback(ctx) // the release may wait for the attempt's locks
	}
	r := <-released
	switch {
	case r.err != nil:
		t.Fatalf("Release of the user's HELD reservation: %v", r.err)
	case r.res.Outcome != "":
		t.Errorf("Release of the user's HELD reservation gave back no unit; want 1")
	}
	switch {
	case a.err != nil:
		// unknown: says nothing of what it would have answered
	case a.res.Outcome == strategy.OutcomeUserLimit:
	case a.res.Outcome == strategy.OutcomeHeld && a.res.Reservation.Key == second.Key:
	default:
		t.Errorf("%sa request refused for its user's reservation, which was released before the strategy's next statement (3 units, at most 1 held at any time): %s (reservation %q); want USER_LIMIT or HELD, never a sold-out while units were free",
			where, a.res.Outcome, a.res.Reservation.Key)
	}
}
