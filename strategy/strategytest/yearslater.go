package strategytest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// yearsLater is how far checkYearsLater moves a deployment's stored times
// into the past: past every TTL (strategy.MaxTTL), and past every window a
// strategy might think old enough to forget ("a hold lives at most a day",
// "a week", "a quarter's order history", "a year").
const yearsLater = 1000 * 24 * time.Hour

// checkYearsLater: what a deployment stored keeps its meaning when it is
// old. A SKU of 3 units sells one unit that is paid for (CONFIRMED), one
// that is held, one that is released (a strategy without Confirm or
// Release leaves those HELD); then every time stored in the
// database for that SKU (each row whose text holds the SKU's name: its
// reservations, its stock, a sales log) moves 1,000 days into the past,
// as the passing of nearly three years would leave it, and node 0 restarts (where survives-restart
// is claimed) and runs the expiry job. Every old key is still its own
// (REPLAY for its user, and Lookup finds it), whatever the strategy can
// do; the paid unit must stay sold: two more sell, no more (without an
// expiry job, between the released units and those no payment holds).
//
// Every scenario ends within minutes of its first sale, so a strategy that
// reads only recent rows ("a hold lives at most a day: recount the last
// 48 hours of the sales log on restart", "purge ended rows older than a
// week", "Lookup serves the last 90 days; older orders are the history
// service's") passed them all. Redis keeps its own clock: only PostgreSQL is
// aged here (the Redis jump of redisjump.go moves Redis's).
func checkYearsLater(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "years-later", 3)
	defer dep.Close()
	node := dep.Node(0)
	confirmer, canConfirm := node.(strategy.Confirmer)
	releaser, canRelease := node.(strategy.Releaser)
	req := func(i int) strategy.Request {
		return strategy.Request{Key: fmt.Sprintf("kit-years-%d-%s", i, sku), User: fmt.Sprintf("kit-years-user-%d", i), SKU: sku, TTL: time.Hour}
	}
	for i := 1; i <= 3; i++ {
		if res, err := reserveUnlessBusy(ctx, node, req(i)); err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Fatalf("Reserve %d of 3 units: %s, %v; want HELD", i, res.Outcome, err)
		}
	}
	// The statuses Lookup must find 1,000 days later ("" where the job may
	// or may not have moved a HELD row).
	wantStatus := []strategy.Status{"", "", ""}
	if canConfirm {
		if ok, err := confirmer.Confirm(ctx, req(1).Key, strategy.ConfirmUntilExpired); err != nil || !ok {
			t.Fatalf("Confirm %q: %v, %v; want true", req(1).Key, ok, err)
		}
		wantStatus[0] = strategy.StatusConfirmed
	}
	if canRelease {
		if n, err := releaser.Release(ctx, req(3).Key); err != nil || n != 1 {
			t.Fatalf("Release %q: %d, %v; want 1", req(3).Key, n, err)
		}
		wantStatus[2] = strategy.StatusReleased
	}

	aged, err := ageRowsOf(ctx, admin, sku, yearsLater)
	if err != nil {
		t.Fatalf("age the SKU's rows: %v", err)
	}
	if aged == 0 {
		t.Skip("no row of the database names the SKU with a time in it: nothing to age")
	}
	if r, ok := dep.(strategy.Restarter); ok && meta.Claims.Has(strategy.SurvivesRestart) {
		if err := r.Restart(ctx, 0); err != nil {
			t.Fatalf("Restart of node 0 1,000 days later: %v", err)
		}
		node = dep.Node(0)
	}
	e, expires := node.(strategy.Expirer)
	if expires {
		if _, err := e.ExpireDue(ctx); err != nil {
			t.Fatalf("ExpireDue 1,000 days later: %v", err)
		}
	}
	for i := 1; i <= 3; i++ {
		if res, err := reserveUnlessBusy(ctx, node, req(i)); err != nil || res.Outcome != strategy.OutcomeReplay {
			t.Errorf("1,000 days later, %q sent again by its user: %s, %v; want REPLAY (a key is its reservation's for good)", req(i).Key, res.Outcome, err)
		}
	}
	for i, want := range wantStatus {
		got, err := node.Lookup(ctx, req(i+1).Key)
		switch {
		case err != nil || got.Status == strategy.StatusNotFound:
			t.Errorf("1,000 days later, Lookup of %q: %s, %v; want its reservation (a key is its reservation's for good)", req(i+1).Key, got.Status, err)
		case want != "" && got.Status != want:
			t.Errorf("1,000 days later, Lookup of %q: %s; want %s", req(i+1).Key, got.Status, want)
		}
	}
	held := 0
	for i := 4; i <= 7; i++ {
		res, err := reserveUnlessBusy(ctx, node, req(i))
		if err != nil {
			t.Fatalf("1,000 days later, Reserve %q: %v", req(i).Key, err)
		}
		if res.Outcome == strategy.OutcomeHeld {
			held++
		}
	}
	// The units free now: every one no payment holds, once the job has
	// run; without a job, at least the released one (a strategy may
	// expire due holds as it sells, or never).
	most := 3
	if canConfirm {
		most--
	}
	least := most
	if !expires {
		least = 0
		if canRelease {
			least = 1
		}
	}
	if held < least || held > most {
		t.Errorf("1,000 days later (%d rows aged 1,000 days, node 0 restarted where it claims to survive it, the expiry job run if it has one), 4 new buyers of a SKU of 3 (paid for: %d, released: %d): %d HELD; want %s (a unit paid for is sold for good, a released one is back, a hold past its expiry is back once the job runs)",
			aged, map[bool]int{true: 1}[canConfirm], map[bool]int{true: 1}[canRelease], held, map[bool]string{true: fmt.Sprint(most), false: fmt.Sprintf("%d to %d", least, most)}[least == most])
	}
	list, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	for _, a := range list {
		if a.Active > a.Total {
			t.Errorf("Audit of %s 1,000 days later: %d active of %d", a.SKU, a.Active, a.Total)
		}
	}
}

// ageRowsOf moves back by d every time stored (timestamptz, timestamp,
// date) in the rows of schema public's tables whose text holds sku, and
// returns how many rows it changed.
func ageRowsOf(ctx context.Context, admin *pgxpool.Pool, sku string, d time.Duration) (int64, error) {
	rows, err := admin.Query(ctx, `
		SELECT c.table_name, array_agg(c.column_name::text ORDER BY c.ordinal_position)
		FROM information_schema.columns c JOIN information_schema.tables t USING (table_schema, table_name)
		WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE'
		  AND c.data_type IN ('timestamp with time zone', 'timestamp without time zone', 'date')
		GROUP BY 1 ORDER BY 1`)
	if err != nil {
		return 0, err
	}
	type table struct {
		name    string
		columns []string
	}
	tables, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (table, error) {
		var tb table
		err := r.Scan(&tb.name, &tb.columns)
		return tb, err
	})
	if err != nil {
		return 0, err
	}
	var n int64
	err = pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
		for _, tb := range tables {
			name := pgx.Identifier{tb.name}.Sanitize()
			var set []string
			for _, c := range tb.columns {
				col := pgx.Identifier{c}.Sanitize()
				set = append(set, fmt.Sprintf("%s = %s - $2::interval", col, col))
			}
			tag, err := tx.Exec(ctx, fmt.Sprintf("UPDATE %s AS r SET %s WHERE strpos(r::text, $1) > 0", name, strings.Join(set, ", ")),
				sku, fmt.Sprintf("%d seconds", int64(d/time.Second)))
			if err != nil {
				return fmt.Errorf("age %s: %w", tb.name, err)
			}
			n += tag.RowsAffected()
		}
		return nil
	})
	return n, err
}
