package strategytest

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// idMargin is how many values each sequence has left below the 4-byte
// bound when checkIdsPastInt4 begins: fewer than the attempts it sends.
const idMargin = 8

// sqlSequencesNearInt4 moves every sequence of the database that counts
// up to idMargin below the 4-byte bound, or below its own maximum when
// that is smaller, and never back.
const sqlSequencesNearInt4 = `
SELECT count(setval(s.seqrelid, greatest(coalesce(ps.last_value, s.seqstart), least(s.seqmax, 2147483647) - $1)))
FROM pg_sequence s
JOIN pg_class c ON c.oid = s.seqrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_sequences ps ON ps.schemaname = n.nspname AND ps.sequencename = c.relname
WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND s.seqincrement > 0`

// checkIdsPastInt4: a table that has lived long has large ids. Every trial
// starts on fresh tables, so an id kept in a 4-byte integer (serial, an
// int4 identity, an int4 column that holds a bigint id) never nears its
// bound, and a strategy that fails there passes every scenario, although
// every attempt takes an id (refused ones too, where the row is inserted
// first) and a busy table passes 2^31 in its life: from then on every
// Reserve fails. Here, after Open, every sequence of the database is moved
// to just below the 4-byte bound (as MakeDue stands for time, this stands
// for the table's history); then a SKU sells out, each sale followed by
// a refused attempt (KEY_REUSED, USER_LIMIT), the transitions move three
// of its reservations, and the units they gave back sell again.
func checkIdsPastInt4(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("old-tables")
	const total = 12
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: total}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	var moved int
	if err := admin.QueryRow(ctx, sqlSequencesNearInt4, idMargin).Scan(&moved); err != nil {
		t.Fatalf("moving the database's sequences near the 4-byte bound: %v", err)
	}
	t.Logf("%d sequences moved to %d below the 4-byte bound", moved, idMargin)
	node := dep.Node(0)
	req := func(i int, user string) strategy.Request {
		return strategy.Request{Key: fmt.Sprintf("kit-old-%d-%s", i, sku), User: fmt.Sprintf("kit-old-%s", user), SKU: sku, TTL: time.Hour}
	}
	want := func(r strategy.Request, outcomes ...strategy.Outcome) {
		t.Helper()
		res, err := reserveUnlessBusy(ctx, node, r)
		if err != nil || !slices.Contains(outcomes, res.Outcome) {
			t.Errorf("Reserve key %q, user %q on tables whose ids have passed the 4-byte bound: %s, %v; want %v", r.Key, r.User, res.Outcome, err, outcomes)
		}
	}
	for i := range total {
		want(req(i, fmt.Sprint(i)), strategy.OutcomeHeld)
		want(req(i, fmt.Sprintf("%d-other", i)), strategy.OutcomeKeyReused)
		if i < total-1 {
			want(req(total+i, fmt.Sprint(i)), strategy.OutcomeUserLimit)
		} else { // sold out: either refusal is right
			want(req(total+i, fmt.Sprint(i)), strategy.OutcomeUserLimit, strategy.OutcomeSoldOut)
		}
	}
	want(req(3*total, "late"), strategy.OutcomeSoldOut)
	freed := 0
	if r, ok := node.(strategy.Releaser); ok {
		if n, err := r.Release(ctx, req(0, "0").Key); err != nil || n != 1 {
			t.Errorf("Release on tables whose ids have passed the 4-byte bound: %d, %v; want 1", n, err)
		} else {
			freed++
		}
	}
	if c, ok := node.(strategy.Confirmer); ok {
		if moved, err := c.Confirm(ctx, req(1, "1").Key, strategy.ConfirmBeforeExpiry); err != nil || !moved {
			t.Errorf("Confirm on tables whose ids have passed the 4-byte bound: %v, %v; want true", moved, err)
		}
	}
	ager, isAger := dep.(strategy.Ager)
	expirer, isExpirer := node.(strategy.Expirer)
	if isAger && isExpirer {
		if n, err := ager.MakeDue(ctx, []string{req(2, "2").Key}); err != nil || n != 1 {
			t.Fatalf("MakeDue: %d, %v; want 1", n, err)
		}
		if n, err := expirer.ExpireDue(ctx); err != nil || n != 1 {
			t.Errorf("ExpireDue on tables whose ids have passed the 4-byte bound: %d, %v; want 1", n, err)
		} else {
			freed++
		}
	}
	for i := range freed {
		want(req(4*total+i, fmt.Sprintf("again-%d", i)), strategy.OutcomeHeld)
	}
	list, err := dep.Audit(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("Audit: %+v, %v", list, err)
	}
	if a := list[0]; a.Active != total || a.Available != 0 || a.Drift() != 0 {
		t.Errorf("Audit on tables whose ids have passed the 4-byte bound: %+v; want all %d units active", a, total)
	}
}
