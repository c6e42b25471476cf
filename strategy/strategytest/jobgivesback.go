package strategytest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkRequestBehindGiveBack: a request for a SKU of 2 units, one held and
// due, sent while an expiry job held open has moved that reservation and
// given its unit back (uncommitted), is HELD once the job commits: a unit
// was free for it the whole time, and one more came back. An optimistic
// strategy that reads the last free unit, finds its compare-and-set beaten
// by the job's write (the version moved), and answers SOLD_OUT ("someone
// took the last one") told a buyer the SKU was sold out with two units
// free (outsider round 57's m16; the kit met that line only through a
// twin, never through a give-back). The request is sent once the job has
// run, and the job commits once the request waits behind it
// (pg_blocking_pids, or a lock outside PostgreSQL), has answered, or
// besideWithin has passed.
func checkRequestBehindGiveBack(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	if !meta.Claims.Has(strategy.NoPhantomSoldOut) {
		t.Skip("no-phantom-sold-out is not claimed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "behind-give-back", 2)
	defer dep.Close()
	node := dep.Node(0)
	ager, ages := dep.(strategy.Ager)
	opener, opens := node.(strategy.ExpirySessionOpener)
	if !ages || !opens {
		t.Skip("needs MakeDue (strategy.Ager) and an expiry job held open (strategy.ExpirySessionOpener)")
	}
	held := holdForCheck(ctx, t, node, strategy.Request{Key: "kit-bgb-held-" + sku, User: "kit-bgb-held", SKU: sku, TTL: time.Hour})
	if n, err := ager.MakeDue(ctx, []string{held}); err != nil || n != 1 {
		t.Fatalf("MakeDue: %d, %v; want 1", n, err)
	}
	job, err := opener.OpenExpirySession(ctx)
	if err != nil {
		t.Fatalf("OpenExpirySession: %v", err)
	}
	defer func() { _ = job.Rollback(ctx) }()
	if units, err := job.ExpireDue(ctx); err != nil || units != 1 {
		t.Fatalf("ExpireDue held open, with one reservation due: %d units, %v; want 1", units, err)
	}
	req := strategy.Request{Key: "kit-bgb-" + sku, User: "kit-bgb", SKU: sku, TTL: time.Hour}
	var box panicBox
	done := reserveAsync(ctx, &box, node, req)
	if _, err := awaitAnswerOrBlockedWithin(ctx, admin, job.Backends(), done, besideWithin); err != nil {
		t.Fatalf("the request behind the expiry job held open: %v", err)
	}
	if err := job.Commit(ctx); err != nil {
		t.Fatalf("Commit of the expiry job: %v", err)
	}
	a := <-done
	box.rethrow()
	switch {
	case a.err != nil, a.res.Outcome == strategy.OutcomeBusy:
		// unknown, or nothing written: says nothing of the stock
	case a.res.Outcome == strategy.OutcomeHeld && a.res.Reservation.Key == req.Key:
	default:
		t.Errorf("a request for a SKU of 2 units, one free and the other being given back by an expiry job held open, which then committed: %s (reservation %q); want HELD (a unit was free the whole time)",
			a.res.Outcome, a.res.Reservation.Key)
	}
}
