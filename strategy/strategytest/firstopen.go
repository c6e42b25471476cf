package strategytest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

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
	name := "kit_first_open_" + randomID() // [a-z0-9_]: no quoting needed
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE template0"); err != nil {
		t.Fatalf("create an empty database: %v", err)
	}
	defer func() {
		if _, err := admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop the empty database %s: %v", name, err)
		}
	}()
	cfg := admin.Config().Copy()
	cfg.ConnConfig.Database = name
	cfg.MaxConns = 2 * firstOpens
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect to the empty database: %v", err)
	}
	defer db.Close()
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
	errs := make([]error, firstOpens)
	Together(firstOpens, func(i int) {
		dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: kitSKU(fmt.Sprintf("first-open-%d", i)), Total: 1}}})
		if err == nil {
			err = dep.Close()
		}
		errs[i] = err
	})
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
