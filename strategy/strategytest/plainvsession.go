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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("plain-session")
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 1}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	opener, ok := dep.Node(0).(strategy.SessionOpener)
	if !ok {
		t.Skip("no attempt held open (strategy.SessionOpener)")
	}
	s, backends := holdInSession(ctx, t, opener, strategy.Request{Key: "kit-plain-session-held-" + sku, User: "kit-plain-session-a", SKU: sku, TTL: time.Hour}, "Session.Reserve of the only unit")
	defer func() { _ = s.Rollback(ctx) }()
	var box panicBox
	defer box.rethrow()
	done := reserveAsync(ctx, &box, dep.Node(0), strategy.Request{Key: "kit-plain-session-plain-" + sku, User: "kit-plain-session-b", SKU: sku, TTL: time.Hour})
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
		t.Errorf("a plain Reserve was HELD while an attempt held open had the only unit: it took no lock the attempt holds")
	}
	if err := s.Commit(ctx); err != nil {
		t.Fatalf("Commit of the attempt held open: %v", err)
	}
	if early == nil {
		a := <-done
		early = &a
		if a.err == nil && a.res.Outcome == strategy.OutcomeHeld {
			t.Errorf("a plain Reserve that waited for the attempt holding the only unit was HELD after it committed")
		}
	}
	list, err := dep.Audit(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("Audit: %+v, %v", list, err)
	}
	if a := list[0]; a.Active > a.Total || a.Drift() != 0 {
		t.Errorf("audit after a plain Reserve beside an attempt held open on the last unit: %+v; want at most 1 active, drift 0", a)
	}
}
