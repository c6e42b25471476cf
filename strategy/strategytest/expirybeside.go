package strategytest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkExpiryBesideAttempt: an expiry job run while an attempt is held open
// on a SKU where nothing is due changes nothing the attempt's commit then
// counts: the SKU has one unit taken, in one active reservation. A job
// that also "heals" each SKU's counter from the reservation rows (SET
// available = total - (SELECT count(*) ...)) waits for the attempt's lock
// on the stock row, and under READ COMMITTED goes on with the count its
// statement read before the attempt committed: the unit comes back while
// its reservation holds it, and sells twice (outsider round 20's resync).
// checkTransitionsBehindAttempt has a due reservation on the attempt's
// SKU, so its job's first statement waits and the heal that follows reads
// the committed row.
func checkExpiryBesideAttempt(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const total = 3
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "expiry-beside", total)
	defer dep.Close()
	node := dep.Node(0)
	opener, isOpener := node.(strategy.SessionOpener)
	expirer, isExpirer := node.(strategy.Expirer)
	if !isOpener || !isExpirer {
		t.Skip("needs an attempt held open (strategy.SessionOpener) and an expiry job (strategy.Expirer)")
	}
	session, holder := holdInSession(ctx, t, opener, strategy.Request{Key: "kit-expiry-beside-" + sku, User: "kit-expiry-beside", SKU: sku, TTL: time.Hour},
		"an attempt held open on the SKU")
	type answered struct {
		n   int
		err error
	}
	done := make(chan answered, 1)
	var box panicBox
	go func() {
		var a answered
		defer func() { done <- a }()
		defer box.catch()
		a.n, a.err = expirer.ExpireDue(ctx)
	}()
	waited, err := awaitAnswerOrBlocked(ctx, admin, int32(holder[0]), done)
	if err != nil {
		_ = session.Rollback(ctx)
		t.Fatalf("ExpireDue beside the attempt: %v", err)
	}
	active := 1
	if err := session.Commit(ctx); err != nil {
		if !abortedByConflict(err) {
			t.Fatalf("Commit of the attempt: %v", err)
		}
		active = 0
	}
	a := <-done
	box.rethrow()
	if a.err != nil {
		// Refused, it has moved nothing; it runs again, as a scheduler would.
		if a.n, a.err = expirer.ExpireDue(ctx); a.err != nil {
			t.Fatalf("ExpireDue after the attempt committed: %v", a.err)
		}
	}
	au, err := soleAudit(ctx, dep, "after the expiry job and the attempt")
	if err != nil {
		t.Fatalf("%v", err)
	}
	if a.n != 0 || au.Active != active || au.Available != total-active || au.Drift() != 0 {
		t.Errorf("an expiry job run beside an attempt held open on a SKU of %d units with nothing due (the job waited for it: %v), then the attempt committed: the job gave back %d units, audit %+v; want 0 given back, available %d, active %d",
			total, waited, a.n, au, total-active, active)
	}
}
