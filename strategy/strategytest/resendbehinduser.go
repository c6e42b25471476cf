package strategytest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/pgtest"

	"github.com/reservebench/reservebench/strategy"
)

// checkResendBehindUser: a request B waits behind an attempt held open for
// its own user and SKU (another key), and its client, tired of waiting,
// sends it again through another node, one with no unit of the SKU (its
// share is 0). The attempt rolls back, so B holds a unit; its resend is the
// same request, and must be answered as one: REPLAY (or HELD, with B's
// REPLAY), or BUSY or an error, never SOLD_OUT, USER_LIMIT or KEY_REUSED.
//
// A node that answers SOLD_OUT from its own count first asks the log
// whether the key is there, and waits for the key's row in flight; but B's
// row is not in flight yet, it waits before its insert on the per-user
// index, so a wait on the key's index alone finds nothing, and the resend
// was told SOLD_OUT while B went on to hold (memquota's sold-out path
// before it waited for the key's advisory lock; outsider round 18). The
// duplicate-key scenario sends resends beside their first attempts, but
// never while one waits on its user.
//
// Where a request of the user waits elsewhere, or not at all, the check
// is skipped; the resend's wait is read from pg_blocking_pids (behind the
// attempt, or behind B), so it has either answered or waits when the
// attempt rolls back. The resend goes through node 1 of the same process,
// then of a second process that attached (Meta.Attach): a node that finds
// the key in flight by a lock id of its own process's making (a hash seeded
// at start) sees nothing of the first process's insert (outsider round 18).
//
// Last, the resend goes inside an attempt held open on node 1: a node
// whose session path answered SOLD_OUT from its count without waiting for
// the key, where its plain path waited, passed every check that sent the
// resend as a plain request (outsider round 29's mq2).
func checkResendBehindUser(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	resendBehindUser(t, meta, db, admin, rs, resendPlain, 0)
	if meta.Attach != nil {
		resendBehindUser(t, meta, db, admin, rs, resendAttached, 0)
	}
	resendBehindUser(t, meta, db, admin, rs, resendInSession, 0)
}

// resendVia is where resendBehindUser sends the resend.
type resendVia int

const (
	resendPlain     resendVia = iota // node 1 of the same process
	resendAttached                   // node 1 of a second process that attached
	resendInSession                  // an attempt held open on node 1, committed once answered
)

// checkResendOutlastsTimeouts is checkResendBehindUser's first pass with
// the user's attempt held open outlastAtLeast after the resend is seen
// waiting (longer than any lock or statement timeout the strategy set on
// its pool's connections, as checkWaitOutlastsTimeouts), not let go at once: a node that waits for the first attempt a
// bounded time (a lock_timeout, a few slices of one) and then answers
// from what it sees, tells the resend SOLD_OUT while its key goes on to
// hold (outsider round 20's hintcap, 2 s). It runs after every other
// check, beside checkWaitOutlastsTimeouts, so that a control caught
// earlier does not pay the hold.
func checkResendOutlastsTimeouts(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	resendBehindUser(t, meta, db, admin, rs, resendPlain, min(max(outlastAtLeast, pgtest.LongestTimeoutSet(db)+time.Second), outlastAtMost))
}

// resendBehindUser is one pass of checkResendBehindUser: the resend goes
// through node 1 of the same process, or (attached) of a second process
// that attached to the stock, as a client that tries another server does.
// Node 0 of the first process and node 1 of the second are the only nodes
// used, so a strategy that counts stock in a node's memory still has one
// live process a node. Once the resend is seen waiting, the attempt is
// held hold longer, unless the resend answers first.
func resendBehindUser(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string, via resendVia, hold time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute+hold)
	defer cancel()
	attached := via == resendAttached
	where := map[resendVia]string{resendPlain: "node 1", resendAttached: "node 1 of a second process that attached", resendInSession: "an attempt held open on node 1"}[via]
	sku := kitSKU("resend-user")
	cfg := strategy.Config{Resources: rs, DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: sku, Total: 3, Shares: []int{3, 0}}}}
	dep, err := meta.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	opener, ok := dep.Node(0).(strategy.SessionOpener)
	if !ok {
		t.Skip("no attempt held open (strategy.SessionOpener)")
	}
	other := dep
	if attached {
		if other, err = meta.Attach(ctx, cfg); err != nil {
			t.Fatalf("Attach a second process to the stock: %v", err)
		}
		defer other.Close()
	}
	user := "kit-ru-u"
	attempt, pids := holdInSession(ctx, t, opener, strategy.Request{Key: "kit-ru-a-" + sku, User: user, SKU: sku, TTL: time.Hour},
		"the user's attempt held open")
	defer func() { _ = attempt.Rollback(context.Background()) }()
	holder := int32(pids[0])

	var box panicBox
	defer box.rethrow()
	req := strategy.Request{Key: "kit-ru-b-" + sku, User: user, SKU: sku, TTL: time.Hour}
	first := reserveAsync(ctx, &box, dep.Node(0), req)
	if blocked, err := awaitAnswerOrBlocked(ctx, admin, holder, first); err != nil {
		t.Fatalf("Reserve %q behind its user's attempt held open: %v", req.Key, err)
	} else if !blocked {
		<-first
		t.Skip("a request of a user whose attempt of the SKU is held open does not wait for it in PostgreSQL")
	}
	var to reserver = other.Node(1)
	var resendSession strategy.Session
	if via == resendInSession {
		if resendSession, err = other.Node(1).(strategy.SessionOpener).OpenSession(ctx); err != nil {
			t.Fatalf("OpenSession on node 1: %v", err)
		}
		defer func() { _ = resendSession.Rollback(context.Background()) }()
		to = resendSession
	}
	resend := reserveAsync(ctx, &box, to, req)
	// A resend that waits outside PostgreSQL (in a node's memory, in Redis)
	// is not seen unless it reports a lock wait (lockWaiting); after
	// resendSeenWithin the attempt rolls back all the same, and the
	// answers are judged as they come.
	seenCtx, seenCancel := context.WithTimeout(ctx, resendSeenWithin)
	err = awaitAnswerOr(seenCtx, resend, func() (bool, error) {
		if lockWaiting(resend) {
			return true, nil
		}
		var n int
		err := admin.QueryRow(seenCtx, sqlBlockedBehind, holder).Scan(&n)
		return n >= 2, err
	})
	seen := err == nil && seenCtx.Err() == nil
	seenCancel()
	if err != nil && ctx.Err() != nil {
		t.Fatalf("the resend of %q through %s while the first waits: %v", req.Key, where, err)
	}
	if seen && hold > 0 {
		// The hold's length is what is checked, not a synchronisation.
		timer := time.NewTimer(hold)
		select {
		case a := <-resend:
			resend <- a
		case <-timer.C:
		case <-ctx.Done():
		}
		timer.Stop()
	}
	if err := attempt.Rollback(ctx); err != nil {
		t.Fatalf("Rollback of the attempt held open: %v", err)
	}
	held := func(a answer) bool {
		return a.err == nil && (a.res.Outcome == strategy.OutcomeHeld || a.res.Outcome == strategy.OutcomeReplay)
	}
	a2 := <-resend
	if resendSession != nil {
		// Its answer first: the first request may wait for what it wrote.
		end := resendSession.Rollback
		if held(a2) {
			end = resendSession.Commit
		}
		if err := end(ctx); err != nil && !abortedByConflict(err) {
			t.Fatalf("the resend's attempt held open on node 1, answered %s: Commit or Rollback: %v", a2.res.Outcome, err)
		}
	}
	a1 := <-first
	refused := func(a answer) bool {
		return a.err == nil && !held(a) && a.res.Outcome != strategy.OutcomeBusy
	}
	switch {
	case a1.err == nil && a2.err == nil && a1.res.Outcome == strategy.OutcomeHeld && a2.res.Outcome == strategy.OutcomeHeld:
		t.Errorf("key %q sent twice (node 0, waiting behind its user's attempt, and %s, with no unit): HELD both times; want one HELD and one REPLAY", req.Key, where)
	case held(a1) && refused(a2), held(a2) && refused(a1):
		t.Errorf("key %q sent on node 0, where it waited behind its user's attempt held open (rolled back), and again on %s, which has no unit of the SKU: answered %s on node 0 and %s there; the two are one request, and a key that holds a unit is answered REPLAY",
			req.Key, where, a1.res.Outcome, a2.res.Outcome)
	}
}

// resendSeenWithin bounds the wait for the resend to be seen waiting. It
// orders nothing the verdict relies on: a resend still on its way when the
// attempt rolls back is judged the same.
const resendSeenWithin = 10 * time.Second

// sqlBlockedBehind counts the backends that wait for $1, directly or behind
// one that waits for it.
const sqlBlockedBehind = `
SELECT count(*) FROM pg_stat_activity a
WHERE a.pid <> $1 AND ($1 = ANY(pg_blocking_pids(a.pid)) OR EXISTS (
	SELECT 1 FROM unnest(pg_blocking_pids(a.pid)) b WHERE $1 = ANY(pg_blocking_pids(b))))`
