package strategytest

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// checkLeftOpenName names checkLeftOpen's verdict, which the deployment
// contract reaches after each of its checks.
const checkLeftOpenName = "checkLeavesNoTransactionOpen"

// leftOpenFor is how long a transaction idle between its statements must
// stay so, unchanged, once a check has ended and closed its deployments,
// before the kit counts it left open: a call in flight is never idle that
// long, a transaction nobody will end stays so for good.
const leftOpenFor = 2 * time.Second

// sqlIdleInTransaction lists the backends of database $1, but the asking
// one, idle inside a transaction, with the moment their state began.
const sqlIdleInTransaction = `
	SELECT pid, state_change, left(query, 120)
	FROM pg_stat_activity
	WHERE datname = $1 AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'`

// checkLeftOpen, after each check of the deployment contract: no backend
// of the database is left idle in a transaction. A call that begins a
// transaction and returns on some path without ending it (no deferred
// Rollback; a Session whose Rollback does nothing after a failed
// statement) keeps its connection, and every lock it took, for good:
// every later check that touches those rows waits until its own deadline,
// and the contract hung for many minutes instead of naming the call
// (outsider round 53's b30 and b31). The kit ends such a backend
// (pg_terminate_backend) once it has reported it, so that the checks after
// it run.
func (t *trial) checkLeftOpen(ctx context.Context, after string) error {
	type idle struct {
		since time.Time
		query string
	}
	database := t.env.DB.Config().ConnConfig.Database
	read := func() (map[int32]idle, error) {
		rows, err := t.env.Admin.Query(ctx, sqlIdleInTransaction, database)
		if err != nil {
			return nil, fmt.Errorf("read the transactions left open: %w", err)
		}
		defer rows.Close()
		out := map[int32]idle{}
		for rows.Next() {
			var pid int32
			var it idle
			if err := rows.Scan(&pid, &it.since, &it.query); err != nil {
				return nil, err
			}
			out[pid] = it
		}
		return out, rows.Err()
	}
	first, err := read()
	if err != nil || len(first) == 0 {
		return err
	}
	// Polled: each that ends or moves on is let go at once.
	deadline := time.Now().Add(leftOpenFor)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for len(first) > 0 && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		now, err := read()
		if err != nil {
			return err
		}
		for pid, it := range first {
			if again, ok := now[pid]; !ok || !again.since.Equal(it.since) {
				delete(first, pid)
			}
		}
	}
	var left []string
	for pid, it := range first {
		left = append(left, fmt.Sprintf("backend %d, idle in a transaction since %s, its last statement %q", pid, it.since.Format("15:04:05.000"), it.query))
		if _, err := t.env.Admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			return fmt.Errorf("end backend %d left open: %w", pid, err)
		}
	}
	if len(left) > 0 {
		t.checkNamed(checkLeftOpenName, Base, "every call ends the transactions it began: once a check has ended, no backend of the database is left idle in a transaction",
			false, fmt.Sprintf("after %s: %s (ended by the kit, so that the next checks run)", after, strings.Join(left, "; ")), noRequest)
	}
	return nil
}
