package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// lateConflictOwners is how many keys of the crowd are owned by attempts
// in flight on other SKUs: so many rows a statement that asks about
// conflicts after the fact gets back at once.
const lateConflictOwners = 5

// lateConflictRounds is how many crowds checkLateConflictsInAnyPlanOrder
// sends at most (it stops at the first wrong answer).
const lateConflictRounds = 2

// checkLateConflictsInAnyPlanOrder is checkAnswersInAnyPlanOrder for the
// requests whose conflict the server shows only after the fact: keys taken
// by attempts that were in flight when the requests' statement began and
// commit while it waits for them. A strategy that serves several requests
// in one statement learns why those were refused from a second statement
// (combine's sqlWhyNot); in checkAnswersInAnyPlanOrder every conflict is
// committed before the crowd, so the first statement settles them all and
// the second never returns more than one row. A second statement whose
// rows are matched to its requests by position, not by a column it sent,
// gives each KEY_REUSED the reservation that owns another request's key
// (outsider round 34's m2cbwhynotpos; with the planner's own choices it
// showed in 2 of 3 fresh databases).
//
// One round, on the connections that join by sorting: an attempt held open
// on SKU S (its stock row, where there is one, locked until it commits);
// five attempts held open on five other SKUs, each with a key owned by a
// user of its own; request B for S, which waits behind the first attempt
// where a batch waits (seen in pg_blocking_pids, or answered); then,
// one after another (each in its call before the next is sent, so a queue
// in memory holds them in this order), the five keys sent for S by other
// users, in descending order of key, with the first attempt's user under a
// new key and two new users between them. The first attempt commits: B's
// batch ends, and the next one, with the whole crowd, begins while the
// five attempts are still open, and waits for them (seen in
// pg_blocking_pids). They commit: each of the five keys must be answered
// KEY_REUSED with the reservation of its own owner, the user USER_LIMIT,
// the new users HELD. A strategy where nothing waits gives the same
// answers; a strategy without attempts held open skips the check.
func checkLateConflictsInAnyPlanOrder(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	wrong := sortedRounds(ctx, t, db, lateConflictRounds, func(sorted *pgxpool.Pool, round int) []string {
		return lateConflictCrowd(ctx, t, meta, sorted, admin, rs, round)
	})
	if len(wrong) > 0 {
		t.Errorf("%d answers of a crowd whose keys were taken by attempts that committed while it waited (joins by sorting) are not their own request's: %s", len(wrong), sample(wrong))
	}
}

// lateConflictCrowd runs one round and returns the wrong answers.
func lateConflictCrowd(ctx context.Context, t tester, meta strategy.Meta, sorted, admin *pgxpool.Pool, rs map[strategy.Resource]string, round int) []string {
	t.Helper()
	prefix := fmt.Sprintf("late-conflict-%d", round)
	sku := kitSKU(prefix)
	stock := []strategy.Stock{{SKU: sku, Total: 40}}
	others := make([]string, lateConflictOwners)
	for i := range others {
		others[i] = kitSKU(fmt.Sprintf("%s-owner-%d", prefix, i))
		stock = append(stock, strategy.Stock{SKU: others[i], Total: 2})
	}
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: sorted, Stock: stock})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	node := dep.Node(0)
	opener, ok := node.(strategy.SessionOpener)
	if !ok {
		t.Skip("no attempt held open (strategy.SessionOpener)")
	}
	var box panicBox
	defer box.rethrow()

	limitedUser := strategy.Request{Key: "kit-lc-first-" + sku, User: "kit-lc-first", SKU: sku, TTL: time.Hour}
	holdForCheck(ctx, t, node, limitedUser)

	// The owners' keys sort in the reverse of the order they are sent in.
	// The first owner's key is B's; the others, the crowd's.
	type owned struct {
		req   strategy.Request // the request for the key, for the crowd's SKU
		owner strategy.Request // the attempt that owns it
		pids  []uint32
		s     strategy.Session
	}
	var keys []*owned
	defer func() {
		for _, k := range keys {
			_ = k.s.Rollback(context.Background())
		}
	}()
	for i, other := range others {
		key := fmt.Sprintf("%c-kit-lc-%s", 'z'-i, sku)
		owner := strategy.Request{Key: key, User: fmt.Sprintf("kit-lc-owner-%d", i), SKU: other, TTL: time.Hour}
		s, pids := holdInSession(ctx, t, opener, owner, "an attempt held open on SKU "+other)
		keys = append(keys, &owned{req: strategy.Request{Key: key, User: fmt.Sprintf("kit-lc-asker-%d", i), SKU: sku, TTL: time.Hour}, owner: owner, pids: pids, s: s})
	}

	type ask struct {
		req   strategy.Request
		want  strategy.Outcome
		owner *strategy.Request
		done  chan answer
	}
	b := &ask{req: keys[0].req, want: strategy.OutcomeKeyReused, owner: &keys[0].owner}
	b.done = reserveAsync(ctx, &box, node, b.req)
	bWaits, err := awaitAnswerOrBlocked(ctx, admin, int32(keys[0].pids[0]), b.done)
	if err != nil {
		t.Fatalf("request B behind the attempt that owns its key: %v", err)
	}

	var crowd []*ask
	send := func(a *ask) {
		a.done = reserveAsync(ctx, &box, node, a.req)
		crowd = append(crowd, a)
		if !bWaits {
			return
		}
		var sent []chan answer
		for _, c := range crowd {
			sent = append(sent, c.done)
		}
		if err := awaitQueued(ctx, node, sku, len(crowd), sent...); err != nil {
			t.Fatalf("the crowd behind request B's batch: %v", err)
		}
	}
	for i, k := range keys[1:] {
		send(&ask{req: k.req, want: strategy.OutcomeKeyReused, owner: &k.owner})
		switch i {
		case 1:
			send(&ask{req: strategy.Request{Key: "kit-lc-limited-" + sku, User: limitedUser.User, SKU: sku, TTL: time.Hour}, want: strategy.OutcomeUserLimit})
		case 2, 3:
			send(&ask{req: strategy.Request{Key: fmt.Sprintf("kit-lc-new-%d-%s", i, sku), User: fmt.Sprintf("kit-lc-new-%d", i), SKU: sku, TTL: time.Hour}, want: strategy.OutcomeHeld})
		}
	}
	commit := func(k *owned, a *ask) {
		if err := k.s.Commit(ctx); err != nil {
			// At SERIALIZABLE a commit may fail (40001) beside the
			// requests it conflicts with: the key is then not taken, and
			// its request holds it.
			a.want, a.owner = strategy.OutcomeHeld, nil
		}
	}
	commit(keys[0], b)
	allDone := make(chan struct{}, 1)
	go func() {
		for _, a := range crowd {
			a.done <- <-a.done
		}
		allDone <- struct{}{}
	}()
	var ownerPids []uint32
	for _, k := range keys[1:] {
		ownerPids = append(ownerPids, k.pids...)
	}
	if _, err := awaitAnswerOrBlockedByAny(ctx, admin, ownerPids, allDone); err != nil {
		t.Fatalf("the crowd behind the owners' attempts: %v", err)
	}
	for _, a := range crowd {
		for _, k := range keys[1:] {
			if a.owner == &k.owner {
				commit(k, a)
			}
		}
	}

	var wrong []string
	for _, a := range append([]*ask{b}, crowd...) {
		got := <-a.done
		switch {
		case got.err != nil, got.res.Outcome == strategy.OutcomeBusy:
			// unknown, or refused for now: says nothing of whose answer it is
		case got.res.Outcome != a.want:
			wrong = append(wrong, fmt.Sprintf("%s (user %s): %s, want %s", a.req.Key, a.req.User, got.res.Outcome, a.want))
		case a.owner != nil && (got.res.Reservation.User != a.owner.User || got.res.Reservation.SKU != a.owner.SKU):
			wrong = append(wrong, fmt.Sprintf("%s (user %s): KEY_REUSED with the reservation of user %s on SKU %s, want its owner's, user %s on SKU %s",
				a.req.Key, a.req.User, got.res.Reservation.User, got.res.Reservation.SKU, a.owner.User, a.owner.SKU))
		case a.want == strategy.OutcomeHeld && got.res.Reservation.Key != a.req.Key:
			wrong = append(wrong, fmt.Sprintf("%s (user %s): HELD with the reservation of %s", a.req.Key, a.req.User, got.res.Reservation.Key))
		}
	}
	return wrong
}
