package strategytest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkJoinedTextInFlight: two requests in flight on one node at once,
// whose key and user joined with ':' read the same ("K:1" by "u", and "K"
// by "1:u"), are two requests. Each waits behind its own twin, an attempt
// held open with its key, user and SKU; the first twin commits, and the
// second request, still waiting for its own, must not be answered with the
// first one's answer. A node that merges identical requests in flight
// (memquota's coalescing) by an id made of the joined texts answered the
// second with the first's REPLAY, and the kit's other joined texts are
// sent one at a time (outsider round 18). It needs two attempts of one SKU
// held open at once: where the second waits for the first (a stock row, a
// lock of the SKU), no two requests of the SKU are in flight together, and
// the check is skipped. The first twin commits only once the second
// request is in flight: seen waiting on a lock in PostgreSQL (behind its own
// twin, or behind the first request), or, after flightSeenWithin, taken to
// wait outside it, as a request merged with the first waits in the node's
// memory. So a merging node is caught in every run, not only when the
// second request's goroutine beat the first twin's COMMIT (13 of 13 runs
// before, a 95% bound on the miss of 0.21 per table run).
func checkJoinedTextInFlight(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "joined-flight", 4)
	defer dep.Close()
	node := dep.Node(0)
	opener, ok := node.(strategy.SessionOpener)
	if !ok {
		t.Skip("no attempt held open (strategy.SessionOpener)")
	}
	first := strategy.Request{Key: "kit-jf-" + sku + ":1", User: "kit-jf-u", SKU: sku, TTL: time.Hour}
	second := strategy.Request{Key: "kit-jf-" + sku, User: "1:kit-jf-u", SKU: sku, TTL: time.Hour}

	twin1, pids1 := holdInSession(ctx, t, opener, first, "the first request's twin, held open")
	defer func() { _ = twin1.Rollback(context.Background()) }()
	twin2, err := opener.OpenSession(ctx)
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	defer func() { _ = twin2.Rollback(context.Background()) }()
	var box panicBox
	defer box.rethrow()
	held2 := reserveAsync(ctx, &box, twin2, second)
	if blocked, err := awaitAnswerOrBlocked(ctx, admin, int32(pids1[0]), held2); err != nil {
		t.Fatalf("the second twin beside the first: %v", err)
	} else if blocked {
		_ = twin1.Rollback(ctx)
		<-held2
		t.Skip("a second attempt of the SKU waits for the first: no two requests of one SKU are in flight together")
	}
	switch a := <-held2; {
	case a.err != nil:
		t.Fatalf("the second request's twin, held open beside the first's: %v", a.err)
	case a.res.Outcome != strategy.OutcomeHeld:
		// Refused beside the first (BUSY: it queued for a lock of the SKU
		// outside PostgreSQL until its wait ran out).
		t.Skip("a second attempt of the SKU is refused while the first is held open (" + string(a.res.Outcome) + "): no two requests of one SKU are in flight together")
	}
	pids2 := twin2.Backends()
	if len(pids2) == 0 {
		t.Skip("the attempt held open reports no backend: a wait behind it cannot be seen in PostgreSQL")
	}

	d1 := reserveAsync(ctx, &box, node, first)
	if blocked, err := awaitAnswerOrBlocked(ctx, admin, int32(pids1[0]), d1); err != nil {
		t.Fatalf("the first request behind its twin: %v", err)
	} else if !blocked {
		a := <-d1
		t.Skip("a request is answered without waiting for its twin held open (" + string(a.res.Outcome) + "): it is never in flight beside another")
	}
	d2 := reserveAsync(ctx, &box, node, second)
	if err := awaitLockWaitersWithin(ctx, admin, 2, d2, flightSeenWithin); err != nil {
		t.Fatalf("the second request in flight beside the first: %v", err)
	}
	// A twin's COMMIT may fail for its own reasons (SERIALIZABLE's commit
	// check meets the other twin's count): the requests behind it then go
	// on by themselves, and each answer must still be its own.
	commit1 := twin1.Commit(ctx)
	a1 := <-d1
	// The second request now waits for its own twin, in PostgreSQL, or has
	// been answered: with an answer that is not its own.
	waits, err := awaitAnswerOrBlocked(ctx, admin, int32(pids2[0]), d2)
	if err != nil {
		t.Fatalf("the second request behind its twin: %v", err)
	}
	commit2 := twin2.Commit(ctx)
	a2 := <-d2
	if a2.err != nil {
		return // unknown: says nothing of whose answer it is
	}
	k := a2.res.Reservation.Key
	names := a2.res.Outcome == strategy.OutcomeReplay || a2.res.Outcome == strategy.OutcomeHeld
	switch {
	case commit2 == nil && (a2.res.Outcome != strategy.OutcomeReplay || k != second.Key):
		t.Errorf("key %q by user %q, in flight while key %q by user %q was (each behind its twin held open): answered %s about key %q (user %q)%s, after the other got %s, %v (its twin's COMMIT: %v); want REPLAY of its own key once its twin committed",
			second.Key, second.User, first.Key, first.User, a2.res.Outcome, k, a2.res.Reservation.User,
			map[bool]string{true: "", false: " before its own twin ended"}[waits], a1.res.Outcome, a1.err, commit1)
	case commit2 != nil && names && k != second.Key:
		t.Errorf("key %q by user %q, in flight while key %q by user %q was (each behind its twin held open, its own twin's COMMIT failed: %v): answered %s about key %q (user %q); want an answer about its own key",
			second.Key, second.User, first.Key, first.User, commit2, a2.res.Outcome, k, a2.res.Reservation.User)
	}
}

// flightSeenWithin bounds the wait for the second request to be seen
// waiting in PostgreSQL; past it, the request waits elsewhere. Far beyond a
// goroutine's start on a loaded machine, and paid only by a node whose
// second request waits outside PostgreSQL.
const flightSeenWithin = 2 * time.Second
