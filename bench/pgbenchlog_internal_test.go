package bench

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestClosedWindowStartsWhenEveryClientHasBegun: pgbench connects its
// clients inside -T, so the window starts when the last client began its
// first transaction, not at the first line of the log; what ended before
// it, or after the window, is not counted.
func TestClosedWindowStartsWhenEveryClientHasBegun(t *testing.T) {
	dir := t.TempDir()
	// client 0 begins at 10.000000 s; client 1 only at 10.800000 s (it
	// was connecting). Each line: client txn latency_us script epoch_s us.
	log0 := "0 0 100000 0 10 100000\n0 1 100000 0 10 200000\n0 2 500000 0 11 300000\n0 3 100000 0 11 900000\n0 4 100000 0 12 000000\n"
	log1 := "1 0 100000 0 10 900000\n1 1 1000000 0 11 900000\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "log.1.0"), []byte(log0), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "log.1.1"), []byte(log1), 0o644))
	logs, err := readPgbenchLogs(dir, false)
	require.NoError(t, err)
	secs, n := logs.closedWindow(time.Second)
	// From 10.8 to 11.8: client 0's 11.3, client 1's 10.9 (11.9 is past it).
	require.InDelta(t, 1.0, secs, 1e-9)
	require.EqualValues(t, 2, n)
	// A log that stops before the window ends: the window ends with it.
	secs, n = logs.closedWindow(5 * time.Second)
	require.InDelta(t, 1.2, secs, 1e-9)
	require.EqualValues(t, 5, n)
	require.EqualValues(t, 7, logs.lat.TotalCount())
}
