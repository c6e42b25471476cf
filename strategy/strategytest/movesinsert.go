package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// besideWithin bounds how long checkMovesBesideInsert waits for a call
// that neither answers nor is seen waiting in PostgreSQL (one that waits
// in a node's memory or in Redis for the request held): the request then
// goes, and the answers are judged as they come. It orders nothing the
// verdict relies on.
const besideWithin = 3 * time.Second

// checkMovesBesideInsert: an expiry job run on every node, and a Release
// of another reservation of the SKU, while a request is in the middle of
// its Reserve, past whatever it does before it writes its row (a unit
// taken in Redis or in a node's count) and before that row is written
// (writeHold), take nothing from it: when the request goes on, it holds
// its unit, the released unit sells once, and the SKU sells no more than
// its 2 units. A job or a release that also recounts the SKU from the
// committed reservations ("a lost unit is back within one tick", as a
// restart recounts) gives the unit of the request on its way back, and it
// sells twice (outsider round 20's recountjob).
// checkExpiryBesideAttempt needs an attempt held open; this needs nothing
// of the strategy but tables.
//
// A request that writes no row naming its key as it was sent, or none
// before it answers, is not held: the check is skipped.
func checkMovesBesideInsert(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const total = 2
	sku := kitSKU("moves-insert")
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: sku, Total: total}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	request := func(who string) strategy.Request {
		return strategy.Request{Key: "kit-moves-insert-" + who + "-" + sku, User: "kit-moves-insert-" + who, SKU: sku, TTL: time.Hour}
	}

	// The calls beside the request held: ExpireDue on each node, then a
	// Release, on node 1, of a reservation node 1 made before.
	type call struct {
		what string
		run  func() (int, error)
		most int // units it may give back
	}
	var calls []call
	for i := range 2 {
		if e, ok := dep.Node(i).(strategy.Expirer); ok {
			calls = append(calls, call{fmt.Sprintf("ExpireDue on node %d", i), func() (int, error) { return e.ExpireDue(ctx) }, 0})
		}
	}
	if r, ok := dep.Node(1).(strategy.Releaser); ok {
		other := request("released")
		if res, err := reserveUnlessBusy(ctx, dep.Node(1), other); err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Fatalf("Reserve %q on node 1, a fresh SKU of %d: %s, %v; want HELD", other.Key, total, res.Outcome, err)
		}
		calls = append(calls, call{"Release on node 1 of " + other.Key, func() (int, error) { return r.Release(ctx, other.Key) }, 1})
	}
	if len(calls) == 0 {
		t.Skip("no expiry job (strategy.Expirer) and no Release (strategy.Releaser)")
	}

	req := request("on-its-way")
	hold := holdWritesOrSkip(ctx, t, admin, req.Key)
	defer hold.removeOrReport(t)

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
	var ran []string
	for _, c := range calls {
		done := make(chan answered, 1)
		go func() {
			var a answered
			defer func() { done <- a }()
			defer box.catch()
			a.n, a.err = c.run()
		}()
		waitCtx, waitCancel := context.WithTimeout(ctx, besideWithin)
		_, err := awaitAnswerOrBlocked(waitCtx, admin, pid, done)
		waitCancel()
		if err != nil && ctx.Err() != nil {
			t.Fatalf("%s beside the request held: %v", c.what, err)
		}
		var a answered
		select {
		case a = <-done:
		default:
			// The call waits for the request held (in PostgreSQL, or for
			// as long as besideWithin allowed): the request goes, and the
			// calls after this one run with nothing held.
			hold.release()
			a = <-done
		}
		ran = append(ran, c.what)
		if a.err == nil && a.n > c.most {
			t.Errorf("%s beside a request on its way, nothing due: %d units given back; want at most %d", c.what, a.n, c.most)
		}
	}
	hold.release()
	a := <-first
	box.rethrow()
	heldFirst := a.err == nil && a.res.Outcome == strategy.OutcomeHeld
	if a.err == nil && !heldFirst && a.res.Outcome != strategy.OutcomeBusy {
		t.Errorf("Reserve %q, a unit free, its row held while %v ran: %s; want HELD (or BUSY, or an error)", req.Key, ran, a.res.Outcome)
	}

	// Three more buyers, on both nodes: the released unit sells once.
	sold := 0
	if heldFirst {
		sold++
	}
	for i := range 3 {
		res, err := reserveUnlessBusy(ctx, dep.Node(i%2), request(fmt.Sprintf("after-%d", i)))
		if err == nil && res.Outcome == strategy.OutcomeHeld {
			sold++
		}
	}
	au, err := soleAudit(ctx, dep, "after the request held beside the calls, and three more")
	if err != nil {
		t.Fatalf("%v", err)
	}
	if sold > total || au.Active > au.Total {
		t.Errorf("SKU of %d units, one reserved and released beside a request (%s, %v) held before writing its row while %v ran; then 3 more buyers: %d HELD of the request on its way and them (2 units), audit %+v (a call gave back the unit of the request on its way)",
			total, a.res.Outcome, a.err, ran, sold, au)
	}
}
