package strategytest

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// writesFailFor bounds one Reserve of checkWritesKeepFailing: a strategy
// that retries a serialization failure without end answers with its
// context's error then, which is an answer (unknown).
const writesFailFor = 10 * time.Second

// checkWritesKeepFailing: a request whose every write fails with a
// serialization failure (SQLSTATE 40001, on the rows that name its key:
// a namingTrigger) was never tried to the end, whatever the strategy's
// retries do: it is answered BUSY or an error (unknown), never SOLD_OUT
// or another answer that says the stock or the key decided it, on a SKU
// with 3 units. Once the writes go through, the same request is HELD,
// and the SKU then has 2 units free and 1 reservation: the failed
// attempts took nothing. A Reserve whose retries run out and which
// answers SOLD_OUT ("others are taking the last units"), or a node that
// combines requests and answers SOLD_OUT to one that was requeued too
// often (outsider round 20's retrysold and gaveupsold), reach that answer
// in no scenario: their retries are spent only under contention no
// scenario keeps up for long.
func checkWritesKeepFailing(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const total = 3
	sku := kitSKU("writes-fail")
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: total}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	node := dep.Node(0)
	req := strategy.Request{Key: "kit-writes-fail-" + sku, User: "kit-writes-fail", SKU: sku, TTL: time.Hour}
	fault, err := failWritesNaming(ctx, admin, req.Key, pgerrcode.SerializationFailure, false)
	if errors.Is(err, errNoTables) {
		t.Skip("the strategy keeps no tables in PostgreSQL: no write to fail")
	} else if err != nil {
		t.Fatalf("%v", err)
	}
	removed := false
	defer func() {
		if !removed {
			_ = fault.remove()
		}
	}()
	var box panicBox
	reqCtx, reqCancel := context.WithTimeout(ctx, writesFailFor)
	a := <-reserveAsync(reqCtx, &box, node, req)
	reqCancel()
	box.rethrow()
	if a.err == nil && (a.res.Outcome == strategy.OutcomeHeld || a.res.Outcome == strategy.OutcomeReplay) {
		t.Skip("a request writes no row naming its key, as it was sent: nothing to fail it by")
	}
	if a.err == nil && a.res.Outcome != strategy.OutcomeBusy {
		t.Errorf("Reserve %q on a SKU of %d units, every write naming the key failing with a serialization failure (40001): %s; want BUSY or an error (nothing was tried to the end)",
			req.Key, total, a.res.Outcome)
	}
	removed = true
	if err := fault.remove(); err != nil {
		t.Fatalf("%v", err)
	}
	res, err := reserveUnlessBusy(ctx, node, req)
	if err != nil || (res.Outcome != strategy.OutcomeHeld && res.Outcome != strategy.OutcomeReplay) {
		t.Errorf("Reserve %q again once its writes go through (the first answered %s, %v): %s, %v; want HELD", req.Key, a.res.Outcome, a.err, res.Outcome, err)
	}
	au, err := soleAudit(ctx, dep, "after the request whose writes failed, sent again")
	if err != nil {
		t.Fatalf("%v", err)
	}
	if au.Active != 1 || au.Available != total-1 {
		t.Errorf("SKU of %d units: a request whose writes failed with 40001 (%s, %v), then sent again when they went through (%s): audit %+v; want 1 active, %d available (the failed attempts took nothing)",
			total, a.res.Outcome, a.err, res.Outcome, au, total-1)
	}
	if res.Outcome == strategy.OutcomeHeld {
		movesKeepFailing(ctx, t, dep.Node(0), admin, req.Key, total)
	}
}

// movesKeepFailing: a Confirm and a Release of the HELD key whose every
// write fails with 40001 did not move it: they return an error (unknown),
// never false or 0, which say another call moved it first. Once the writes
// go through, the Release gives its unit back.
func movesKeepFailing(ctx context.Context, t tester, node strategy.Strategy, admin *pgxpool.Pool, key string, total int) {
	t.Helper()
	confirmer, canConfirm := node.(strategy.Confirmer)
	releaser, canRelease := node.(strategy.Releaser)
	if !canConfirm && !canRelease {
		return
	}
	fault, err := failWritesNaming(ctx, admin, key, pgerrcode.SerializationFailure, true)
	if err != nil {
		t.Fatalf("%v", err)
	}
	removed := false
	defer func() {
		if !removed {
			_ = fault.remove()
		}
	}()
	callCtx, callCancel := context.WithTimeout(ctx, writesFailFor)
	defer callCancel()
	// A strategy whose transitions write no row naming the key (the key
	// kept in a table of its own, the reservation row keyed by an id:
	// outsider round 31's ledger) moves its row through the fault: an
	// answer that Lookup then bears out is honest, and the check has
	// nothing to judge (its first version wanted an error, a false
	// failure).
	movedThrough := func(want strategy.Status) bool {
		r, err := node.Lookup(ctx, key)
		return err == nil && r.Status == want
	}
	if canConfirm {
		if ok, err := confirmer.Confirm(callCtx, key, strategy.ConfirmBeforeExpiry); err == nil && !(ok && movedThrough(strategy.StatusConfirmed)) {
			t.Errorf("Confirm of HELD %s, every write of its row failing with a serialization failure (40001): %v, nil; want an error (it moved nothing, and false says another call moved it)", key, ok)
		} else if err == nil {
			return // confirmed: nothing left to release
		}
	}
	if canRelease {
		if units, err := releaser.Release(callCtx, key); err == nil && !(units == 1 && movedThrough(strategy.StatusReleased)) {
			t.Errorf("Release of HELD %s, every write of its row failing with a serialization failure (40001): %d, nil; want an error (it moved nothing, and 0 says another call moved it)", key, units)
		} else if err == nil {
			return // released through the fault: the release after it would rightly be 0
		}
	}
	removed = true
	if err := fault.remove(); err != nil {
		t.Fatalf("%v", err)
	}
	if !canRelease {
		return
	}
	if units, err := releaser.Release(ctx, key); err != nil || units != 1 {
		t.Errorf("Release of HELD %s once its writes go through (the calls before it failed): %d, %v; want 1", key, units, err)
	}
}
