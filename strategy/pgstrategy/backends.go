package pgstrategy

import (
	"context"
	"fmt"
	"time"
)

// sqlBackendsBusy tells whether any of the backends is still in a
// transaction. A pid that is gone, or back idle in a pool, has ended its
// transaction; a pid taken again by another connection only delays the
// answer.
const sqlBackendsBusy = `
SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = ANY($1::int4[]) AND state IS DISTINCT FROM 'idle')`

// backendsPoll paces AwaitBackendsDone's reads.
const backendsPoll = 5 * time.Millisecond

// AwaitBackendsDone waits until none of the backends pids is in a
// transaction. A node that recounts its stock from the rows at a restart
// first waits for the backends of the requests whose outcome it does not
// know (the client gave up, the connection broke after the statement was
// sent): such a backend may still commit its row, and a recount that ran
// before would count that row's unit free and sell it again. The wait is
// as long as the backends take (bounded by ctx); PostgreSQL has no lock
// that a plain INSERT's backend holds for its whole life and that another
// could wait on instead, so it polls pg_stat_activity.
func AwaitBackendsDone(ctx context.Context, q Querier, pids []int32) error {
	if len(pids) == 0 {
		return nil
	}
	if err := pollUntilFalse(ctx, q, sqlBackendsBusy, pids); err != nil {
		return fmt.Errorf("wait for the backends %v of requests of unknown outcome: %w", pids, err)
	}
	return nil
}

// pollUntilFalse runs the query, whose one row is one boolean, every
// backendsPoll until it reads false.
func pollUntilFalse(ctx context.Context, q Querier, sql string, args ...any) error {
	tick := time.NewTicker(backendsPoll)
	defer tick.Stop()
	for {
		var busy bool
		if err := q.QueryRow(ctx, sql, args...).Scan(&busy); err != nil {
			return err
		}
		if !busy {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// sqlTableWriters lists the backends, other than this one, running a
// statement of a transaction that has written to table $1 (each holds the
// RowExclusiveLock every INSERT, UPDATE and DELETE takes until its
// transaction ends), with their transaction's start.
const sqlTableWriters = `
SELECT a.pid, a.xact_start
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.relation = to_regclass($1) AND l.mode = 'RowExclusiveLock' AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND a.state = 'active' AND a.xact_start IS NOT NULL AND a.pid <> pg_backend_pid()`

// sqlWritersBusy tells whether any of the transactions (pid, start) is
// still running a statement.
const sqlWritersBusy = `
SELECT EXISTS (SELECT 1 FROM pg_stat_activity a JOIN unnest($1::int4[], $2::timestamptz[]) AS w (pid, xact_start)
               ON a.pid = w.pid AND a.xact_start = w.xact_start
               WHERE a.state = 'active')`

// AwaitWritersDone waits until every statement that was running, when it
// was called, in a transaction that had written to table has ended. A
// process that recounts stock from the rows when it starts (Meta.Attach
// after its predecessor died) first waits for them: a predecessor's request
// whose client is gone may still be at its COMMIT, and a recount before it
// lands counts that row's unit free. Transactions idle between statements
// are not waited for: a dead client sends no COMMIT, and its backend rolls
// back once it reads the closed socket. Not covered: a statement that had
// not yet opened the table when the list was read (sent a moment before
// its client died); a successor starting a process later is well past it.
func AwaitWritersDone(ctx context.Context, q Querier, table string) error {
	rows, err := q.Query(ctx, sqlTableWriters, table)
	if err != nil {
		return fmt.Errorf("list the statements writing to %s: %w", table, err)
	}
	var pids []int32
	var starts []time.Time
	for rows.Next() {
		var pid int32
		var start time.Time
		if err := rows.Scan(&pid, &start); err != nil {
			rows.Close()
			return fmt.Errorf("list the statements writing to %s: %w", table, err)
		}
		pids, starts = append(pids, pid), append(starts, start)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("list the statements writing to %s: %w", table, err)
	}
	if len(pids) == 0 {
		return nil
	}
	if err := pollUntilFalse(ctx, q, sqlWritersBusy, pids, starts); err != nil {
		return fmt.Errorf("wait for the statements of backends %v writing to %s: %w", pids, table, err)
	}
	return nil
}
