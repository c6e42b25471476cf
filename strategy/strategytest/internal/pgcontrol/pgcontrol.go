// Package pgcontrol is what the fault scenarios do to a PostgreSQL server
// and ask of it besides crashing it: make COMMIT wait, and wait until the
// server has caught up with something that already happened (a client
// died, a wait was lifted), read from pg_stat_activity.
package pgcontrol

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// WithAppName adds application_name to a DSN (URL or key=value form), so
// the backends of one client can be found in pg_stat_activity.
func WithAppName(dsn, name string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		return dsn + sep + "application_name=" + name
	}
	return dsn + " application_name=" + name
}

// WaitNone polls a count (a query returning one integer) until it is 0, for
// at most 30 seconds. It orders nothing: the event already happened, and
// the server finds out at its own pace (a dead client is noticed at the
// next socket read or write, docs 20.3.1).
func WaitNone(ctx context.Context, db *pgxpool.Pool, what, countSQL string, args ...any) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := db.QueryRow(ctx, countSQL, args...).Scan(&n); err != nil {
			return fmt.Errorf("count %s: %w", what, err)
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d %s still there after 30s", n, what)
		}
		time.Sleep(20 * time.Millisecond) // paces the question; the answer decides
	}
}

// WaitBackendsGone waits until no backend with this application_name is
// left: until PostgreSQL noticed that a killed client is gone and rolled
// back its transaction.
func WaitBackendsGone(ctx context.Context, db *pgxpool.Pool, appName string) error {
	return WaitNone(ctx, db, "backends of the killed helper "+appName,
		`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, appName)
}

// WaitSyncRepIdle waits until no backend of the database waits for
// synchronous replication.
func WaitSyncRepIdle(ctx context.Context, db *pgxpool.Pool) error {
	return WaitNone(ctx, db, "backends waiting for synchronous replication", `
		SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event = 'SyncRep'`)
}

// SetSyncStandby sets synchronous_standby_names (empty: resets it) and
// waits until commits behave accordingly: a canary transaction's COMMIT
// hangs (name set) or returns (name empty). The checkpointer publishes the
// setting to committing backends after the reload, so the effect is
// observed, not assumed. admin must be a superuser pool.
func SetSyncStandby(ctx context.Context, admin *pgxpool.Pool, name string) error {
	stmt := "ALTER SYSTEM RESET synchronous_standby_names"
	if name != "" {
		stmt = "ALTER SYSTEM SET synchronous_standby_names = " + pgx.Identifier{name}.Sanitize()
	}
	if _, err := admin.Exec(ctx, stmt); err != nil {
		return fmt.Errorf("%s: %w", stmt, err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		hangs, err := canaryCommitHangs(ctx, admin)
		if err != nil {
			return err
		}
		if hangs == (name != "") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("synchronous_standby_names=%q did not take effect within 30s", name)
		}
		time.Sleep(10 * time.Millisecond) // paces the probe; the decision is the canary's
	}
}

// canaryCommitHangs commits a transaction that has an xid and wrote WAL (a
// transaction that wrote none never waits for a standby) and reports
// whether its COMMIT waited for a standby: its backend was seen in
// pg_stat_activity with wait_event SyncRep (true), or the COMMIT returned
// (false). The state decides, not a timeout, so a COMMIT that is only slow
// (a loaded machine) is not taken for one that waits.
func canaryCommitHangs(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, "SELECT pg_logical_emit_message(true, 'reservebench', 'canary')"); err != nil {
		_ = tx.Rollback(ctx)
		return false, err
	}
	pid := conn.Conn().PgConn().PID()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- tx.Commit(cctx) }()
	for {
		select {
		case err := <-done:
			return false, err
		case <-time.After(5 * time.Millisecond): // paces the probe; the decision is the backend's state
		}
		var waits bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep')`, pid).Scan(&waits); err != nil {
			cancel()
			<-done
			conn.Conn().Close(ctx)
			return false, fmt.Errorf("reading the canary's wait event: %w", err)
		}
		if waits {
			cancel()
			if err := <-done; err == nil {
				return true, nil // the cancel reached it first; it waited all the same
			}
			conn.Conn().Close(ctx) // cancelled mid-COMMIT: this connection is unusable
			return true, nil
		}
	}
}
