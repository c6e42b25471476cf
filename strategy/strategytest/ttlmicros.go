package strategytest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// ttlStep is the difference between the two TTLs checkTTLMicroseconds
// holds: under a millisecond, so that a TTL kept in whole milliseconds
// loses it.
const ttlStep = 999 * time.Microsecond

// checkTTLMicroseconds: a TTL is kept to the microsecond. Two reservations
// are made one after the other, TTL T and T + 999 µs (T a whole number of
// seconds), in one attempt held open where the strategy has them, which
// then commits; the second's stored expires_at must be at least 999 µs
// after the first's, since each is its TTL after a moment inside its own
// call and the second call came after the first (a microsecond is allowed
// for each stamp's rounding). A strategy that keeps TTLs in whole
// milliseconds (the HTTP API's ttl_ms) stores both T after the
// transaction's start, and makes a TTL under a millisecond a reservation
// due when it is made (outsider round 23's ttlms); every other TTL of the
// kit is whole milliseconds, judged with 100 ms of slack or more. In one
// attempt both calls share the transaction's start, so the check holds by
// construction; two plain requests are judged the same way, and catch it
// while the second begins within a millisecond of the first.
func checkTTLMicroseconds(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "ttl-micros", 4)
	defer dep.Close()
	node := dep.Node(0)
	reqs := []strategy.Request{
		{Key: "kit-ttl-micros-1-" + sku, User: "kit-ttl-micros-1", SKU: sku, TTL: time.Hour},
		{Key: "kit-ttl-micros-2-" + sku, User: "kit-ttl-micros-2", SKU: sku, TTL: time.Hour + ttlStep},
	}
	how := "one after the other"
	if opener, ok := node.(strategy.SessionOpener); ok {
		how = "in one attempt held open"
		s, err := opener.OpenSession(ctx)
		if err != nil {
			t.Fatalf("OpenSession: %v", err)
		}
		defer func() { _ = s.Rollback(context.Background()) }()
		for _, req := range reqs {
			if res, err := s.Reserve(ctx, req); err != nil || res.Outcome != strategy.OutcomeHeld {
				t.Fatalf("Session.Reserve %q (TTL %s) on a fresh SKU of 4: %s, %v; want HELD", req.Key, req.TTL, res.Outcome, err)
			}
		}
		if err := s.Commit(ctx); err != nil {
			t.Fatalf("Commit: %v", err)
		}
	} else {
		for _, req := range reqs {
			holdForCheck(ctx, t, node, req)
		}
	}
	var at [2]time.Time
	for i, req := range reqs {
		r, err := node.Lookup(ctx, req.Key)
		if err != nil || r.Status != strategy.StatusHeld {
			t.Fatalf("Lookup %q: %+v, %v; want HELD", req.Key, r, err)
		}
		at[i] = r.ExpiresAt
	}
	if gap := at[1].Sub(at[0]); gap < ttlStep-2*time.Microsecond {
		t.Errorf("two reservations made %s, TTL %s and %s: stored expires_at %s apart; want at least %s (a TTL kept to the microsecond)",
			how, reqs[0].TTL, reqs[1].TTL, gap, ttlStep-2*time.Microsecond)
	}
}
