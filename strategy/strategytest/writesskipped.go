package strategytest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkWritesSkipped: a request whose every insert of a row naming its
// key does nothing, without an error, as an INSERT ... ON CONFLICT DO
// NOTHING does that met a row its snapshot cannot see (a namingTrigger
// that skips the row), was refused by nothing the stock decided: it is
// never answered SOLD_OUT on a SKU with 3 units. BUSY, an error, and the
// answers of a conflict (USER_LIMIT, REPLAY, KEY_REUSED: the row met
// may have gone before the strategy looked) are not judged here, nor is
// a HELD without a row, which only the kit's fault makes. A node that
// combines requests and sends one back to its queue each time its row
// did not go in, then answers SOLD_OUT when it has sent it back too often
// ("others took the units"), passed every scenario before: outsider
// round 20's gaveupsold.
func checkWritesSkipped(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const total = 3
	sku := kitSKU("writes-skipped")
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: total}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	req := strategy.Request{Key: "kit-writes-skipped-" + sku, User: "kit-writes-skipped", SKU: sku, TTL: time.Hour}
	skip := skipWritesOrSkip(ctx, t, admin, req.Key)
	defer skip.removeOrReport(t)
	var box panicBox
	reqCtx, reqCancel := context.WithTimeout(ctx, writesFailFor)
	a := <-reserveAsync(reqCtx, &box, dep.Node(0), req)
	reqCancel()
	box.rethrow()
	if a.err == nil && a.res.Outcome == strategy.OutcomeSoldOut {
		t.Errorf("Reserve %q on a SKU of %d units, every insert of a row naming the key doing nothing (as ON CONFLICT DO NOTHING does beside a row it cannot see): SOLD_OUT; want anything but SOLD_OUT (no unit was refused: BUSY or an error if the strategy gave up)",
			req.Key, total)
	}
	// The same request inside an attempt held open, which answers a
	// refusal on a path of its own (combine's attempt is a batch of one,
	// never sent back to a queue: outsider round 56's m15 answered SOLD_OUT
	// there).
	s, ok := sessionOn(ctx, t, dep.Node(0))
	if !ok {
		return
	}
	defer func() { _ = s.Rollback(ctx) }()
	reqCtx, reqCancel = context.WithTimeout(ctx, writesFailFor)
	a = <-reserveAsync(reqCtx, &box, s, req)
	reqCancel()
	box.rethrow()
	if a.err == nil && a.res.Outcome == strategy.OutcomeSoldOut {
		t.Errorf("in an attempt held open, Reserve %q on a SKU of %d units, every insert of a row naming the key doing nothing: SOLD_OUT; want anything but SOLD_OUT",
			req.Key, total)
	}
}
