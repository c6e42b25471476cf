package strategytest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkExpiryBehindAttempt: an expiry job that waits behind an attempt
// held open on the same SKU (for its stock row, or whatever the attempt
// holds), which then commits, moves each due reservation once and reports
// exactly the units it gave back. Under REPEATABLE READ or SERIALIZABLE
// the job is refused (40001) once the attempt commits and must run again
// from the start: a job that moves rows in one statement and gives units
// back in another, and keeps its count across the retry, reports the
// first try's units too. The expiry races of the scenarios run jobs
// against each other and against confirms, never behind an attempt that
// changes the stock row and commits.
func checkExpiryBehindAttempt(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("expiry-behind")
	const total = 3
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: total}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	ager, isAger := dep.(strategy.Ager)
	expirer, isExpirer := dep.Node(0).(strategy.Expirer)
	opener, isOpener := dep.Node(0).(strategy.SessionOpener)
	if !isAger || !isExpirer || !isOpener {
		t.Skip("needs MakeDue (strategy.Ager), ExpireDue (strategy.Expirer) and an attempt held open (strategy.SessionOpener)")
	}
	due := strategy.Request{Key: "kit-expiry-behind-due-" + sku, User: "kit-expiry-behind-due", SKU: sku, TTL: time.Hour}
	if res, err := reserveUnlessBusy(ctx, dep.Node(0), due); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("Reserve: %s, %v; want HELD", res.Outcome, err)
	}
	if n, err := ager.MakeDue(ctx, []string{due.Key}); err != nil || n != 1 {
		t.Fatalf("MakeDue: %d, %v; want 1", n, err)
	}
	session, holder := holdInSession(ctx, t, opener, strategy.Request{Key: "kit-expiry-behind-attempt-" + sku, User: "kit-expiry-behind-attempt", SKU: sku, TTL: time.Hour},
		"an attempt held open on the SKU")
	defer func() { _ = session.Rollback(ctx) }()

	type expired struct {
		units int
		err   error
	}
	done := make(chan expired, 1)
	go func() {
		units, err := expirer.ExpireDue(ctx)
		done <- expired{units, err}
	}()
	waited, err := awaitAnswerOrBlocked(ctx, admin, int32(holder[0]), done)
	if err != nil {
		t.Fatalf("ExpireDue beside the attempt: %v", err)
	}
	if err := session.Commit(ctx); err != nil {
		t.Fatalf("Commit of the attempt: %v", err)
	}
	job := <-done
	if job.err != nil {
		// A job refused and not run again has moved nothing; it runs again.
		if job.units, job.err = expirer.ExpireDue(ctx); job.err != nil {
			t.Fatalf("ExpireDue after the attempt committed: %v", job.err)
		}
	}
	r, err := dep.Node(0).Lookup(ctx, due.Key)
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	list, err := dep.Audit(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("Audit: %+v, %v", list, err)
	}
	a := list[0]
	if job.units != 1 || r.Status != strategy.StatusExpired || a.Active != 1 || a.Available != total-1 || a.Drift() != 0 {
		t.Errorf("ExpireDue of one due reservation, behind an attempt held open on its SKU that then committed (the job waited for it: %v): reported %d units, the reservation is %s, audit %+v; want 1 unit, EXPIRED, available %d, active 1",
			waited, job.units, r.Status, a, total-1)
	}
}
