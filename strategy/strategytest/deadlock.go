package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkDeadlockVictim: two attempts held open, on two nodes, each hold a
// unit of one SKU and then ask for a unit of the other's. Where the
// strategy locks per SKU, the second ask closes a cycle, and PostgreSQL
// ends one of the two transactions (40P01) after its deadlock_timeout.
// Nothing refused that request: both SKUs have units left, and its key
// and user are new. Its answer is an error (unknown) or BUSY, never
// SOLD_OUT, USER_LIMIT, KEY_REUSED or REPLAY. No scenario took two SKUs'
// locks in opposite orders, so no Reserve had met a deadlock (outsider
// round 49's m17 answered one SOLD_OUT, "it lost the race"). The first ask
// is sent alone and seen waiting (pg_blocking_pids, or a lock outside
// PostgreSQL) before the second; where it does not wait, there is no cycle
// and both answers are judged the same way.
func checkDeadlockVictim(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	skuA := kitSKU("deadlock")
	skuB := skuA + "-b"
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: skuA, Total: 4}, {SKU: skuB, Total: 4}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	opener0, ok0 := dep.Node(0).(strategy.SessionOpener)
	opener1, ok1 := dep.Node(1).(strategy.SessionOpener)
	if !ok0 || !ok1 {
		t.Skip("no attempt held open (strategy.SessionOpener)")
	}
	req := func(i int, sku string) strategy.Request {
		return strategy.Request{Key: fmt.Sprintf("kit-deadlock-%d-%s", i, skuA), User: fmt.Sprintf("kit-deadlock-%d", i), SKU: sku, TTL: time.Hour}
	}
	s1, _ := holdInSession(ctx, t, opener0, req(1, skuA), "Session.Reserve on node 0 of a unit of the first SKU")
	defer func() { _ = s1.Rollback(context.Background()) }()
	s2, b2 := holdInSession(ctx, t, opener1, req(2, skuB), "Session.Reserve on node 1 of a unit of the second SKU")
	defer func() { _ = s2.Rollback(context.Background()) }()
	var box panicBox
	defer box.rethrow()
	asks := []strategy.Request{req(3, skuB), req(4, skuA)}
	first := reserveAsync(ctx, &box, s1, asks[0])
	if _, err := awaitAnswerOrBlocked(ctx, admin, int32(b2[0]), first); err != nil {
		t.Fatalf("read the lock waits: %v", err)
	}
	second := reserveAsync(ctx, &box, s2, asks[1])
	// The victim's attempt may keep what it held before (its request ran
	// in a savepoint): each attempt is rolled back once it answers, so
	// that the other goes on; only the answers are judged.
	sessions, dones := []strategy.Session{s1, s2}, []chan answer{first, second}
	answers := make([]*answer, 2)
	for range 2 {
		var i int
		var a answer
		select {
		case a = <-dones[0]:
			i, dones[0] = 0, nil
		case a = <-dones[1]:
			i, dones[1] = 1, nil
		case <-ctx.Done():
			t.Fatalf("the two attempts held open, each asking for the other's SKU, did not both answer within a minute")
		}
		answers[i] = &a
		_ = sessions[i].Rollback(ctx)
	}
	for i, a := range answers {
		if a.err != nil {
			continue
		}
		switch a.res.Outcome {
		case strategy.OutcomeSoldOut, strategy.OutcomeUserLimit, strategy.OutcomeKeyReused, strategy.OutcomeReplay:
			t.Errorf("attempt %d held open asked for %s (its key and user new, units left) after holding a unit of the other SKU, while the other attempt asked for its SKU the same way (a deadlock where the strategy locks per SKU): %s, <nil>; want HELD, BUSY or an error (a transaction ended as a deadlock's victim was refused nothing)",
				i+1, asks[i].SKU, a.res.Outcome)
		}
	}
}

// checkPlainDeadlockVictim: checkDeadlockVictim with a plain request as
// the victim. An attempt held open on node 0 holds key K on the second SKU;
// a plain request on node 1 sends K, from another user, for the first SKU,
// and is seen waiting (where the strategy takes the SKU's lock first, it
// holds the first SKU's lock while it waits for K's row); then the attempt
// asks for a unit of the first SKU under a new key, which closes the cycle
// there, and PostgreSQL ends the plain request, which waited first.
// Nothing refused it: the first SKU has units, and its user holds nothing.
// Its answer is an error, BUSY, KEY_REUSED (K is known, retried once the
// attempt is gone) or HELD (retried after the attempt rolled back), never
// SOLD_OUT, USER_LIMIT or REPLAY (outsider round 53's b05, a strategy of
// its own that answered a deadlock SOLD_OUT: in an attempt held open the
// answer became an error on its own, and no scenario deadlocked a plain
// request). The attempt's own ask is judged as checkDeadlockVictim judges
// both.
func checkPlainDeadlockVictim(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	skuX := kitSKU("plain-deadlock")
	skuY := skuX + "-y"
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: skuX, Total: plainDeadlockRounds + 1}, {SKU: skuY, Total: plainDeadlockRounds + 1}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	opener, ok := dep.Node(0).(strategy.SessionOpener)
	if !ok {
		t.Skip("no attempt held open (strategy.SessionOpener)")
	}
	// PostgreSQL ends the transaction whose deadlock_timeout (1 s) runs out
	// first once the cycle is there: the plain request's, which waited
	// first, unless the attempt's ask began to wait more than that after
	// it (a loaded machine); then the attempt is ended, and the round says
	// nothing of the plain request. Rounds run until one ended the plain
	// request (the attempt's ask was HELD), at most plainDeadlockRounds
	// (ctl-plain-deadlock-sold-out was missed once in a table run with one).
	for round := 1; round <= plainDeadlockRounds; round++ {
		if plainDeadlockRound(ctx, t, dep, opener, admin, skuX, skuY, round) {
			return
		}
	}
}

// plainDeadlockRounds bounds checkPlainDeadlockVictim's rounds.
const plainDeadlockRounds = 3

// plainDeadlockRound is one round of checkPlainDeadlockVictim; it reports
// whether the attempt's ask was HELD (so the plain request was the one a
// deadlock, if any, ended).
func plainDeadlockRound(ctx context.Context, t tester, dep strategy.Deployment, opener strategy.SessionOpener, admin *pgxpool.Pool, skuX, skuY string, round int) bool {
	t.Helper()
	key := fmt.Sprintf("kit-plain-deadlock-k%d-%s", round, skuX)
	s, backends := holdInSession(ctx, t, opener, strategy.Request{Key: key, User: fmt.Sprintf("kit-plain-deadlock-1-%d", round), SKU: skuY, TTL: time.Hour}, "Session.Reserve on node 0 of a unit of the second SKU")
	defer func() { _ = s.Rollback(context.Background()) }()
	var box panicBox
	defer box.rethrow()
	plain := strategy.Request{Key: key, User: fmt.Sprintf("kit-plain-deadlock-2-%d", round), SKU: skuX, TTL: time.Hour}
	plainDone := reserveAsync(ctx, &box, dep.Node(1), plain)
	if _, err := awaitAnswerOrBlocked(ctx, admin, int32(backends[0]), plainDone); err != nil {
		t.Fatalf("read the lock waits: %v", err)
	}
	ask := strategy.Request{Key: fmt.Sprintf("kit-plain-deadlock-ask%d-%s", round, skuX), User: fmt.Sprintf("kit-plain-deadlock-1-%d", round), SKU: skuX, TTL: time.Hour}
	askDone := reserveAsync(ctx, &box, s, ask)
	var plainAnswer, askAnswer *answer
	for plainAnswer == nil || askAnswer == nil {
		select {
		case a := <-plainDone:
			plainAnswer, plainDone = &a, nil
		case a := <-askDone:
			askAnswer, askDone = &a, nil
			_ = s.Rollback(ctx) // so that the plain request, if it waits on, goes on
		case <-ctx.Done():
			t.Fatalf("the plain request and the attempt held open, each waiting for the other, did not both answer within a minute")
		}
	}
	if a := plainAnswer; a.err == nil {
		switch a.res.Outcome {
		case strategy.OutcomeSoldOut, strategy.OutcomeUserLimit, strategy.OutcomeReplay:
			t.Errorf("a plain request for key %q (held uncommitted by another user's attempt, on another SKU), for a SKU with units, by a user who holds nothing, while that attempt asked for its SKU (a deadlock where the strategy locks the SKU before the key): %s, <nil>; want an error, BUSY, KEY_REUSED or HELD (a request ended as a deadlock's victim was refused nothing)",
				key, a.res.Outcome)
		}
	}
	if a := askAnswer; a.err == nil {
		switch a.res.Outcome {
		case strategy.OutcomeSoldOut, strategy.OutcomeUserLimit, strategy.OutcomeKeyReused, strategy.OutcomeReplay:
			t.Errorf("an attempt held open asked for %s (its key new, units left) while a plain request waited for the key it held: %s, <nil>; want HELD, BUSY or an error",
				ask.SKU, a.res.Outcome)
		}
	}
	return askAnswer.err == nil && askAnswer.res.Outcome == strategy.OutcomeHeld
}
