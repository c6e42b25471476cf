package strategytest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkTwoOfOneSKUInSession: one attempt held open reserves two units of
// one SKU of 4 (one already sold), for two users (a checkout of two tickets in one transaction),
// with nobody else asking: both are HELD, and both hold once it commits. A
// strategy that takes the SKU's lock again for the second, although its
// own session holds it, waits for itself until its bound and answers BUSY
// (outsider round 19's redislock); every session of the kit's other checks
// and interleavings reserves a SKU once. Then the attempt sends its first
// key again (REPLAY) and a new key of the same user (USER_LIMIT), takes
// the third unit and is refused a fourth (SOLD_OUT), and all three hold
// once it commits. Before all that, an attempt of two units of the SKU,
// which also sends the key of the unit sold before (REPLAY, and from
// another user KEY_REUSED), rolls back, and both units come back, and
// nothing for the REPLAY or the KEY_REUSED.
func checkTwoOfOneSKUInSession(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "session-twice", 4)
	defer dep.Close()
	opener, ok := dep.Node(0).(strategy.SessionOpener)
	if !ok {
		t.Skip("no attempt held open (strategy.SessionOpener)")
	}
	sold := strategy.Request{Key: "kit-st-sold-" + sku, User: "kit-st-sold", SKU: sku, TTL: time.Hour}
	holdForCheck(ctx, t, dep.Node(0), sold)
	// First an attempt of two units of the SKU that rolls back: both
	// units come back. An attempt that keeps what it took by SKU ("a
	// cart line is one SKU") gives one back and loses the other for good
	// (outsider round 22's cartbysku).
	rb, err := opener.OpenSession(ctx)
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	for _, user := range []string{"kit-st-r1", "kit-st-r2"} {
		req := strategy.Request{Key: "kit-st-" + user + "-" + sku, User: user, SKU: sku, TTL: time.Hour}
		if res, err := rb.Reserve(ctx, req); err != nil || res.Outcome != strategy.OutcomeHeld {
			_ = rb.Rollback(ctx)
			t.Fatalf("Session.Reserve of a unit of a SKU of 4 for user %s, in one attempt held open with nobody else asking: %s, %v; want HELD", user, res.Outcome, err)
		}
	}
	// The key sold before the attempt, sent again inside it, is a REPLAY
	// of a unit the attempt did not take: its rollback gives nothing back
	// for it. An attempt that keeps a REPLAY among what it took gives the
	// sold unit back, and it sells twice (outsider round 24's sessreplay).
	if res, err := rb.Reserve(ctx, sold); err != nil || res.Outcome != strategy.OutcomeReplay {
		t.Errorf("Session.Reserve of key %q, sold before the attempt began: %s, %v; want REPLAY", sold.Key, res.Outcome, err)
	}
	// Sent by another user it is KEY_REUSED, which takes nothing either:
	// an attempt that keeps a KEY_REUSED among what it took gives back a
	// unit it never held (outsider round 52's m32, memquota).
	reused := sold
	reused.User = "kit-st-other"
	if res, err := rb.Reserve(ctx, reused); err != nil || res.Outcome != strategy.OutcomeKeyReused {
		t.Errorf("Session.Reserve of key %q, sold before the attempt began to another user: %s, %v; want KEY_REUSED", sold.Key, res.Outcome, err)
	}
	if err := rb.Rollback(ctx); err != nil {
		t.Fatalf("Rollback of the attempt that reserved two units of one SKU: %v", err)
	}
	if list, err := dep.Audit(ctx); err != nil || len(list) != 1 {
		t.Fatalf("Audit: %+v, %v", list, err)
	} else if a := list[0]; a.Active != 1 || a.Available != 3 || a.Drift() != 0 {
		t.Errorf("audit after one attempt reserved 2 units of a SKU of 4 (one sold before), sent the sold key again, as its owner and as another user, and rolled back: %+v; want 1 active, 3 available (both units back, none for the REPLAY or the KEY_REUSED)", a)
	}
	s, err := opener.OpenSession(ctx)
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	defer func() { _ = s.Rollback(context.Background()) }()
	for i, user := range []string{"kit-st-u1", "kit-st-u2"} {
		req := strategy.Request{Key: "kit-st-" + user + "-" + sku, User: user, SKU: sku, TTL: time.Hour}
		if res, err := s.Reserve(ctx, req); err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Fatalf("Session.Reserve of unit %d of 4 of one SKU (the first sold before), for user %s, in one attempt held open with nobody else asking: %s, %v; want HELD",
				i+2, user, res.Outcome, err)
		}
	}
	// The same attempt then meets what it wrote itself: its first key sent
	// again is a REPLAY, and a new key of that user is refused for the SKU
	// it holds (a fourth unit is left: USER_LIMIT is the only answer). A strategy that reads why not outside the session sees
	// neither (outsider round 19's onetrip failed both calls).
	again := strategy.Request{Key: "kit-st-kit-st-u1-" + sku, User: "kit-st-u1", SKU: sku, TTL: time.Hour}
	if res, err := s.Reserve(ctx, again); err != nil || res.Outcome != strategy.OutcomeReplay {
		t.Errorf("Session.Reserve of key %q again, in the attempt that reserved it: %s, %v; want REPLAY", again.Key, res.Outcome, err)
	}
	other := strategy.Request{Key: "kit-st-u1-other-" + sku, User: "kit-st-u1", SKU: sku, TTL: time.Hour}
	if res, err := s.Reserve(ctx, other); err != nil || res.Outcome != strategy.OutcomeUserLimit {
		t.Errorf("Session.Reserve of a new key by user kit-st-u1, who holds the SKU in this attempt: %s, %v; want USER_LIMIT", res.Outcome, err)
	}
	// Last, the attempt takes the last unit and is refused one more: a
	// SOLD_OUT inside an attempt undoes only its own request. A strategy
	// that marks one savepoint for the whole attempt, at its first
	// request, and rolls back to it on SOLD_OUT ("a round trip saved per
	// request") undoes every unit the attempt held before (outsider round
	// 23's onesavepoint); no other session of the kit was refused after it
	// had held a unit.
	third := strategy.Request{Key: "kit-st-u3-" + sku, User: "kit-st-u3", SKU: sku, TTL: time.Hour}
	if res, err := s.Reserve(ctx, third); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("Session.Reserve of unit 4 of 4 of one SKU, for user kit-st-u3, in the attempt that holds two (one was sold before): %s, %v; want HELD", res.Outcome, err)
	}
	fourth := strategy.Request{Key: "kit-st-u4-" + sku, User: "kit-st-u4", SKU: sku, TTL: time.Hour}
	if res, err := s.Reserve(ctx, fourth); err != nil || res.Outcome != strategy.OutcomeSoldOut {
		t.Errorf("Session.Reserve of a fifth unit of a SKU of 4, in the attempt that holds three (one was sold before): %s, %v; want SOLD_OUT", res.Outcome, err)
	}
	if err := s.Commit(ctx); err != nil {
		t.Fatalf("Commit of the attempt that reserved three units of one SKU: %v", err)
	}
	list, err := dep.Audit(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("Audit: %+v, %v", list, err)
	}
	if a := list[0]; a.Active != 4 || a.Available != 0 || a.Drift() != 0 {
		t.Errorf("audit after one attempt reserved the last 3 units of a SKU of 4, was refused one more, and committed: %+v; want 4 active, 0 available, drift 0", a)
	}
	for _, key := range []string{again.Key, "kit-st-kit-st-u2-" + sku, third.Key} {
		if got, err := dep.Node(0).Lookup(ctx, key); err != nil || got.Status != strategy.StatusHeld {
			t.Errorf("Lookup of %q, HELD in the attempt that then committed: %+v, %v; want HELD", key, got, err)
		}
	}
}
