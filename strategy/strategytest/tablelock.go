package strategytest

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// tableLockRequest is an admin transaction's request for a table in ACCESS
// EXCLUSIVE mode, granted or queued behind whoever holds the table: every
// statement that touches the table after it waits behind it. The checks
// use it to stop a call between two of its reads while an attempt commits.
type tableLockRequest struct {
	pid    int32 // the admin backend: a call waiting behind it is blocked by it
	table  string
	conn   *pgxpool.Conn
	tx     pgx.Tx
	locked chan error
}

// requestTableLock asks for table and returns once the request is granted
// or queued (seen in pg_locks).
func requestTableLock(ctx context.Context, admin *pgxpool.Pool, table string) (*tableLockRequest, error) {
	conn, err := admin.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	r := &tableLockRequest{table: table, conn: conn, locked: make(chan error, 1)}
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&r.pid); err != nil {
		conn.Release()
		return nil, err
	}
	if r.tx, err = conn.Begin(ctx); err != nil {
		conn.Release()
		return nil, err
	}
	go func() {
		_, err := r.tx.Exec(ctx, "LOCK TABLE "+table+" IN ACCESS EXCLUSIVE MODE")
		r.locked <- err
	}()
	if err := awaitAnswerOr(ctx, r.locked, func() (bool, error) {
		var n int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE pid = $1 AND locktype = 'relation' AND mode = 'AccessExclusiveLock' AND relation = $2::regclass`, r.pid, table).Scan(&n)
		return n > 0, err
	}); err != nil {
		r.close(ctx)
		return nil, err
	}
	return r, nil
}

// letGo waits until the lock is granted (whoever held the table has
// finished) and ends the admin transaction, so that what waited behind it
// goes on.
func (r *tableLockRequest) letGo(ctx context.Context) error {
	if err := <-r.locked; err != nil {
		return fmt.Errorf("LOCK TABLE %s: %w", r.table, err)
	}
	return r.tx.Rollback(ctx)
}

// close ends the request however the check went; safe after letGo.
func (r *tableLockRequest) close(ctx context.Context) {
	_ = r.tx.Rollback(context.WithoutCancel(ctx))
	r.conn.Release()
}
