package strategytest

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkSessionDiesBeforeCommit: an attempt held open whose backend ends
// before its COMMIT (an administrator, a failover, a dropped connection)
// wrote nothing, and its unit is sold again. On a SKU of 1 unit an attempt
// reserves it; the kit ends the attempt's backends (pg_terminate_backend,
// waited out in pg_stat_activity) while they are idle in the transaction;
// Commit must fail; then a new user asks and must be HELD, and the
// attempt's key must be unknown. A strategy that keeps the units of any
// COMMIT error that is not the server's rollback ("underselling is safe"),
// without recording them in doubt, never sells the unit again (outsider
// round 36's m5mqcommiterrkeep, memquota-recover): commit-timeout's COMMITs
// all land on the server, where keeping the unit is right, and no scenario
// ended an attempt's backend before its COMMIT.
func checkSessionDiesBeforeCommit(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "session-dies", 1)
	defer dep.Close()
	node := dep.Node(0)
	opener, ok := node.(strategy.SessionOpener)
	if !ok {
		t.Skip("no attempt held open (strategy.SessionOpener)")
	}
	first := strategy.Request{Key: "kit-sd-first-" + sku, User: "kit-sd-first", SKU: sku, TTL: time.Hour}
	s, pids := holdInSession(ctx, t, opener, first, "the attempt whose backend ends")
	defer func() { _ = s.Rollback(context.Background()) }()
	for _, pid := range pids {
		if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, int32(pid)); err != nil {
			t.Fatalf("pg_terminate_backend of the attempt's backend: %v", err)
		}
		if err := awaitBackendGone(ctx, admin, int32(pid)); err != nil {
			t.Fatalf("the attempt's backend after pg_terminate_backend: %v", err)
		}
	}
	if err := s.Commit(ctx); err == nil {
		t.Fatalf("Commit of an attempt whose backend was ended: no error; want one (nothing reached the server)")
	} else if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Commit of an attempt whose backend was ended: %v", err)
	}
	second := strategy.Request{Key: "kit-sd-second-" + sku, User: "kit-sd-second", SKU: sku, TTL: time.Hour}
	res, err := reserveUntilAnswered(ctx, node, second)
	switch {
	case err != nil || res.Outcome == strategy.OutcomeBusy:
		return // unknown, or refused for now: says nothing of the unit
	case res.Outcome != strategy.OutcomeHeld:
		t.Errorf("a SKU of 1 unit whose only attempt's backend ended before its COMMIT (Commit failed, nothing written): a new user is answered %s; want HELD (the unit comes back)", res.Outcome)
	}
	if r, err := node.Lookup(ctx, first.Key); err == nil && r.Status != strategy.StatusNotFound {
		t.Errorf("the key of an attempt whose backend ended before its COMMIT: %s; want NOT_FOUND", r.Status)
	}
}
