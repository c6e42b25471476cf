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
	s, err := opener.OpenSession(ctx)
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	defer func() { _ = s.Rollback(ctx) }()
	res, err := s.Reserve(ctx, strategy.Request{Key: "kit-plain-session-held-" + sku, User: "kit-plain-session-a", SKU: sku, TTL: time.Hour})
	if err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("Session.Reserve of the only unit: %s, %v; want HELD", res.Outcome, err)
	}
	backends := s.Backends()
	if len(backends) == 0 {
		t.Skip("the session reports no backend: a wait behind it cannot be seen in PostgreSQL")
	}
	type answer struct {
		res strategy.Result
		err error
	}
	done := make(chan answer, 1)
	var box panicBox
	defer box.rethrow()
	go func() {
		var a answer
		defer func() { done <- a }()
		defer box.catch()
		a.res, a.err = dep.Node(0).Reserve(ctx, strategy.Request{Key: "kit-plain-session-plain-" + sku, User: "kit-plain-session-b", SKU: sku, TTL: time.Hour})
	}()
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
