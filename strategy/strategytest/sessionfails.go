package strategytest

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkSessionStatementFails: an attempt held open whose second request
// fails in the server (a write of its row raises an error) and is then
// committed keeps its first reservation whole or not at all. Where the
// strategy ran the request in a savepoint, the COMMIT goes through and the
// first is HELD; where the failure aborted the transaction, PostgreSQL
// turns the COMMIT into a ROLLBACK (the client is told so), and the first
// unit is free again. Either way the SKU then sells exactly the units no
// reservation holds. A strategy that counts in memory and takes a COMMIT
// the server rolled back for one whose outcome is unknown keeps the unit
// in doubt while its pooled connection lives, for good (outsider round
// 52's m13, memquota): no attempt of the kit had met a failing statement
// before its COMMIT.
func checkSessionStatementFails(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const total = 2
	dep, opener, sku := openOneSKUForSessions(ctx, t, meta, db, rs, "session-fails", total)
	defer dep.Close()
	first := strategy.Request{Key: "kit-session-fails-1-" + sku, User: "kit-session-fails-1", SKU: sku, TTL: time.Hour}
	second := strategy.Request{Key: "kit-session-fails-2-" + sku, User: "kit-session-fails-2", SKU: sku, TTL: time.Hour}
	// The trigger goes on before the attempt begins, and comes off once
	// the check is over: either takes a lock on the tables that the
	// attempt's writes conflict with. It fails only the second's writes.
	fail, err := failWritesNaming(ctx, admin, second.Key, "P0001", false)
	if errors.Is(err, errNoTables) {
		t.Skip("the strategy keeps no tables in PostgreSQL: no write to fail")
	} else if err != nil {
		t.Fatalf("%v", err)
	}
	defer fail.removeOrReport(t)
	s, _ := holdInSession(ctx, t, opener, first, "Session.Reserve of the first unit of a SKU of 2")
	defer func() { _ = s.Rollback(context.Background()) }()
	res, reserveErr := s.Reserve(ctx, second)
	if reserveErr == nil && res.Outcome == strategy.OutcomeHeld {
		t.Errorf("Session.Reserve of %q, whose row's write raised an error in the server: HELD, <nil>; want an error", second.Key)
	}
	commitErr := s.Commit(ctx)
	got, err := dep.Node(0).Lookup(ctx, first.Key)
	if err != nil {
		t.Fatalf("Lookup %q: %v", first.Key, err)
	}
	if commitErr == nil && got.Status != strategy.StatusHeld {
		t.Errorf("the attempt's COMMIT went through after its second request failed, but its first reservation %q reads %s; want HELD", first.Key, got.Status)
	}
	held := 0
	if got.Status.Active() {
		held = 1
	}
	sold := &seller{t: t, dep: dep, nodes: 1, prefix: "kit-session-fails-after"}
	if again := sold.sellOut(ctx, sku, total); len(again) != total-held {
		t.Errorf("a SKU of %d whose attempt held open took one unit, failed its second request in the server, and committed (%v; its first reservation %s): %d units sold after it; want %d (every unit no reservation holds)",
			total, commitErr, got.Status, len(again), total-held)
	}
}
