package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
)

// outlastAtLeast is the shortest hold of checkWaitOutlastsTimeouts: past a
// timeout a strategy keeps in its own code (a context deadline of a few
// seconds) as well as the 1 s and 2 s of a lock_timeout, which the
// pool's tracer reads anyway (pgtest.LongestTimeoutSet).
const outlastAtLeast = 6 * time.Second

// outlastAtMost caps the hold: a timeout longer than this is the caller's
// business, not a lock wait's.
const outlastAtMost = 40 * time.Second

// checkWaitOutlastsTimeouts: a request that waits behind an attempt held
// open on its SKU (strategy.SessionOpener), or, for a strategy without
// them, behind rows another transaction holds (the way an UPDATE in flight
// holds them), for longer than
// any lock_timeout or statement_timeout the strategy set on its pool's
// connections and at least outlastAtLeast, is not answered SOLD_OUT while
// its SKU has units. A strategy may give up at a timeout of its own: it
// then answers BUSY (nothing written) or an error (unknown), never an
// answer that says it tried. The kit's other lock waits last about a
// second: an advisorylock that bounded its wait for the SKU's lock with a
// 5 s lock_timeout and answered SOLD_OUT passed every scenario before
// (ctl-lock-timeout-sold-out, 500 ms, is caught in contention already).
// The wait is read from the server (pg_blocking_pids); the hold's length
// is what is checked, not a synchronisation. A request that waits outside
// PostgreSQL (for a lock in Redis, strategy.LockTaker) is held as long as
// it waits; one that does not wait at all must not answer SOLD_OUT either,
// with a unit free beside the one held.
func checkWaitOutlastsTimeouts(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string, refused *outlastRefusals) {
	t.Helper()
	// The hold is read once the first requests have run: a strategy that
	// sets its timeouts on its requests has set them by then.
	waitBehindHold(t, meta, db, admin, rs, "outlast", func() time.Duration {
		return min(max(outlastAtLeast, pgtest.LongestTimeoutSet(db)+time.Second), outlastAtMost)
	}, refused)
}

// outlastRefusals keeps what checkWaitOutlastsTimeouts and
// checkServerCancelsWait found besides SOLD_OUT: a USER_LIMIT, KEY_REUSED
// or REPLAY for a request whose key and user held nothing is wrong under
// the contract itself, where a SOLD_OUT is a phantom sold-out, which a
// strategy may not claim to avoid (slotrows; outsider round 48's
// lock_timeout answered USER_LIMIT passed as that strategy's boundary).
type outlastRefusals struct{ laterVerdict }

// report is the check of checkOutlastRefusals: it judges what the two
// holds found.
func (o *outlastRefusals) report(t tester) {
	t.Helper()
	o.judge(t, "no request waited behind a hold (checkWaitOutlastsTimeouts and checkServerCancelsWait did not run)")
}

// serverStatementTimeout is the statement_timeout of checkServerCancelsWait's
// sessions, as a DBA's ALTER ROLE ... SET would give them.
const serverStatementTimeout = 400 * time.Millisecond

// checkServerCancelsWait: checkWaitOutlastsTimeouts where the server, not
// the strategy, gives up: the deployment's sessions have a
// statement_timeout of serverStatementTimeout (set by a DBA for the role),
// and the requests wait 2 s behind the hold. A statement the server
// cancelled (57014) wrote nothing and says nothing about the stock: BUSY
// or an error, never SOLD_OUT. The kit gives up on a request only by
// cancelling the caller's context, so a strategy that read a cancelled
// statement as "no unit left" answered from a follow-up read on that same
// cancelled context, which failed, and passed every scenario (outsider
// round 27's onetrip mutant). A strategy that sets a statement_timeout of
// its own for its statements is not cancelled by this one.
func checkServerCancelsWait(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string, refused *outlastRefusals) {
	t.Helper()
	cfg := db.Config().Copy()
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = fmt.Sprint(serverStatementTimeout.Milliseconds())
	timed, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("a pool whose sessions have a statement_timeout: %v", err)
	}
	defer closeKitPool(timed)
	waitBehindHold(t, meta, timed, admin, rs, "server-timeout", func() time.Duration { return 5 * serverStatementTimeout }, refused)
}

// waitBehindHold is checkWaitOutlastsTimeouts with its pool, its SKU's
// name and how long to hold (read once the first request waits).
func waitBehindHold(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string, name string, hold func() time.Duration, refused *outlastRefusals) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), outlastAtMost+time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, name, 6)
	defer dep.Close()
	node := dep.Node(0)
	// A reservation first, so that the strategy's reservation rows are
	// among the rows held, not only its stock rows (and so that a
	// strategy that sets its timeouts on its requests has set them once).
	first := strategy.Request{Key: "kit-" + name + "-1-" + sku, User: "kit-" + name + "-1", SKU: sku, TTL: time.Hour}
	holdForCheck(ctx, t, node, first)
	req := func(i int) strategy.Request {
		return strategy.Request{Key: fmt.Sprintf("kit-%s-%d-%s", name, i, sku), User: fmt.Sprintf("kit-%s-%d", name, i), SKU: sku, TTL: time.Hour}
	}

	// Six units: the first reservation, the attempt's and one for each
	// request queued, so that a SOLD_OUT is never the count's doing (a
	// strategy that takes a unit for an attempt at once has one for each).
	// Behind an attempt where the strategy has them: it holds the rows its
	// reservation wrote and whatever the strategy locks outside them (an
	// advisory lock); else behind every row of the database's tables.
	// Requests queue there: each later one waits behind the first as well,
	// for whatever the first holds while it waits (a lock in Redis). Behind
	// an attempt, the first two are its key (another user's) and its user
	// (another key): they wait on the key's and the user's unique entries
	// even where new keys of new users wait for nothing (a claim that
	// skips locked rows), and the attempt rolls back, so neither the key
	// nor the user ever held anything (outsider round 48: a lock_timeout
	// of 2 s answered USER_LIMIT passed every hold, which ended once the
	// request was seen waiting).
	if opener, ok := node.(strategy.SessionOpener); ok {
		attempt := req(2)
		session, pids := holdInSession(ctx, t, opener, attempt, "an attempt held open on the SKU")
		defer func() { _ = session.Rollback(context.Background()) }()
		sameKey := strategy.Request{Key: attempt.Key, User: fmt.Sprintf("kit-%s-5", name), SKU: sku, TTL: time.Hour}
		sameUser := strategy.Request{Key: fmt.Sprintf("kit-%s-6-%s", name, sku), User: attempt.User, SKU: sku, TTL: time.Hour}
		outlastQueue(ctx, t, db, admin, node, []strategy.Request{sameKey, sameUser, req(3), req(4)}, "an attempt held open on the SKU (then rolled back)", int32(pids[0]), hold, func() error { return session.Rollback(context.Background()) }, refused)
		return
	}
	tx, holder := holdAllRows(ctx, t, admin)
	defer tx.Rollback(context.Background()) //nolint:errcheck // rolled back in outlastQueue
	outlastQueue(ctx, t, db, admin, node, []strategy.Request{req(2), req(3)}, "the transaction that held the rows", holder, hold, func() error { return tx.Rollback(context.Background()) }, refused)
}

// outlastQueue sends the first request and, once it waits for holder (or
// has answered), the others; it keeps holder for the hold, then lets go.
// Every request is new, or its key's and its user's only other request is
// what holder rolls back, and the SKU has units: an answer that says the
// request was tried and refused is the failure, SOLD_OUT here and
// USER_LIMIT, KEY_REUSED or REPLAY in refused.
func outlastQueue(ctx context.Context, t tester, db, admin *pgxpool.Pool, node strategy.Strategy, reqs []strategy.Request, behind string, holder int32, holdFor func() time.Duration, letGo func() error, refused *outlastRefusals) {
	t.Helper()
	var box panicBox
	defer box.rethrow()
	refused.ran = true
	first := reserveAsync(ctx, &box, node, reqs[0])
	waited, probeErr := awaitAnswerOrBlocked(ctx, admin, holder, first)
	dones := []chan answer{first}
	for _, r := range reqs[1:] {
		dones = append(dones, reserveAsync(ctx, &box, node, r))
	}
	hold := holdFor()
	answeredInHold := make([]bool, len(dones))
	if probeErr == nil && waited {
		deadline := time.After(hold)
	holding:
		for i, done := range dones {
			select {
			case a := <-done:
				done <- a
				answeredInHold[i] = true
			case <-deadline:
				break holding
			}
		}
	}
	if err := letGo(); err != nil {
		t.Errorf("let go of %s: %v", behind, err)
	}
	if probeErr != nil {
		for _, done := range dones {
			<-done
		}
		t.Fatalf("read the lock waits behind %s: %v", behind, probeErr)
	}
	for i, done := range dones {
		a := <-done
		if a.err != nil {
			continue
		}
		var why string
		switch a.res.Outcome {
		case strategy.OutcomeSoldOut:
			why = "that the SKU has no unit"
		case strategy.OutcomeUserLimit:
			why = "that its user holds the SKU"
		case strategy.OutcomeKeyReused, strategy.OutcomeReplay:
			why = "that its key is known"
		default:
			continue
		}
		how := "without a wait seen in PostgreSQL (a wait elsewhere, for a lock in Redis, ends when the strategy gives up)"
		if waited {
			how = fmt.Sprintf("after the first request was seen waiting for it (pg_blocking_pids), which held on for %s, %s", hold, map[bool]string{true: "before it let go", false: "after it let go"}[answeredInHold[i]])
		}
		msg := fmt.Sprintf("Reserve %q (user %q, request %d of %d in the queue, units left) was answered %s behind %s %s: a request that gave up at a timeout of its own must answer BUSY or an error (unknown), not %s (the longest timeout the strategy's queries set: %s)",
			reqs[i].Key, reqs[i].User, i+1, len(reqs), a.res.Outcome, behind, how, why, pgtest.LongestTimeoutSet(db))
		if a.res.Outcome == strategy.OutcomeSoldOut {
			t.Errorf("%s", msg)
		} else {
			refused.failf("%s", msg)
		}
	}
}
