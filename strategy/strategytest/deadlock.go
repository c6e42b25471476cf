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
