package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// ttlSteps are what checkTTLMicroseconds adds to T for its three
// reservations: under a millisecond apart, and placed so that any rounding
// to whole milliseconds (down, to nearest, up, of the TTL or of the stored
// expires_at) makes two neighbours equal.
var ttlSteps = []time.Duration{time.Microsecond, 600 * time.Microsecond, 999 * time.Microsecond}

// checkTTLMicroseconds: a TTL is kept to the microsecond. Three
// reservations are made one after the other, TTL T plus each of ttlSteps
// (T a whole number of seconds), in one attempt held open where the
// strategy has them, which then commits; each one's stored expires_at must
// be at least its TTL's difference from the one before after the one
// before's, since each is its TTL after a moment inside its own call and
// each call came after the one before (a microsecond is allowed for each
// stamp's rounding). A strategy that keeps TTLs in whole milliseconds
// (the HTTP API's ttl_ms) stores equal expires_at for two of them, and
// makes a TTL under a millisecond a reservation due when it is made
// (outsider round 23's ttlms); so does one that rounds the TTL to the
// nearest millisecond, or stores expires_at as timestamptz(3) (outsider
// round 48's m30 and m24, which passed the two TTLs 999 µs apart that this
// check had: rounded, they are a millisecond apart). Every other TTL of
// the kit is whole milliseconds, judged with 100 ms of slack or more. In
// one attempt the calls share the transaction's start, so the check holds
// by construction; plain requests are judged the same way, and catch it
// while each begins within a millisecond of the one before.
func checkTTLMicroseconds(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "ttl-micros", 4)
	defer dep.Close()
	node := dep.Node(0)
	var reqs []strategy.Request
	for i, step := range ttlSteps {
		reqs = append(reqs, strategy.Request{Key: fmt.Sprintf("kit-ttl-micros-%d-%s", i+1, sku), User: fmt.Sprintf("kit-ttl-micros-%d", i+1), SKU: sku, TTL: time.Hour + step})
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
	at := make([]time.Time, len(reqs))
	for i, req := range reqs {
		r, err := node.Lookup(ctx, req.Key)
		if err != nil || r.Status != strategy.StatusHeld {
			t.Fatalf("Lookup %q: %+v, %v; want HELD", req.Key, r, err)
		}
		at[i] = r.ExpiresAt
	}
	for i := 1; i < len(reqs); i++ {
		want := reqs[i].TTL - reqs[i-1].TTL - 2*time.Microsecond
		if gap := at[i].Sub(at[i-1]); gap < want {
			t.Errorf("reservations made %s, TTL %s and then %s: stored expires_at %s apart (%s and %s); want at least %s (a TTL kept to the microsecond)",
				how, reqs[i-1].TTL, reqs[i].TTL, gap, at[i-1].Format(time.RFC3339Nano), at[i].Format(time.RFC3339Nano), want)
		}
	}
}
