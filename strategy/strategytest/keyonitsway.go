package strategytest

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// sqlOtherLockWaiters counts the backends of the admin pool's database
// that wait for a lock, other than $1.
const sqlOtherLockWaiters = `
SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE NOT l.granted AND a.datname = current_database() AND l.pid <> $1`

// checkKeyOnItsWay: a second user's request for a key whose first
// request's row is on its way (the naming trigger holds that write) is
// answered from the row, never from anything else a strategy keeps: it
// waits, or answers BUSY or an error, or, once the row is there, KEY_REUSED
// with the owner as stored, its expires_at included; the user whose row
// went in is HELD. A strategy that answers KEY_REUSED at once from a
// marker of its own (a Redis hash of key to user) makes up a reservation
// out of what the marker holds, and refuses the key on the word of a row
// that may never commit (outsider round 23's keyother: HELD, with no
// expires_at). The kit's races of one key by two users let the first row
// commit before the second asked, or compared only user and SKU.
//
// Two cases: the second request for the key on the first's SKU, then on
// another SKU; after each, a user refused the key asks for its SKU under a
// new key (keyOnItsWay).
//
// The second request is sent once the first is seen waiting for the hold,
// and the hold is let go once the second has answered, or waits for a
// lock in PostgreSQL or one it reports (strategy.LockWait), or after
// besideWithin (a request queued in the strategy's memory shows nowhere).
func checkKeyOnItsWay(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	skuA, skuB := kitSKU("key-on-its-way-a"), kitSKU("key-on-its-way-b")
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: skuA, Total: 4}, {SKU: skuB, Total: 4}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	for _, second := range []string{skuA, skuB} {
		if !keyOnItsWay(ctx, t, dep, admin, skuA, second) {
			return
		}
	}
}

// keyOnItsWay runs one case of checkKeyOnItsWay: the first user's request
// for a new key on skuA, held, and the second user's for the same key on
// second. Then each user whose request was refused the key sends a new key
// for its SKU, which it holds nothing of: HELD. A strategy that, giving
// back the unit the refused request took, clears the marks of the key's
// owner instead of its own leaves the refused user marked as holding the
// SKU, and answers it USER_LIMIT from then on (outsider round 24's
// givebackowner; only a key reused by another user for another SKU shows
// it). It reports false when the strategy writes no row to hold (the
// check is skipped).
func keyOnItsWay(ctx context.Context, t tester, dep strategy.Deployment, admin *pgxpool.Pool, skuA, second string) bool {
	t.Helper()
	key := "kit-key-on-its-way-" + second
	reqs := []strategy.Request{
		{Key: key, User: "kit-key-on-its-way-first-" + second, SKU: skuA, TTL: time.Hour},
		{Key: key, User: "kit-key-on-its-way-second-" + second, SKU: second, TTL: time.Hour},
	}
	hold := holdWritesOrSkip(ctx, t, admin, key)
	defer hold.removeOrReport(t)

	var box panicBox
	defer box.rethrow()
	first := reserveAsync(ctx, &box, dep.Node(0), reqs[0])
	pid, err := awaitWaiter(ctx, hold, first, resendSeenWithin)
	if err != nil {
		t.Fatalf("Reserve %q with its row held: %v", key, err)
	}
	if pid == 0 {
		hold.release()
		<-first
		t.Skip("a request writes no row naming its key, as it was sent, before it answers: nothing to hold it by")
		return false
	}
	secondDone := reserveAsync(ctx, &box, dep.Node(1), reqs[1])
	seenCtx, seenCancel := context.WithTimeout(ctx, besideWithin)
	err = awaitAnswerOr(seenCtx, secondDone, func() (bool, error) {
		if lockWaiting(secondDone) {
			return true, nil
		}
		var n int
		err := admin.QueryRow(seenCtx, sqlOtherLockWaiters, pid).Scan(&n)
		return n > 0, err
	})
	seenCancel()
	if err != nil && ctx.Err() != nil {
		t.Fatalf("the second user's request for %q: %v", key, err)
	}
	hold.release()
	answers := []answer{<-first, <-secondDone}

	owner, err := dep.Node(0).Lookup(ctx, key)
	if err != nil {
		t.Fatalf("Lookup %q: %v", key, err)
	}
	where := "the same SKU"
	if second != skuA {
		where = "another SKU"
	}
	for i, a := range answers {
		what := fmt.Sprintf("the %s user's request for %q (the first's row held while the second was sent, for %s)", []string{"first", "second"}[i], key, where)
		res, err := a.res, a.err
		owns := owner.User == reqs[i].User && owner.SKU == reqs[i].SKU
		switch {
		case err != nil, res.Outcome == strategy.OutcomeBusy:
			// Unknown, or nothing written: either is true of a request that
			// could not be decided.
			continue
		case owner.Status == strategy.StatusNotFound:
			t.Errorf("%s: %s, but no reservation has the key", what, res.Outcome)
			continue
		case owns:
			if res.Outcome != strategy.OutcomeHeld && res.Outcome != strategy.OutcomeReplay {
				t.Errorf("%s: %s, but its reservation holds the key", what, res.Outcome)
			}
			continue
		case res.Outcome != strategy.OutcomeKeyReused:
			t.Errorf("%s: %s, but the key is user %s's, for %s", what, res.Outcome, owner.User, owner.SKU)
			continue
		case res.Reservation.User != owner.User || res.Reservation.SKU != owner.SKU || res.Reservation.Status == "" || res.Reservation.Status == strategy.StatusNotFound ||
			res.Reservation.ExpiresAt.Sub(owner.ExpiresAt).Abs() > time.Millisecond:
			t.Errorf("%s: KEY_REUSED with %+v; the owner as stored is %+v", what, res.Reservation, owner)
		}
		again := strategy.Request{Key: key + "-again-" + strconv.Itoa(i), User: reqs[i].User, SKU: reqs[i].SKU, TTL: time.Hour}
		if res, err := reserveUntilAnswered(ctx, dep.Node(i), again); err == nil && res.Outcome != strategy.OutcomeHeld && res.Outcome != strategy.OutcomeBusy {
			t.Errorf("a new key of the user refused %q (KEY_REUSED), for %s, which the user holds nothing of: %s; want HELD", key, reqs[i].SKU, res.Outcome)
		}
	}
	return true
}
