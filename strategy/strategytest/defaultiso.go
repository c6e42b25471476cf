package strategytest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// A strategy written for READ COMMITTED that begins its transactions at
// the server's default level depends on a setting it does not own: a DBA's
// ALTER DATABASE ... SET default_transaction_isolation = 'repeatable read'
// (for reports that want one snapshot) gives every transaction of the
// runtime role one snapshot, taken at its first statement. A request that
// waits for a lock in that statement (pg_advisory_xact_lock) then counts
// from before the wait: the unit the holder sold still looks free.

// defaultIsolation is the default level checkAtDefaultIsolation gives the
// runtime role's connections.
const defaultIsolation = "repeatable read"

// checkAtDefaultIsolation runs checkPlainBesideSession on a pool whose
// connections default to defaultIsolation, as a database whose default a
// DBA changed would give them.
func checkAtDefaultIsolation(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := db.Config().Copy()
	cfg.MaxConns = 4
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = defaultIsolation
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("open a pool whose default isolation is %s: %v", defaultIsolation, err)
	}
	defer closeKitPool(pool)
	var got string
	if err := pool.QueryRow(ctx, `SHOW default_transaction_isolation`).Scan(&got); err != nil || got != defaultIsolation {
		t.Fatalf("the pool's default isolation is %q (%v), want %q", got, err, defaultIsolation)
	}
	checkPlainBesideSession(t, meta, pool, admin, rs)
}
