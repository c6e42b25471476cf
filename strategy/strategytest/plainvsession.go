package strategytest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkPlainBesideSession: a plain Reserve meets an attempt held open on
// the last unit. It is blocked (seen in pg_blocking_pids), or answers
// without the unit (SOLD_OUT, or BUSY from a lock it could not take); once
// the attempt commits, one reservation is active for the one unit. Every
// interleaving scenario runs all its steps as sessions, so a strategy whose
// plain path and session path take different locks (an advisory lock keyed
// two ways) passes them all and sells the unit twice.
func checkPlainBesideSession(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	plainBesideSession(t, meta, db, admin, rs, false)
	plainBesideSession(t, meta, db, admin, rs, true)
	plainBesideRestartedSession(t, meta, db, admin, rs)
	sessionAfterPlainTookLast(t, meta, db, admin, rs)
}

// sessionAfterPlainTookLast: an attempt held open reserves a unit of SKU
// A; then a plain request takes the only unit of SKU B and commits; then
// the attempt asks for B, whose unit is gone: not HELD, and once the
// attempt commits B has one reservation. An attempt that counts from a
// snapshot taken at its first statement (REPEATABLE READ, here where it is
// the database's default and the attempt does not name its level) sells B
// again (outsider round 49's m02: every other wait of an attempt on that
// database was its first statement's).
func sessionAfterPlainTookLast(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	skuA := kitSKU("session-after-plain")
	skuB := skuA + "-b"
	dep, opener := openForSessions(ctx, t, meta, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: skuA, Total: 1}, {SKU: skuB, Total: 1}}})
	defer dep.Close()
	s, backends := holdInSession(ctx, t, opener, strategy.Request{Key: "kit-session-after-a-" + skuA, User: "kit-session-after-a", SKU: skuA, TTL: time.Hour},
		"Session.Reserve of the only unit of the first SKU")
	defer func() { _ = s.Rollback(ctx) }()
	var box panicBox
	defer box.rethrow()
	done := reserveAsync(ctx, &box, dep.Node(0), strategy.Request{Key: "kit-session-after-plain-" + skuA, User: "kit-session-after-plain", SKU: skuB, TTL: time.Hour})
	waited, err := awaitAnswerOrBlocked(ctx, admin, int32(backends[0]), done)
	if err != nil {
		t.Fatalf("read the lock waits: %v", err)
	}
	if waited {
		return // the plain request waits for the attempt: it cannot sell B before the attempt asks
	}
	if a := <-done; a.err != nil || a.res.Outcome != strategy.OutcomeHeld {
		return // B was not sold: nothing to judge
	}
	res, err := s.Reserve(ctx, strategy.Request{Key: "kit-session-after-b-" + skuA, User: "kit-session-after-b", SKU: skuB, TTL: time.Hour})
	if err == nil && res.Outcome == strategy.OutcomeHeld {
		t.Errorf("an attempt held open, after its first reservation, asked for the only unit of another SKU, which a plain request had taken and committed since: HELD; want it refused (the attempt counted from before that commit)")
	}
	if err != nil {
		return // the attempt is over
	}
	if err := s.Commit(ctx); err != nil {
		return
	}
	list, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	for _, a := range list {
		if a.Active > a.Total || a.Drift() != 0 {
			t.Errorf("audit after an attempt held open asked for a unit a plain request had taken since its first reservation: %+v; want no more active than the total, drift 0", a)
		}
	}
}

// plainBesideRestartedSession: the same across a restart. On a deployment
// of two nodes, node 0 restarts, an attempt held open on it takes the last
// unit, and a plain request goes through node 1: a restarted node must take
// the locks the others take (outsider round 49's m21 locked in a namespace
// of its own after each restart, and no check raced a restarted node for a
// last unit).
func plainBesideRestartedSession(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("plain-restarted")
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: sku, Total: 1}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	r, restarts := dep.(strategy.Restarter)
	if !restarts {
		return
	}
	if err := r.Restart(ctx, 0); err != nil {
		t.Fatalf("Restart of node 0: %v", err)
	}
	opener, ok := dep.Node(0).(strategy.SessionOpener)
	if !ok {
		t.Skip("no attempt held open (strategy.SessionOpener)")
	}
	s, backends := holdInSession(ctx, t, opener, strategy.Request{Key: "kit-plain-restarted-held-" + sku, User: "kit-plain-restarted-a", SKU: sku, TTL: time.Hour},
		"Session.Reserve of the only unit on node 0, restarted")
	defer func() { _ = s.Rollback(ctx) }()
	plainBesideHeldSession(ctx, t, admin, dep, s, backends, dep.Node(1), strategy.Request{Key: "kit-plain-restarted-plain-" + sku, User: "kit-plain-restarted-b", SKU: sku, TTL: time.Hour},
		"an attempt held open on node 0, restarted, the plain request on node 1")
}

// plainBesideSession is one pass of checkPlainBesideSession. With cart, the
// attempt first reserves the one unit of another SKU, then the last unit
// of the plain request's SKU: a checkout of a cart in one transaction. A
// strategy that takes its lock in a session's first attempt only (the
// first SKU's) leaves the second SKU unguarded, and the plain request
// sells its unit too (outsider round 19).
func plainBesideSession(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string, cart bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("plain-session")
	stock := []strategy.Stock{{SKU: sku, Total: 1}}
	what := "an attempt held open"
	if cart {
		stock = append([]strategy.Stock{{SKU: sku + "-first", Total: 1}}, stock...)
		what = "an attempt held open that reserved another SKU first"
	}
	dep, opener := openForSessions(ctx, t, meta, strategy.Config{Resources: rs, DB: db, Stock: stock})
	defer dep.Close()
	held := strategy.Request{Key: "kit-plain-session-held-" + sku, User: "kit-plain-session-a", SKU: sku, TTL: time.Hour}
	var s strategy.Session
	var backends []uint32
	if cart {
		s, backends = holdInSession(ctx, t, opener, strategy.Request{Key: "kit-plain-session-first-" + sku, User: "kit-plain-session-a", SKU: stock[0].SKU, TTL: time.Hour},
			"Session.Reserve of the one unit of the cart's first SKU")
		if res, err := s.Reserve(ctx, held); err != nil || res.Outcome != strategy.OutcomeHeld {
			_ = s.Rollback(ctx)
			t.Fatalf("Session.Reserve of the only unit of a second SKU, after the first: %s, %v; want HELD", res.Outcome, err)
		}
	} else {
		s, backends = holdInSession(ctx, t, opener, held, "Session.Reserve of the only unit")
	}
	defer func() { _ = s.Rollback(ctx) }()
	plainBesideHeldSession(ctx, t, admin, dep, s, backends, dep.Node(0), strategy.Request{Key: "kit-plain-session-plain-" + sku, User: "kit-plain-session-b", SKU: sku, TTL: time.Hour}, what)
}

// plainBesideHeldSession sends plain through node while session s (its
// backends) holds the last unit of plain's SKU: plain is blocked or
// answers without the unit, and once s commits the deployment's audit has
// no SKU over its total.
func plainBesideHeldSession(ctx context.Context, t tester, admin *pgxpool.Pool, dep strategy.Deployment, s strategy.Session, backends []uint32, node strategy.Strategy, plain strategy.Request, what string) {
	t.Helper()
	var box panicBox
	defer box.rethrow()
	done := reserveAsync(ctx, &box, node, plain)
	// The plain request answers, or is seen blocked behind the session in
	// the lock table.
	waited, err := awaitAnswerOrBlocked(ctx, admin, int32(backends[0]), done)
	if err != nil {
		t.Fatalf("read the lock waits: %v", err)
	}
	var early *answer
	if !waited {
		a := <-done
		early = &a
	}
	if early != nil && early.err == nil && early.res.Outcome == strategy.OutcomeHeld {
		t.Errorf("a plain Reserve was HELD while %s had the only unit: it took no lock the attempt holds", what)
	}
	if err := s.Commit(ctx); err != nil {
		t.Fatalf("Commit of the attempt held open: %v", err)
	}
	if early == nil {
		a := <-done
		early = &a
		if a.err == nil && a.res.Outcome == strategy.OutcomeHeld {
			t.Errorf("a plain Reserve that waited for %s holding the only unit was HELD after it committed", what)
		}
	}
	list, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	for _, a := range list {
		if a.Active > a.Total || a.Drift() != 0 {
			t.Errorf("audit after a plain Reserve beside %s on the last unit: %+v; want no more active than the total, drift 0", what, a)
		}
	}
}
