package strategytest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// jobBesideWithin bounds how long checkExpiryBesideInsert waits for a job
// that neither answers nor is seen waiting in PostgreSQL (one that waits
// in a node's memory or in Redis for the request held): the request then
// goes, and the answers are judged as they come. It orders nothing the
// verdict relies on.
const jobBesideWithin = 3 * time.Second

// checkExpiryBesideInsert: an expiry job run on every node while a request
// is in the middle of its Reserve, past whatever it does before it writes
// its row (a unit taken in Redis or in a node's count) and before that row
// is written (writeHold), takes nothing back from it: when the request
// goes on, it holds the SKU's one unit, and a request after it is
// answered SOLD_OUT. A job that also recounts each SKU from the committed
// reservations ("a lost unit is back within one tick", as a restart
// recounts) gives the unit back while its row is on its way, and it sells
// twice (outsider round 20's recountjob). checkExpiryBesideAttempt needs
// an attempt held open; this needs nothing of the strategy but tables.
//
// A request that writes no row naming its key as it was sent, or none
// before it answers, is not held: the check is skipped.
func checkExpiryBesideInsert(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("expiry-insert")
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: sku, Total: 1}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	var expirers []strategy.Expirer
	for i := range 2 {
		if e, ok := dep.Node(i).(strategy.Expirer); ok {
			expirers = append(expirers, e)
		}
	}
	if len(expirers) == 0 {
		t.Skip("no expiry job (strategy.Expirer)")
	}
	req := strategy.Request{Key: "kit-expiry-insert-" + sku, User: "kit-expiry-insert", SKU: sku, TTL: time.Hour}
	hold, err := holdWritesNaming(ctx, admin, req.Key)
	if errors.Is(err, errNoTables) {
		t.Skip("the strategy keeps no tables in PostgreSQL: no write to hold")
	} else if err != nil {
		t.Fatalf("%v", err)
	}
	defer func() {
		if err := hold.remove(); err != nil {
			t.Errorf("%v", err)
		}
	}()

	var box panicBox
	defer box.rethrow()
	first := reserveAsync(ctx, &box, dep.Node(0), req)
	pid, err := awaitWaiter(ctx, hold, first, resendSeenWithin)
	if err != nil {
		t.Fatalf("Reserve %q with its row held: %v", req.Key, err)
	}
	if pid == 0 {
		hold.release()
		<-first
		t.Skip("a request writes no row naming its key, as it was sent, before it answers: nothing to hold it by")
	}

	type answered struct {
		n   int
		err error
	}
	ran := 0
	for _, e := range expirers {
		done := make(chan answered, 1)
		go func() {
			var a answered
			defer func() { done <- a }()
			defer box.catch()
			a.n, a.err = e.ExpireDue(ctx)
		}()
		waitCtx, waitCancel := context.WithTimeout(ctx, jobBesideWithin)
		_, err := awaitAnswerOrBlocked(waitCtx, admin, pid, done)
		waitCancel()
		if err != nil && ctx.Err() != nil {
			t.Fatalf("ExpireDue beside the request held: %v", err)
		}
		select {
		case a := <-done:
			if a.err == nil && a.n != 0 {
				t.Errorf("ExpireDue beside a request held before its row was written, nothing due: moved %d; want 0", a.n)
			}
			ran++
			continue
		default:
		}
		// The job waits for the request held (in PostgreSQL, or for as
		// long as jobBesideWithin allowed): it goes, and the job after it.
		hold.release()
		<-done
		ran++
		break
	}
	hold.release()
	a := <-first
	box.rethrow()
	heldFirst := a.err == nil && a.res.Outcome == strategy.OutcomeHeld
	if a.err == nil && !heldFirst && a.res.Outcome != strategy.OutcomeBusy {
		t.Errorf("Reserve %q, the SKU's one unit free, its row held while ExpireDue ran on %d nodes: %s; want HELD (or BUSY, or an error)", req.Key, ran, a.res.Outcome)
	}

	// Two more buyers, one a node.
	sold := 0
	if heldFirst {
		sold++
	}
	for i := range 2 {
		user := fmt.Sprintf("kit-expiry-insert-after-%d", i)
		other := strategy.Request{Key: user + "-" + sku, User: user, SKU: sku, TTL: time.Hour}
		res, err := reserveUnlessBusy(ctx, dep.Node(i), other)
		if err == nil && res.Outcome == strategy.OutcomeHeld {
			sold++
		}
	}
	au, err := soleAudit(ctx, dep, "after the request held beside the expiry job, and two more")
	if err != nil {
		t.Fatalf("%v", err)
	}
	if sold > 1 || au.Active > au.Total {
		t.Errorf("SKU of 1 unit: a request (%s, %v) was held before writing its row while ExpireDue ran on %d nodes, then went on; then 2 more buyers: %d HELD in all, audit %+v (the job gave back the unit of the request on its way)",
			a.res.Outcome, a.err, ran, sold, au)
	}
}
