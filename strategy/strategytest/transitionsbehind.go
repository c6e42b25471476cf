package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkTransitionsBehindAttempt: an expiry job, a Release or a Confirm
// that waits behind an attempt held open on the same SKU (for its stock
// row, or whatever the attempt holds), which then commits, moves its
// reservation once and reports exactly that: the one unit given back, or
// true. Under REPEATABLE READ or SERIALIZABLE the transition is refused
// (40001) once the attempt commits and must run again from the start: a
// job that moves rows in one statement and gives units back in another,
// and keeps its count across the retry, reports the first try's units
// too; a Release or Confirm that takes the refusal to mean "another
// transition moved this reservation first" answers 0 or false for a
// reservation still HELD, although the attempt only changed the stock.
// The races of the scenarios run transitions against each other on one
// key, never behind an attempt on another key that changes the stock row
// and commits. A transition refused with an error is sent again, as a
// client would.
func checkTransitionsBehindAttempt(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const total = 3
	kinds := []string{"ExpireDue", "Release", "Confirm"}
	var stock []strategy.Stock
	for _, k := range kinds {
		stock = append(stock, strategy.Stock{SKU: kitSKU("behind-" + k), Total: total})
	}
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: stock})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	node := dep.Node(0)
	opener, isOpener := node.(strategy.SessionOpener)
	if !isOpener {
		t.Skip("needs an attempt held open (strategy.SessionOpener)")
	}
	ager, isAger := dep.(strategy.Ager)
	expirer, isExpirer := node.(strategy.Expirer)
	releaser, isReleaser := node.(strategy.Releaser)
	confirmer, isConfirmer := node.(strategy.Confirmer)
	type transition struct {
		status  strategy.Status // what it moves the reservation to
		active  int             // the SKU's active reservations after it, the attempt's included
		prepare func(key string)
	}
	transitions := map[string]transition{}
	if isAger && isExpirer {
		transitions["ExpireDue"] = transition{strategy.StatusExpired, 1, func(key string) {
			if n, err := ager.MakeDue(ctx, []string{key}); err != nil || n != 1 {
				t.Fatalf("MakeDue: %d, %v; want 1", n, err)
			}
		}}
	}
	if isReleaser {
		transitions["Release"] = transition{strategy.StatusReleased, 1, nil}
	}
	if isConfirmer {
		transitions["Confirm"] = transition{strategy.StatusConfirmed, 2, nil}
	}
	if len(transitions) == 0 {
		t.Skip("no transition (ExpireDue with MakeDue, Release, Confirm)")
	}
	// run calls the transition once and says what it answered and whether
	// that is the one reservation moved.
	run := func(kind, key string) (string, bool, error) {
		switch kind {
		case "ExpireDue":
			n, err := expirer.ExpireDue(ctx)
			return fmt.Sprintf("%d units", n), n == 1, err
		case "Release":
			n, err := releaser.Release(ctx, key)
			return fmt.Sprintf("%d units", n), n == 1, err
		default:
			moved, err := confirmer.Confirm(ctx, key, strategy.ConfirmBeforeExpiry)
			return fmt.Sprint(moved), moved, err
		}
	}
	for i, kind := range kinds {
		tr, ok := transitions[kind]
		if !ok {
			continue
		}
		sku := stock[i].SKU
		req := strategy.Request{Key: "kit-behind-" + kind + "-" + sku, User: "kit-behind-" + kind, SKU: sku, TTL: time.Hour}
		holdForCheck(ctx, t, node, req)
		if tr.prepare != nil {
			tr.prepare(req.Key)
		}
		session, holder := holdInSession(ctx, t, opener, strategy.Request{Key: "kit-behind-attempt-" + sku, User: "kit-behind-attempt", SKU: sku, TTL: time.Hour},
			"an attempt held open on the SKU")
		type answered struct {
			what  string
			right bool
			err   error
		}
		done := make(chan answered, 1)
		var box panicBox
		go func() {
			var a answered
			defer func() { done <- a }()
			defer box.catch()
			a.what, a.right, a.err = run(kind, req.Key)
		}()
		waited, err := awaitAnswerOrBlocked(ctx, admin, int32(holder[0]), done)
		if err != nil {
			_ = session.Rollback(ctx)
			t.Fatalf("%s beside the attempt: %v", kind, err)
		}
		// At SERIALIZABLE the attempt may be refused at Commit; the
		// transition must move its reservation all the same.
		active := tr.active
		if err := session.Commit(ctx); err != nil {
			if !abortedByConflict(err) {
				t.Fatalf("Commit of the attempt: %v", err)
			}
			active--
		}
		a := <-done
		box.rethrow()
		if a.err != nil {
			// Refused, it has moved nothing; the client sends it again.
			if a.what, a.right, a.err = run(kind, req.Key); a.err != nil {
				t.Fatalf("%s after the attempt committed: %v", kind, a.err)
			}
		}
		r, err := node.Lookup(ctx, req.Key)
		if err != nil {
			t.Fatalf("Lookup: %v", err)
		}
		list, err := dep.Audit(ctx)
		if err != nil {
			t.Fatalf("Audit: %v", err)
		}
		for _, au := range list {
			if au.SKU != sku {
				continue
			}
			if !a.right || r.Status != tr.status || au.Active != active || au.Available != total-active || au.Drift() != 0 {
				t.Errorf("%s of one HELD reservation, behind an attempt held open on its SKU that then committed (the call waited for it: %v): answered %s, the reservation is %s, audit %+v; want it moved (%s), available %d, active %d",
					kind, waited, a.what, r.Status, au, tr.status, total-active, active)
			}
		}
	}
}
