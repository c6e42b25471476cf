package strategytest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkKeyBehindLastUnit: a request whose key an attempt held open has
// taken, with the SKU's last unit, and that waits behind that attempt, is
// answered about the key once the attempt commits: KEY_REUSED when its user
// is another, REPLAY when it is the same request, never SOLD_OUT. The key
// comes first whatever else holds (strategy.Outcome). A strategy that,
// having waited for the stock and found it empty, answers SOLD_OUT without
// reading the key again passed the kit: its cases of a key behind an
// attempt left units over, or sent the same user, whose check of the user
// looked at the key on the way (outsider round 44's ctr8).
//
// On a SKU of 1 unit and two nodes, for each case an attempt held open on
// node 0 reserves the key (HELD), the request goes to node 1 and must be
// seen waiting behind the attempt's backend (pg_blocking_pids), then the
// attempt commits. A request that answers without waiting, or waits
// elsewhere (besideWithin), is not judged: before the commit the key was
// not yet known.
func checkKeyBehindLastUnit(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	skus := []string{kitSKU("key-behind-last-other"), kitSKU("key-behind-last-same")}
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: skus[0], Total: 1}, {SKU: skus[1], Total: 1}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	opener, ok := dep.Node(0).(strategy.SessionOpener)
	if !ok {
		t.Skip("no attempt held open (strategy.SessionOpener)")
	}
	var wrong []string
	judged := 0
	for i, sku := range skus {
		held := strategy.Request{Key: "kit-kbl-" + sku, User: "kit-kbl-owner-" + sku, SKU: sku, TTL: time.Hour}
		second, want, what := held, strategy.OutcomeReplay, "the same request"
		if i == 0 {
			second.User, want, what = "kit-kbl-other-"+sku, strategy.OutcomeKeyReused, "its key by another user"
		}
		s, pids := holdInSession(ctx, t, opener, held, "the attempt held open with the SKU's last unit")
		var box panicBox
		done := reserveAsync(ctx, &box, dep.Node(1), second)
		blocked, err := awaitAnswerOrBlockedWithin(ctx, admin, pids, done, besideWithin)
		if err != nil {
			_ = s.Rollback(ctx)
			t.Fatalf("%s behind the attempt: %v", what, err)
		}
		if err := s.Commit(ctx); err != nil {
			<-done
			box.rethrow()
			t.Fatalf("Commit of the attempt holding the SKU's last unit: %v", err)
		}
		a := <-done
		box.rethrow()
		if !blocked || a.err != nil {
			continue // answered before the key was known, or unknown
		}
		judged++
		if a.res.Outcome != want && a.res.Outcome != strategy.OutcomeBusy {
			wrong = append(wrong, fmt.Sprintf("%s (key %q), seen waiting behind the attempt that held the key and the SKU's last unit, answered once it committed: %s; want %s (or BUSY)", what, second.Key, a.res.Outcome, want))
		}
	}
	if judged == 0 {
		t.Skip("no request waited in PostgreSQL behind the attempt holding its key and the SKU's last unit")
	}
	if len(wrong) > 0 {
		t.Errorf("the key comes first, the SKU sold out or not: %s", strings.Join(wrong, "; "))
	}
}

// checkNewBehindLastUnitRolledBack: a new request (a key and user of its
// own) that waits behind an attempt held open with the SKU's last unit is
// HELD once the attempt rolls back: the unit it waited for is free again.
// A strategy that, having waited for the SKU (its row, its lock), answers
// from what it read before the wait ("one unit left, and I queued behind
// its buyer: SOLD_OUT") tells a phantom SOLD_OUT whenever that buyer does
// not take the unit. The phantom interleavings run their waiters as
// attempts held open, which such a strategy may answer otherwise, and the
// kit's other plain waiters stood behind holders that committed, or beside
// a unit left (outsider round 45's m13, a redislock).
//
// On a SKU of 1 unit and two nodes, an attempt held open on node 0 takes
// the unit, the request goes to node 1 and must be seen waiting behind the
// attempt (pg_blocking_pids, or a lock it reports: strategy.LockWait),
// then the attempt rolls back. A request that answers without waiting, or
// waits elsewhere (besideWithin), is not judged. BUSY and an error are
// not phantoms.
func checkNewBehindLastUnitRolledBack(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	if !meta.Claims.Has(strategy.NoPhantomSoldOut) {
		t.Skip("no-phantom-sold-out is not claimed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("new-behind-last-rolled-back")
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: sku, Total: 1}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	opener, ok := dep.Node(0).(strategy.SessionOpener)
	if !ok {
		t.Skip("no attempt held open (strategy.SessionOpener)")
	}
	s, pids := holdInSession(ctx, t, opener, strategy.Request{Key: "kit-nblr-held-" + sku, User: "kit-nblr-a", SKU: sku, TTL: time.Hour},
		"the attempt held open with the SKU's last unit")
	req := strategy.Request{Key: "kit-nblr-new-" + sku, User: "kit-nblr-b", SKU: sku, TTL: time.Hour}
	var box panicBox
	done := reserveAsync(ctx, &box, dep.Node(1), req)
	blocked, err := awaitAnswerOrBlockedWithin(ctx, admin, pids, done, besideWithin)
	if err != nil {
		_ = s.Rollback(ctx)
		t.Fatalf("a new request behind the attempt: %v", err)
	}
	if err := s.Rollback(ctx); err != nil {
		<-done
		box.rethrow()
		t.Fatalf("Rollback of the attempt holding the SKU's last unit: %v", err)
	}
	a := <-done
	box.rethrow()
	if !blocked {
		t.Skip("the new request did not wait in PostgreSQL, or for a lock it reports, behind the attempt holding the SKU's last unit")
	}
	if a.err == nil && a.res.Outcome == strategy.OutcomeSoldOut {
		t.Errorf("a new request (key %q), seen waiting behind the attempt that held the SKU's last unit, answered once the attempt rolled back: SOLD_OUT; want HELD (or BUSY, or an error): the unit it waited for was free", req.Key)
	}
}
