package pgtest_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/pgtest"
)

// TestClockAheadServer: the server's now() runs pgtest.ClockAhead ahead of
// this process's clock. Its timeouts fire, but that much late: libfaketime
// moves the timer PostgreSQL arms by the offset (a 300 ms statement_timeout
// fired after 5.3 s), which Options.ClockAhead documents.
func TestClockAheadServer(t *testing.T) {
	if os.Getenv(pgtest.EnvDSN) != "" {
		t.Skip(pgtest.EnvDSN + " is set: the clock-ahead server needs local binaries")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgtest.ClockAheadServer(ctx)
	require.NoError(t, err)
	db := pgtest.NewDatabaseOn(t, srv)
	conn, err := pgx.Connect(ctx, db.DSN)
	require.NoError(t, err)
	defer conn.Close(ctx)
	before := time.Now()
	var now time.Time
	require.NoError(t, conn.QueryRow(ctx, `SELECT now()`).Scan(&now))
	ahead := now.Sub(before)
	require.InDelta(t, pgtest.ClockAhead.Seconds(), ahead.Seconds(), 1, "the server's clock is %v ahead", ahead)

	_, err = conn.Exec(ctx, `SET statement_timeout = '300ms'`)
	require.NoError(t, err)
	start := time.Now()
	_, err = conn.Exec(ctx, `SELECT pg_sleep(30)`)
	require.Error(t, err, "pg_sleep(30) under a 300 ms statement_timeout")
	t.Logf("the 300 ms statement_timeout fired after %v", time.Since(start))
	require.Less(t, time.Since(start), 20*time.Second, "the statement_timeout fired after %v", time.Since(start))
}
