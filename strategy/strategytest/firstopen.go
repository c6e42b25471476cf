package strategytest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// sqlWaitingIn counts the backends of database $1 that wait on a lock.
const sqlWaitingIn = `SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'`

// firstOpenHold bounds how long checkConcurrentFirstOpens holds the
// catalog waiting for every Open to wait behind it.
const firstOpenHold = 5 * time.Second

// firstOpens is how many deployments checkConcurrentFirstOpens opens at
// once on an empty database.
const firstOpens = 6

// checkConcurrentFirstOpens: the first Opens on an empty database may run
// at once (a service's processes starting together, or the table's
// scenarios), each with SKUs of its own, and every one of them opens.
// CREATE TABLE IF NOT EXISTS is not safe against itself: two transactions
// that both find a table missing both create it, and one fails on a
// catalog unique index (23505 on pg_type) or with 42P07. Every other Open
// of the kit finds the strategy's schema made by an earlier one, and on
// the least-privilege path Setup has made it before Open runs, so only
// this check meets a strategy that creates its schema without a lock.
func checkConcurrentFirstOpens(t tester, meta strategy.Meta, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	attachToEmpty(ctx, t, meta, admin, rs)
	cfg, drop := emptyDatabase(ctx, t, admin, "kit_first_open", "concurrent first Opens are")
	defer drop()
	name := cfg.ConnConfig.Database
	cfg.MaxConns = 2 * firstOpens
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect to the empty database: %v", err)
	}
	defer closeKitPool(db)
	// Each Open has a connection before they start, so that they reach the
	// database together.
	conns := make([]*pgxpool.Conn, firstOpens)
	for i := range conns {
		if conns[i], err = db.Acquire(ctx); err != nil {
			t.Fatalf("connect to the empty database: %v", err)
		}
	}
	for _, c := range conns {
		c.Release()
	}
	// The kit holds pg_class in SHARE mode, which every CREATE TABLE's
	// catalog insert (ROW EXCLUSIVE) waits for, until each Open waits on a
	// lock (the catalog, or an Open's own lock ahead of it), then lets them
	// all go at once: Opens that skipped a lock of their own have all
	// found the schema missing by then, and collide on the catalog
	// however the machine schedules them (without the hold, a loaded
	// machine ran them one after another and the mistake went unseen).
	gate, err := db.Begin(ctx)
	if err != nil {
		t.Fatalf("begin the catalog hold: %v", err)
	}
	defer gate.Rollback(context.Background()) //nolint:errcheck // rolled back below on the normal path
	if _, err := gate.Exec(ctx, "LOCK TABLE pg_catalog.pg_class IN SHARE MODE"); err != nil {
		t.Fatalf("hold the catalog: %v", err)
	}
	errs := make([]error, firstOpens)
	opened := make(chan struct{}, 1) // awaitAnswerOr puts back what it reads
	go func() {
		defer func() { opened <- struct{}{} }()
		Together(firstOpens, func(i int) {
			dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: kitSKU(fmt.Sprintf("first-open-%d", i)), Total: 1}}})
			if err == nil {
				err = dep.Close()
			}
			errs[i] = err
		})
	}()
	// An Open that waits where PostgreSQL cannot see it (a mutex of the
	// process) never shows as waiting: after a bound the hold is let go
	// anyway, and the Opens are judged all the same.
	waitCtx, stopWaiting := context.WithTimeout(ctx, firstOpenHold)
	err = awaitAnswerOr(waitCtx, opened, func() (bool, error) {
		var waiting int
		err := admin.QueryRow(waitCtx, sqlWaitingIn, name).Scan(&waiting)
		return waiting >= firstOpens, err
	})
	stopWaiting()
	if err != nil {
		t.Logf("not every first Open waited behind the catalog hold within %v (%v): let go anyway", firstOpenHold, err)
	}
	if err := gate.Rollback(ctx); err != nil {
		t.Fatalf("let the catalog go: %v", err)
	}
	<-opened
	var failed []string
	for i, err := range errs {
		if err != nil {
			failed = append(failed, fmt.Sprintf("Open %d: %v", i, err))
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d first Opens at once on an empty database failed (the schema must be created under a lock, or safely against itself): %s", len(failed), firstOpens, strings.Join(failed, "; "))
	}
}

// attachToEmpty: an Attach to a database where no deployment was ever
// opened is refused with ErrConfig, as one over a SKU without stock is: it
// has nothing to serve from (outsider round 49's m23 started anyway, "the
// loader has not run yet", and failed every call after). Its own empty
// database, so that an Attach that makes the schema does not make it for
// the first Opens.
func attachToEmpty(ctx context.Context, t tester, meta strategy.Meta, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	if meta.Attach == nil {
		return
	}
	cfg, drop := emptyDatabase(ctx, t, admin, "kit_attach_empty", "an Attach to an empty database is")
	defer drop()
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect to the empty database: %v", err)
	}
	defer closeKitPool(db)
	d, err := meta.Attach(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: kitSKU("attach-empty"), Total: 1}}})
	if err == nil {
		_ = d.Close()
		t.Errorf("Attach to a database where nothing was opened: no error, want strategy.ErrConfig")
	} else if !errors.Is(err, strategy.ErrConfig) {
		t.Errorf("Attach to a database where nothing was opened: %v, want strategy.ErrConfig", err)
	}
	// Refused, it wrote nothing there, its schema neither (outsider round
	// 50: an Attach that ran its CREATE TABLEs before it looked for stock).
	var tables []string
	rows, err := db.Query(ctx, `SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace ORDER BY relname`)
	if err == nil {
		tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		t.Fatalf("list what the Attach left in the empty database: %v", err)
	}
	if len(tables) > 0 {
		t.Errorf("an Attach to a database where nothing was opened left %s there; want nothing written (Open makes the schema)", strings.Join(tables, ", "))
	}
}
