package slotrows_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/slotrows"
	"github.com/reservebench/reservebench/strategy"
)

// TestClaimUsesFreeSlotIndex: the claim is an index probe into the partial
// index of free slots, in the custom plan and in the generic plan a prepared
// statement falls back to, and the second probe (slots below the start) runs
// only when the first finds nothing, so a claim never locks two slots.
func TestClaimUsesFreeSlotIndex(t *testing.T) {
	ctx := testCtx(t)
	db, _ := pgtest.Pools(t)
	const sku = "sku-big"
	dep := deploy(t, db, 1, strategy.Stock{SKU: sku, Total: 5000})
	holdMany(t, dep, 1, 100, sku) // slots 1..100 taken

	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // the test writes nothing
	reservation := func(key string) int64 {
		var id int64
		if err := tx.QueryRow(ctx, slotrows.SQLInsertReservation, key, "user-"+key, sku, int64(1e6)).Scan(&id, new(any)); err != nil {
			t.Fatal(err)
		}
		return id
	}
	explain := func(analyze bool, sql string, args ...any) string {
		t.Helper()
		opts := "COSTS OFF"
		if analyze {
			opts = "ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF"
		}
		rows, err := tx.Query(ctx, "EXPLAIN ("+opts+") "+sql, args...)
		if err != nil {
			t.Fatalf("explain: %v", err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("explain: %v", err)
		}
		return strings.Join(lines, "\n")
	}
	usesFreeIndex := func(name, plan string) {
		t.Helper()
		if strings.Count(plan, "Index Scan using slotrows_slot_free") < 2 || strings.Contains(plan, "Seq Scan") {
			t.Errorf("%s: the free-slot probes do not use slotrows_slot_free:\n%s", name, plan)
		}
	}

	usesFreeIndex("custom plan", explain(false, slotrows.SQLClaimSlot, sku, 1, int64(0)))
	if _, err := tx.Exec(ctx, "PREPARE claim(text, int, bigint) AS "+slotrows.SQLClaimSlot); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	generic := explain(false, "EXECUTE claim('"+sku+"', 1, 0)")
	if !strings.Contains(generic, "sku = $1") {
		t.Errorf("not a generic plan:\n%s", generic)
	}
	usesFreeIndex("generic plan", generic)

	// Start in the middle: the first probe finds slot 2500, the second never
	// runs. Start at the top once slot 5000 is taken: the first probe finds
	// nothing, the second wraps around to the lowest free slot, 101.
	plan := explain(true, slotrows.SQLClaimSlot, sku, 2500, reservation("a"))
	if second := plan[strings.Index(plan, "InitPlan 2"):]; !strings.Contains(strings.SplitN(second, "\n", 3)[1], "never executed") {
		t.Errorf("a claim that found a slot from its start also ran the wrap-around probe:\n%s", plan)
	}
	var slot int
	for _, key := range []string{"b", "c"} {
		if err := tx.QueryRow(ctx, slotrows.SQLClaimSlot, sku, 5000, reservation(key)).Scan(&slot); err != nil {
			t.Fatal(err)
		}
	}
	if slot != 101 {
		t.Errorf("claim from 5000 with 5000 taken: slot %d, want 101 (wrapped around)", slot)
	}
}
