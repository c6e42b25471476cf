package compare

import (
	"context"
	"testing"

	"github.com/reservebench/reservebench/pgtest"
)

// TestWALGoneIsMeasuredAgain: the error the cost's WAL read meets when a
// checkpoint has removed the segment it starts in is the one walGone
// knows, so measureCost's caller measures again instead of writing an
// "unmeasured" cell into the table.
func TestWALGoneIsMeasuredAgain(t *testing.T) {
	ctx := context.Background()
	_, admin := pgtest.Pools(t)
	if _, err := admin.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`); err != nil {
		t.Skipf("pg_walinspect: %v", err)
	}
	var from string
	if err := admin.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&from); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `CREATE TABLE wal_gone (n int)`); err != nil {
		t.Fatal(err)
	}
	// Move past the segment and checkpoint until it is gone: a server
	// keeps no WAL for its own sake past two checkpoints.
	for i := 0; i < 4; i++ {
		for _, sql := range []string{`INSERT INTO wal_gone VALUES (1)`, `SELECT pg_switch_wal()`, `CHECKPOINT`} {
			if _, err := admin.Exec(ctx, sql); err != nil {
				t.Skipf("%s: %v (a server not ours: cannot force a checkpoint)", sql, err)
			}
		}
	}
	var flushes, rows int64
	err := admin.QueryRow(ctx, sqlCostFromWAL, from, uint32(0), []uint32{}).Scan(&flushes, &rows)
	if err == nil {
		t.Skip("the server kept the WAL (wal_keep_size or a replication slot)")
	}
	if !walGone(err) {
		t.Fatalf("reading removed WAL: %v; walGone does not know it", err)
	}
}
