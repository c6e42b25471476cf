package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkTwinBehindTableLock: the twin of a request for a SKU's last unit,
// made to wait in PostgreSQL between two of its reads while the request
// commits, answers REPLAY; and so does the twin of a request that left a
// unit over, which goes on past the stock. A strategy that reads the key and then the
// stock in two statements outside a lock (redislock's unlocked pre-check:
// "no key, and no stock: SOLD_OUT, without taking the lock") sees the key
// before the commit and the empty stock after it, and answers SOLD_OUT to
// a request whose unit its own key holds (outsider round 29's rl1: its
// window is two pool statements wide, and no scenario landed in it). For
// each of the database's tables in turn, an attempt holds the last unit
// of a SKU of its own before its commit (a session, or a plain request
// held at its COMMIT); an admin transaction asks for the table in ACCESS
// EXCLUSIVE mode (queued behind the attempt if it wrote there, granted at
// once if not), so that the twin passes every read before its first of
// that table and waits there; once the twin is seen waiting
// (pg_blocking_pids: behind the admin, or behind the attempt itself), the
// attempt commits and the admin lets go. A twin that answers without
// waiting answered before the commit and is not judged. With a unit left,
// the twin reads past the stock: a strategy that then looks for the user's
// other reservation without the key, before taking its lock, finds its own
// twin's and answers USER_LIMIT (outsider round 45's m08, caught in 2 of 3
// runs of duplicate-key before).
func checkTwinBehindTableLock(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const skus = 12 // more than any strategy has tables
	// Each table twice: on a SKU of one unit (the request commits the
	// last) and on a SKU of two (a unit is left, so the twin goes on past
	// the stock to whatever it reads next, a user's other reservation).
	var stock []strategy.Stock
	for _, total := range []int{1, 2} {
		for i := range skus {
			stock = append(stock, strategy.Stock{SKU: kitSKU(fmt.Sprintf("twin-table-%d-of-%d", i, total)), Total: total})
		}
	}
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: stock})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	list, err := admin.Begin(ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	tables, err := gateTables(ctx, list)
	_ = list.Rollback(ctx)
	if err != nil {
		t.Fatalf("%v", err)
	}
	opener, _ := dep.Node(0).(strategy.SessionOpener)
	held := map[string]int{}
	judged := 0
	tables = tables[:min(len(tables), skus)]
	for i := range 2 * len(tables) {
		table, st := tables[i%len(tables)], stock[i/len(tables)*skus+i%len(tables)]
		sku := st.SKU
		what := "the SKU's last unit"
		if st.Total > 1 {
			what = "a unit of the SKU, one left"
		}
		req := strategy.Request{Key: "key-" + sku, User: "user-" + sku, SKU: sku, TTL: time.Hour}
		attempt, pids := holdAttempt(ctx, t, opener, dep.Node(0), admin, req, "the last unit held before its commit")
		twin, blocked, err := twinBehindTableLock(ctx, dep.Node(0), admin, attempt, pids, table, req)
		if err != nil {
			_ = attempt.Rollback(ctx)
			t.Fatalf("the twin of %q, %s held: %v", req.Key, table, err)
		}
		if err := attempt.Rollback(ctx); err != nil { // drops a hold at COMMIT; a committed session ignores it
			t.Errorf("after the commit, %s: %v", table, err)
		}
		if got, err := dep.Node(0).Lookup(ctx, req.Key); err == nil && got.Status == strategy.StatusHeld {
			held[sku]++
		}
		if !blocked {
			continue // answered before the commit: the check cannot say when it read what
		}
		judged++
		switch {
		case twin.err != nil:
			t.Errorf("the twin of %q, seen waiting while %s was held and the request committed: %v; want REPLAY", req.Key, table, twin.err)
		case twin.res.Outcome == strategy.OutcomeBusy:
			// a definite "try again", with nothing written: true
		case twin.res.Outcome != strategy.OutcomeReplay || twin.res.Reservation.Key != req.Key:
			t.Errorf("the twin of %q (the same key, user and SKU), seen waiting while %s was held and the request committed %s: %s (reservation %q); want REPLAY (a known key first, then the stock and the user's other reservations)",
				req.Key, table, what, twin.res.Outcome, twin.res.Reservation.Key)
		}
	}
	if judged == 0 {
		t.Skip("no twin waited in PostgreSQL while its request committed")
	}
	audit, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	for _, st := range audit {
		if st.Drift() != 0 || st.Active != held[st.SKU] {
			t.Errorf("audit of %s after its twin: total %d, available %d, active %d; want %d active and drift 0",
				st.SKU, st.Total, st.Available, st.Active, held[st.SKU])
		}
	}
}

// twinBehindTableLock sends the twin of req behind an admin's request for
// table in ACCESS EXCLUSIVE mode, commits the attempt once the twin waits
// (or has answered), lets the table go and returns the twin's answer and
// whether it was seen waiting before the commit.
func twinBehindTableLock(ctx context.Context, node strategy.Strategy, admin *pgxpool.Pool, attempt heldAttempt, pids []uint32, table string, req strategy.Request) (answer, bool, error) {
	lock, err := requestTableLock(ctx, admin, table)
	if err != nil {
		return answer{}, false, err
	}
	defer lock.close(ctx)
	var box panicBox
	done := reserveAsync(ctx, &box, node, req)
	blocked, err := awaitAnswerOrBlockedWithin(ctx, admin, append(pids, uint32(lock.pid)), done, besideWithin)
	if err != nil {
		return answer{}, false, err
	}
	if err := attempt.Commit(ctx); abortedByConflict(err) {
		blocked = false // at SERIALIZABLE the request may lose to its twin: nothing to judge
	} else if err != nil {
		return answer{}, blocked, fmt.Errorf("commit of the request: %w", err)
	}
	if err := lock.letGo(ctx); err != nil {
		return answer{}, blocked, err
	}
	a := <-done
	box.rethrow()
	return a, blocked, nil
}
