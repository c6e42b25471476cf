package strategytest

import (
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkAttachedInOtherOrder: a second process attaches with the same stock
// listed in another order (its configuration file lists the SKUs another
// way) and reserves a SKU whose one unit an attempt held open in the first
// process has taken; the attempt then commits. The second process's
// request must see that attempt, by waiting for it or otherwise: the SKU
// ends with no more active reservations than units. A strategy that names
// what it locks or counts by a SKU's position in its configuration (an
// advisory lock id from the index) locks another SKU in the second process
// and sells the unit twice. Every other attach of the kit lists the stock
// as the first process did: an advisorylock whose lock id was the SKU's
// index passed every scenario (outsider round 18). Like
// checkAttachBesideAttempt, it skips a strategy that counts stock in a node
// process's memory.
func checkAttachedInOtherOrder(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	skus := []strategy.Stock{{SKU: kitSKU("attach-order-a"), Total: 1}, {SKU: kitSKU("attach-order-b"), Total: 2}}
	dep, opener := openToAttachBeside(ctx, t, meta, strategy.Config{Resources: rs, DB: db, Stock: skus})
	defer dep.Close()
	sku := skus[0].SKU
	reversed := slices.Clone(skus)
	slices.Reverse(reversed)
	second, err := meta.Attach(ctx, strategy.Config{Resources: rs, DB: db, Stock: reversed})
	if err != nil {
		t.Fatalf("Attach with the same stock in another order (%s, %s): %v", reversed[0].SKU, reversed[1].SKU, err)
	}
	defer second.Close()
	session, holder := holdInSession(ctx, t, opener, strategy.Request{Key: "kit-attach-order-1-" + sku, User: "kit-attach-order-1", SKU: sku, TTL: time.Hour},
		"the attempt held open in the first process")
	defer func() { _ = session.Rollback(ctx) }()
	var box panicBox
	defer box.rethrow()
	req := strategy.Request{Key: "kit-attach-order-2-" + sku, User: "kit-attach-order-2", SKU: sku, TTL: time.Hour}
	done := reserveAsync(ctx, &box, second.Node(0), req)
	waited, err := awaitAnswerOrBlocked(ctx, admin, int32(holder[0]), done)
	if err != nil {
		t.Fatalf("a request of the attached process beside the attempt: %v", err)
	}
	if err := session.Commit(ctx); err != nil {
		t.Fatalf("Commit of the attempt: %v", err)
	}
	a := <-done
	list, err := second.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	for _, st := range list {
		if st.SKU == sku && st.Active > st.Total {
			t.Errorf("SKU of 1 unit, listed first by one process and last by a second one that attached: an attempt held open in the first took the unit and committed; the second answered %s, %v (%s); audit: %d active for %d",
				a.res.Outcome, a.err, map[bool]string{true: "after waiting for the attempt", false: "without waiting for it"}[waited], st.Active, st.Total)
		}
	}
}
