package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
)

// checkNoWaitBehindLockedRows: a strategy that claims NoWait answers a
// request with a new key and a new user, for a SKU with units, while
// another transaction holds every row of the database's tables the way an
// UPDATE in flight holds the rows it changes (FOR NO KEY UPDATE, which a
// foreign key's KEY SHARE does not conflict with). It may answer HELD,
// SOLD_OUT or BUSY; it may not wait for that transaction.
//
// The phantom scenario checks the claim between attempts held open, which
// needs SessionOpener; this check needs only Reserve, so a strategy without
// sessions cannot claim no-wait and stay unchecked. A strategy that
// decrements a stock row, or reads one FOR UPDATE, waits here as its
// requests wait for one another under load. The wait is read from the
// server (pg_blocking_pids naming the transaction that holds the rows), so
// a request that waited is told apart from a slow one without a timer.
func checkNoWaitBehindLockedRows(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "locked-rows", 3)
	defer dep.Close()
	node := dep.Node(0)
	// A reservation first, so that the strategy's reservation rows are
	// among the rows held, not only its stock rows.
	first := strategy.Request{Key: "kit-locked-rows-1-" + sku, User: "kit-locked-rows-1", SKU: sku, TTL: time.Hour}
	holdForCheck(ctx, t, node, first)

	tx, holder := holdAllRows(ctx, t, admin)
	defer tx.Rollback(context.Background()) //nolint:errcheck // rolled back below on every path that gets there

	req := strategy.Request{Key: "kit-locked-rows-2-" + sku, User: "kit-locked-rows-2", SKU: sku, TTL: time.Hour}
	var box panicBox
	defer box.rethrow()
	done := reserveAsync(ctx, &box, node, req)
	waited, probeErr := awaitAnswerOrBlocked(ctx, admin, holder, done)
	if err := tx.Rollback(context.Background()); err != nil {
		t.Errorf("release the rows: %v", err)
	}
	a := <-done
	if probeErr != nil {
		t.Fatalf("read the lock waits: %v", probeErr)
	}
	if waited {
		t.Errorf("Reserve %q (new key and user, 3 units, one HELD) waited for the transaction that held the rows (pg_blocking_pids), then answered %s, %v: a no-wait strategy must answer without waiting for another's uncommitted work",
			req.Key, a.res.Outcome, a.err)
		return
	}
	switch {
	case a.err != nil:
		t.Errorf("Reserve %q while the rows were held: %v; want HELD, SOLD_OUT or BUSY", req.Key, a.err)
	case a.res.Outcome != strategy.OutcomeHeld && a.res.Outcome != strategy.OutcomeSoldOut && a.res.Outcome != strategy.OutcomeBusy:
		t.Errorf("Reserve %q while the rows were held: %s; want HELD, SOLD_OUT or BUSY", req.Key, a.res.Outcome)
	}
}

// sqlBlockedBy counts the backends that wait for a lock $1 holds.
const sqlBlockedBy = `SELECT count(*) FROM pg_stat_activity WHERE pid <> $1 AND $1 = ANY(pg_blocking_pids(pid))`

// sqlBlockedByAny counts the backends that wait for a lock one of $1 holds.
const sqlBlockedByAny = `SELECT count(*) FROM pg_stat_activity WHERE pid <> ALL($1::int4[]) AND pg_blocking_pids(pid) && $1::int4[]`

// awaitAnswerOrBlockedByAny is awaitAnswerOrBlocked for a wait for any of
// holders.
func awaitAnswerOrBlockedByAny[A any](ctx context.Context, admin *pgxpool.Pool, holders []uint32, done chan A) (bool, error) {
	pids := make([]int32, len(holders))
	for i, h := range holders {
		pids[i] = int32(h)
	}
	blocked := false
	err := awaitAnswerOr(ctx, done, func() (bool, error) {
		if lockWaiting(done) {
			blocked = true
			return true, nil
		}
		var n int
		err := admin.QueryRow(ctx, sqlBlockedByAny, pids).Scan(&n)
		blocked = n > 0
		return blocked, err
	})
	return blocked, err
}

// awaitAnswerOrBlockedWithin is awaitAnswerOrBlockedByAny for at most
// within: a request that neither answers nor waits in PostgreSQL (or for a
// lock it reports, lockWaiting) by then waits elsewhere (a lock in the node's memory, behind the attempt the
// check holds open), is reported not blocked, and the check goes on to let
// the attempt end; a wait for the full deadline would deadlock with it.
func awaitAnswerOrBlockedWithin[A any](ctx context.Context, admin *pgxpool.Pool, holders []uint32, done chan A, within time.Duration) (bool, error) {
	bound, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	blocked, err := awaitAnswerOrBlockedByAny(bound, admin, holders, done)
	if err != nil && ctx.Err() == nil && bound.Err() != nil {
		return false, nil
	}
	return blocked, err
}

// awaitAnswerOrBlocked reports whether some backend waited for holder
// before done delivered an answer (done is left for the caller to read),
// or the call behind done waited for a lock outside PostgreSQL
// (lockWaiting): a LockTaker's request waits for the lock its SKU's
// other request holds while that one waits for holder.
func awaitAnswerOrBlocked[A any](ctx context.Context, admin *pgxpool.Pool, holder int32, done chan A) (bool, error) {
	return awaitAnswerOrBlockedByAny(ctx, admin, []uint32{uint32(holder)}, done)
}

// awaitAnswerOr polls seen every millisecond until it reports true or done
// delivers an answer (left in done for the caller to read).
func awaitAnswerOr[A any](ctx context.Context, done chan A, seen func() (bool, error)) error {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		if ok, err := seen(); err != nil || ok {
			return err
		}
		select {
		case a := <-done:
			done <- a
			return nil
		case <-ctx.Done():
			return fmt.Errorf("no answer and no wait: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// checkTransitionsWaitForLockedRows: Confirm and Release of a HELD
// reservation whose row another transaction holds (as an UPDATE in
// flight, or an expiry job held open, holds the rows it changes) wait for
// that transaction; when it rolls back, the reservation is still HELD and
// the call moves it. A transition that skips a locked row (FOR UPDATE SKIP
// LOCKED, NOWAIT) refuses a payment, or a release, of a hold that nobody
// moved: no scenario held a row while a transition of it ran, except
// expiry races where the other side commits.
func checkTransitionsWaitForLockedRows(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "locked-moves", 3)
	defer dep.Close()
	node := dep.Node(0)
	confirmer, canConfirm := node.(strategy.Confirmer)
	releaser, canRelease := node.(strategy.Releaser)
	if !canConfirm && !canRelease {
		t.Skip("neither Confirm nor Release")
	}
	held := func(name string) string {
		return holdForCheck(ctx, t, node, strategy.Request{Key: "kit-locked-moves-" + name + "-" + sku, User: "kit-locked-moves-" + name, SKU: sku, TTL: time.Hour})
	}
	type moved struct {
		ok  bool
		err error
	}
	// behindLockedRows runs call while another transaction holds every row
	// of the strategy's tables, rolls that transaction back once call waits
	// for it (or has answered), and returns call's answer.
	behindLockedRows := func(what string, call func() moved) (moved, bool) {
		tx, holder := holdAllRows(ctx, t, admin)
		defer tx.Rollback(context.Background()) //nolint:errcheck // rolled back below on every path that gets there
		done := make(chan moved, 1)
		go func() { done <- call() }()
		waited, probeErr := awaitAnswerOrBlocked(ctx, admin, holder, done)
		if longest := pgtest.LongestTimeoutSet(db); waited && probeErr == nil && longest > 0 {
			// Past any lock or statement timeout the strategy set: a call
			// that gives up at its timeout and answers as if the
			// reservation had moved already is seen doing it. The hold's
			// length is what is checked, not a synchronisation.
			timer := time.NewTimer(min(longest+time.Second, outlastAtMost))
			select {
			case a := <-done:
				done <- a
			case <-timer.C:
			}
			timer.Stop()
		}
		if err := tx.Rollback(context.Background()); err != nil {
			t.Errorf("release the rows: %v", err)
		}
		a := <-done
		if probeErr != nil {
			t.Fatalf("%s: read the lock waits: %v", what, probeErr)
		}
		return a, waited
	}
	if canConfirm {
		key := held("confirm")
		a, waited := behindLockedRows("Confirm", func() moved {
			ok, err := confirmer.Confirm(ctx, key, strategy.ConfirmBeforeExpiry)
			return moved{ok, err}
		})
		if a.err != nil || !a.ok {
			t.Errorf("Confirm of HELD %s while another transaction held its row, which then rolled back (waited for it: %v): %v, %v; want true, nil (nobody moved the reservation)", key, waited, a.ok, a.err)
		}
	}
	if canRelease {
		key := held("release")
		a, waited := behindLockedRows("Release", func() moved {
			units, err := releaser.Release(ctx, key)
			return moved{units == 1, err}
		})
		if a.err != nil || !a.ok {
			t.Errorf("Release of HELD %s while another transaction held its row, which then rolled back (waited for it: %v): moved %v, %v; want 1 unit, nil (nobody moved the reservation)", key, waited, a.ok, a.err)
		}
	}
}

// holdAllRows begins a transaction on admin that holds every row of the
// database's strategy tables as an UPDATE in flight holds the rows it
// changes (FOR NO KEY UPDATE), and returns it with its backend's pid; the
// caller rolls it back. It skips the check when there is no table.
func holdAllRows(ctx context.Context, t tester, admin *pgxpool.Pool) (pgx.Tx, int32) {
	t.Helper()
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatalf("begin the transaction that holds the rows: %v", err)
	}
	tables, err := gateTables(ctx, tx)
	if err != nil {
		_ = tx.Rollback(ctx)
		t.Fatalf("list the tables: %v", err)
	}
	if len(tables) == 0 {
		_ = tx.Rollback(ctx)
		t.Skip("the strategy keeps no tables in PostgreSQL: no row to hold")
	}
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '10s'"); err != nil {
		_ = tx.Rollback(ctx)
		t.Fatalf("lock_timeout: %v", err)
	}
	for _, tb := range tables {
		if _, err := tx.Exec(ctx, "SELECT FROM "+tb+" FOR NO KEY UPDATE"); err != nil {
			_ = tx.Rollback(ctx)
			t.Fatalf("hold the rows of %s: %v", tb, err)
		}
	}
	var holder int32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&holder); err != nil {
		_ = tx.Rollback(ctx)
		t.Fatalf("pid: %v", err)
	}
	return tx, holder
}
