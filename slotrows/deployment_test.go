package slotrows_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/slotrows"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

// TestOpenValidatesFirst: an invalid config is refused before anything is
// written, not even the schema.
func TestOpenValidatesFirst(t *testing.T) {
	ctx := testCtx(t)
	db, admin := pgtest.Pools(t)
	_, err := slotrows.Meta().Open(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: "a", Total: 1}, {SKU: "a", Total: 2}}})
	if !errors.Is(err, strategy.ErrConfig) {
		t.Fatalf("Open with a SKU listed twice: %v, want ErrConfig", err)
	}
	var tables int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename LIKE 'slotrows\_%'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Errorf("a refused Open created %d tables", tables)
	}
}

// TestOpenSplitsStock: Open pre-splits one free slot per unit, numbered
// 1..total; a SKU that exists already fails the whole Open with
// ErrStockExists and inserts nothing, not even the config's new SKUs.
func TestOpenSplitsStock(t *testing.T) {
	ctx := testCtx(t)
	db, admin := pgtest.Pools(t)
	deploy(t, db, 1, strategy.Stock{SKU: "a", Total: 5}, strategy.Stock{SKU: "empty", Total: 0})
	var n, lo, hi, free int
	if err := admin.QueryRow(ctx, `SELECT count(*), min(slot_no), max(slot_no), count(*) FILTER (WHERE holder IS NULL) FROM slotrows_slot WHERE sku = 'a'`).Scan(&n, &lo, &hi, &free); err != nil {
		t.Fatal(err)
	}
	if n != 5 || lo != 1 || hi != 5 || free != 5 {
		t.Errorf("slots of a: %d numbered %d..%d, %d free; want 5 numbered 1..5, all free", n, lo, hi, free)
	}

	_, err := slotrows.Meta().Open(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: "b", Total: 3}, {SKU: "a", Total: 7}}})
	if !errors.Is(err, strategy.ErrStockExists) {
		t.Fatalf("Open with an existing SKU: %v, want ErrStockExists", err)
	}
	var rows int
	if err := admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM slotrows_sku WHERE sku = 'b') + (SELECT count(*) FROM slotrows_slot WHERE sku IN ('a', 'b'))`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 5 {
		t.Errorf("after the refused Open: %d rows for b and the slots of a and b, want 5 (a's own)", rows)
	}
	deploy(t, db, 1, strategy.Stock{SKU: "b", Total: 3}) // b is still new
}

// TestConcurrentOpens: Opens racing on a fresh database all succeed; the
// advisory lock keeps their CREATE ... IF NOT EXISTS from colliding.
func TestConcurrentOpens(t *testing.T) {
	ctx := testCtx(t)
	db, _ := pgtest.Pools(t)
	const opens = 8
	deps := make([]strategy.Deployment, opens)
	errs := make([]error, opens)
	strategytest.Together(opens, func(i int) {
		deps[i], errs[i] = slotrows.Meta().Open(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: fmt.Sprintf("sku-%d", i), Total: i}}})
	})
	for i, err := range errs {
		if err != nil {
			t.Errorf("Open %d: %v", i, err)
			continue
		}
		if a := auditOf(t, deps[i], fmt.Sprintf("sku-%d", i)); a.Total != i || a.Available != i {
			t.Errorf("deployment %d: %+v", i, a)
		}
		_ = deps[i].Close()
	}
}

// TestSharedDatabase: two deployments with disjoint SKUs in one database.
// Each one's Audit, MakeDue, ExpireDue, Confirm and Release touch only its
// own SKUs, and the other's SKU is an unknown SKU to its Reserve.
func TestSharedDatabase(t *testing.T) {
	ctx := testCtx(t)
	db, _ := pgtest.Pools(t)
	a := deploy(t, db, 1, strategy.Stock{SKU: "sku-a", Total: 3})
	b := deploy(t, db, 1, strategy.Stock{SKU: "sku-b", Total: 3})
	na, nb := a.Node(0), b.Node(0)
	for _, x := range []struct {
		n   strategy.Strategy
		req strategy.Request
	}{{na, request("a1", "1", "sku-a")}, {na, request("a2", "2", "sku-a")}, {nb, request("b1", "1", "sku-b")}, {nb, request("b2", "2", "sku-b")}} {
		if res, err := x.n.Reserve(ctx, x.req); err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Fatalf("%s: %+v, %v", x.req.Key, res, err)
		}
	}

	res, err := na.Reserve(ctx, request("a3", "3", "sku-b"))
	var rerr *strategy.RequestError
	if res.Outcome != strategy.OutcomeBadRequest || !errors.As(err, &rerr) || rerr.Field != "sku" {
		t.Errorf("deployment a reserving b's SKU: %+v, %v; want BAD_REQUEST naming sku", res, err)
	}

	if list, err := a.Audit(ctx); err != nil || len(list) != 1 || list[0].SKU != "sku-a" {
		t.Errorf("a's audit: %+v, %v; want sku-a only", list, err)
	}
	if moved, err := a.(strategy.Ager).MakeDue(ctx, []string{"req-a1", "req-b1"}); err != nil || moved != 1 {
		t.Errorf("a.MakeDue(a1, b1): %d, %v; want 1 (b1 is b's)", moved, err)
	}
	if moved, err := b.(strategy.Ager).MakeDue(ctx, []string{"req-b1"}); err != nil || moved != 1 {
		t.Fatalf("b.MakeDue(b1): %d, %v", moved, err)
	}
	if units, err := na.(strategy.Expirer).ExpireDue(ctx); err != nil || units != 1 {
		t.Errorf("a.ExpireDue: %d, %v; want 1 (a1 only, b1 is b's)", units, err)
	}
	if r, _ := nb.Lookup(ctx, "req-b1"); r.Status != strategy.StatusHeld {
		t.Errorf("b1 after a's expiry job: %s, want HELD", r.Status)
	}
	if units, err := na.(strategy.Releaser).Release(ctx, "req-b2"); err != nil || units != 0 {
		t.Errorf("a releasing b2: %d, %v; want 0", units, err)
	}
	if moved, err := na.(strategy.Confirmer).Confirm(ctx, "req-b2", strategy.ConfirmUntilExpired); err != nil || moved {
		t.Errorf("a confirming b2: %v, %v; want not moved", moved, err)
	}
	if units, err := nb.(strategy.Expirer).ExpireDue(ctx); err != nil || units != 1 {
		t.Errorf("b.ExpireDue: %d, %v; want 1", units, err)
	}
	if x := auditOf(t, a, "sku-a"); x.Available != 2 || x.Active != 1 {
		t.Errorf("a: %+v", x)
	}
	if x := auditOf(t, b, "sku-b"); x.Available != 2 || x.Active != 1 {
		t.Errorf("b: %+v", x)
	}
}

// TestRestartAndClose: a restarted node is a new handle that sees
// everything, and the old handle answers strategy.ErrNodeClosed; a bad
// index is strategy.ErrNodeRange; a closed deployment refuses work and keeps
// its data.
func TestRestartAndClose(t *testing.T) {
	ctx := testCtx(t)
	db, _ := pgtest.Pools(t)
	dep := deploy(t, db, 2, strategy.Stock{SKU: "sku", Total: 2})
	if res, err := dep.Node(1).Reserve(ctx, request("k", "u", "sku")); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("reserve: %+v, %v", res, err)
	}
	old := dep.Node(1)
	restarter := dep.(strategy.Restarter)
	if err := restarter.Restart(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if dep.Node(1) == old {
		t.Errorf("Restart(1) kept the old node value")
	}
	if _, err := old.Lookup(ctx, "req-k"); !errors.Is(err, strategy.ErrNodeClosed) {
		t.Errorf("Lookup on the restarted node's old handle: %v, want ErrNodeClosed", err)
	}
	if res, err := dep.Node(1).Reserve(ctx, request("k", "u", "sku")); err != nil || res.Outcome != strategy.OutcomeReplay {
		t.Errorf("replay on the restarted node: %+v, %v; want REPLAY", res, err)
	}
	if err := restarter.Restart(ctx, 2); !errors.Is(err, strategy.ErrNodeRange) {
		t.Errorf("Restart(2) of 2 nodes: %v, want ErrNodeRange", err)
	}
	func() {
		defer func() {
			if err, _ := recover().(error); !errors.Is(err, strategy.ErrNodeRange) {
				t.Errorf("Node(2) of 2 nodes panicked with %v, want ErrNodeRange", err)
			}
		}()
		dep.Node(2)
	}()
	if err := dep.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := dep.Node(0).Reserve(ctx, request("k2", "u2", "sku")); !errors.Is(err, strategy.ErrNodeClosed) {
		t.Errorf("Reserve on a closed deployment: %v, want ErrNodeClosed", err)
	}
	again := deploy(t, db, 1, strategy.Stock{SKU: "sku-other", Total: 1})
	if r, err := again.Node(0).Lookup(ctx, "req-k"); err != nil || r.Status != strategy.StatusHeld {
		t.Errorf("the closed deployment's reservation: %+v, %v; want HELD", r, err)
	}
}

// TestAttach: a second deployment over stock another one loaded writes
// nothing, sells the same stock, and refuses a SKU without stock, another
// total and a database without the schema with ErrConfig.
func TestAttach(t *testing.T) {
	ctx := testCtx(t)
	db, admin := pgtest.Pools(t)
	attach := slotrows.Meta().Attach
	if _, err := attach(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: "a", Total: 1}}}); !errors.Is(err, strategy.ErrConfig) {
		t.Fatalf("Attach without the schema: %v, want ErrConfig", err)
	}
	var tables int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename LIKE 'slotrows\_%'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Errorf("Attach created %d tables", tables)
	}

	first := deploy(t, db, 2, strategy.Stock{SKU: "a", Total: 3})
	if res, err := first.Node(0).Reserve(ctx, request("k1", "u1", "a")); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("reserve: %+v, %v", res, err)
	}
	second, err := attach(ctx, strategy.Config{DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: "a", Total: 3}}})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if res, err := second.Node(1).Reserve(ctx, request("k1", "u1", "a")); err != nil || res.Outcome != strategy.OutcomeReplay {
		t.Errorf("the same request through the second process: %+v, %v; want REPLAY", res, err)
	}
	if res, err := second.Node(1).Reserve(ctx, request("k2", "u2", "a")); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Errorf("reserve through the second process: %+v, %v; want HELD", res, err)
	}
	if a := auditOf(t, first, "a"); a.Available != 1 || a.Active != 2 {
		t.Errorf("audit after both processes sold: %+v", a)
	}
	for name, stock := range map[string][]strategy.Stock{
		"sku without stock": {{SKU: "a", Total: 3}, {SKU: "never-loaded", Total: 1}},
		"other total":       {{SKU: "a", Total: 4}},
	} {
		if _, err := attach(ctx, strategy.Config{DB: db, Stock: stock}); !errors.Is(err, strategy.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
}
