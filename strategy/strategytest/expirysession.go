package strategytest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkExpirySessionRollback: an expiry job held open that is rolled back
// has moved nothing and given nothing back; the same job committed then
// moves the rows and returns their units once. kill-release only ever ends
// such a session by SIGKILL, so a Rollback that gives back the units it
// counted (a memquota whose give-back runs on both ends) passes everything
// else, and the units it returned are sold twice. The committed session
// runs its job twice, the second run moving nothing: a session that keeps
// only its last run's rows to give back (outsider round 28's mq1) loses
// the units of the first.
func checkExpirySessionRollback(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "expiry-rollback", 3)
	defer dep.Close()
	ager, ok := dep.(strategy.Ager)
	if !ok {
		t.Skip("no MakeDue (strategy.Ager): a due reservation cannot be made without waiting for its TTL")
	}
	node := dep.Node(0)
	opener, ok := node.(strategy.ExpirySessionOpener)
	if !ok {
		t.Skip("no expiry job held open (strategy.ExpirySessionOpener)")
	}
	keys := []string{"kit-expiry-rollback-1-" + sku, "kit-expiry-rollback-2-" + sku}
	for i, key := range keys {
		if res, err := reserveUnlessBusy(ctx, node, strategy.Request{Key: key, User: "kit-expiry-rollback-" + string(rune('a'+i)), SKU: sku, TTL: time.Hour}); err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Fatalf("Reserve: %s, %v; want HELD", res.Outcome, err)
		}
	}
	if n, err := ager.MakeDue(ctx, keys); err != nil || n != len(keys) {
		t.Fatalf("MakeDue: %d, %v; want %d", n, err, len(keys))
	}
	audit := func(when string, wantAvail, wantActive int) {
		t.Helper()
		list, err := dep.Audit(ctx)
		if err != nil || len(list) != 1 {
			t.Fatalf("Audit: %+v, %v", list, err)
		}
		if a := list[0]; a.Available != wantAvail || a.Active != wantActive || a.Drift() != 0 {
			t.Errorf("%s: %+v; want available %d, active %d, drift 0", when, a, wantAvail, wantActive)
		}
	}
	for _, end := range []string{"rollback", "commit"} {
		s, err := opener.OpenExpirySession(ctx)
		if err != nil {
			t.Fatalf("OpenExpirySession: %v", err)
		}
		units, err := s.ExpireDue(ctx)
		if err != nil || units != len(keys) {
			_ = s.Rollback(ctx)
			t.Fatalf("ExpirySession.ExpireDue of %d due reservations: %d, %v", len(keys), units, err)
		}
		if end == "rollback" {
			if err := s.Rollback(ctx); err != nil {
				t.Fatalf("Rollback: %v", err)
			}
			for _, key := range keys {
				if r, err := node.Lookup(ctx, key); err != nil || r.Status != strategy.StatusHeld {
					t.Errorf("after the expiry session's Rollback: %s is %s, %v; want HELD", key, r.Status, err)
				}
			}
			audit("after the expiry session's Rollback", 1, len(keys))
			continue
		}
		// A job held open may run again before it commits (a job that
		// loops until a run moves nothing): the second run moves nothing,
		// and the commit still returns what the first moved.
		if again, err := s.ExpireDue(ctx); err != nil || again != 0 {
			_ = s.Rollback(ctx)
			t.Fatalf("ExpirySession.ExpireDue run again in the same session, nothing more due: %d, %v; want 0", again, err)
		}
		if err := s.Commit(ctx); err != nil {
			t.Fatalf("Commit: %v", err)
		}
		audit("after the expiry session's Commit, its job run twice (the second moving nothing)", 3, 0)
	}
	// Every unit sells once more, and no more than that.
	held := 0
	for i := 0; i < 4; i++ {
		res, err := reserveUnlessBusy(ctx, node, strategy.Request{Key: "kit-expiry-rollback-again-" + string(rune('a'+i)) + "-" + sku, User: "kit-expiry-rollback-again-" + string(rune('a'+i)), SKU: sku, TTL: time.Hour})
		if err != nil {
			t.Fatalf("Reserve after the expiry: %v", err)
		}
		if res.Outcome == strategy.OutcomeHeld {
			held++
		}
	}
	if held != 3 {
		t.Errorf("4 requests for the 3 units after the expiry: %d HELD, want 3", held)
	}
	audit("after selling out again", 0, 3)
}
