package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// readLogs writes one pgbench log file per thread (log.1.0, log.1.1, ...)
// and reads them back. Each line: client txn latency_us script epoch_s us.
func readLogs(t *testing.T, threads ...string) *pgbenchLogs {
	t.Helper()
	dir := t.TempDir()
	for i, lines := range threads {
		require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("log.1.%d", i)), []byte(lines), 0o644))
	}
	logs, err := readPgbenchLogs(dir, false)
	require.NoError(t, err)
	return logs
}

// TestClosedWindowStartsWhenEveryClientHasBegun: pgbench connects its
// clients inside -T, so the window starts when the last client began its
// first transaction, not at the first line of the log; what ended before
// it, or after the window, is not counted.
func TestClosedWindowStartsWhenEveryClientHasBegun(t *testing.T) {
	// client 0 begins at 10.000000 s; client 1 only at 10.800000 s (it
	// was connecting).
	logs := readLogs(t,
		"0 0 100000 0 10 100000\n0 1 100000 0 10 200000\n0 2 500000 0 11 300000\n0 3 100000 0 11 900000\n0 4 100000 0 12 000000\n",
		"1 0 100000 0 10 900000\n1 1 1000000 0 11 900000\n")
	secs, n := logs.closedWindow(time.Second)
	// From 10.8 to 11.8: client 0's 11.3, client 1's 10.9 (11.9 is past it).
	require.InDelta(t, 1.0, secs, 1e-9)
	require.EqualValues(t, 2, n)
	// A log that stops before the window ends: the window ends when the
	// first client stopped (client 1 at 11.9), not with the last (12.0):
	// past -T the clients stop one by one and the rate falls.
	secs, n = logs.closedWindow(5 * time.Second)
	require.InDelta(t, 1.1, secs, 1e-9)
	require.EqualValues(t, 4, n)
	require.EqualValues(t, 7, logs.lat.TotalCount())
}

// TestClosedWindowCountsAFailedFirstTransaction: a client whose first
// transaction failed (SERIALIZABLE, tries exhausted) logged no latency, and
// began with the others; its first success, late, does not start the window.
func TestClosedWindowCountsAFailedFirstTransaction(t *testing.T) {
	// client 1 fails until 10.8 s: its first success began there.
	logs := readLogs(t,
		"0 0 100000 0 10 100000\n0 1 100000 0 10 200000\n0 2 100000 0 10 900000\n",
		"1 0 failed 0 10 150000\n1 1 failed 0 10 500000\n1 2 100000 0 10 900000\n")
	secs, n := logs.closedWindow(time.Second)
	// From client 0's 10.0 (not client 1's 10.8) to the last end, 10.9.
	require.InDelta(t, 0.9, secs, 1e-9)
	require.EqualValues(t, 4, n)
	require.EqualValues(t, 4, logs.lat.TotalCount(), "failed lines have no latency")

	// Every first transaction failed: the window starts at the first end.
	secs, n = readLogs(t, "0 0 failed 0 10 100000\n0 1 100000 0 10 400000\n").closedWindow(time.Second)
	require.InDelta(t, 0, secs, 1e-9)
	require.EqualValues(t, 0, n)
}

// TestPgbenchSeconds: -T stays the window while connecting takes at most a
// fifth of it, and grows by half again the connecting time otherwise (the
// connecting times of the 2-core machine at 8, 32 and 128 clients: 0.09 to
// 0.13 s, 0.22 to 0.44 s, 1.1 to 1.3 s).
func TestPgbenchSeconds(t *testing.T) {
	for _, tc := range []struct {
		secs    int
		connect time.Duration
		want    int
	}{
		{1, 0, 1},
		{1, 100 * time.Millisecond, 1},
		{1, 130 * time.Millisecond, 1},
		{1, 200 * time.Millisecond, 1},
		{1, 220 * time.Millisecond, 2},
		{1, 440 * time.Millisecond, 2},
		{1, 1200 * time.Millisecond, 3},
		{3, 600 * time.Millisecond, 3},
		{3, 800 * time.Millisecond, 5},
	} {
		if got := pgbenchSeconds(tc.secs, tc.connect); got != tc.want {
			t.Errorf("pgbenchSeconds(%d, %v) = %d, want %d", tc.secs, tc.connect, got, tc.want)
		}
	}
}
