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

// TestHoldWALKeepsTheMeasurement: the WAL from where holdWAL was called is
// still there after the checkpoints that remove it without the hold
// (TestWALGoneIsMeasuredAgain, the control), and is removed once the hold
// is let go.
func TestHoldWALKeepsTheMeasurement(t *testing.T) {
	ctx := context.Background()
	_, admin := pgtest.Pools(t)
	if _, err := admin.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`); err != nil {
		t.Skipf("pg_walinspect: %v", err)
	}
	if _, err := admin.Exec(ctx, `CREATE TABLE wal_held (n int)`); err != nil {
		t.Fatal(err)
	}
	release := holdWAL(ctx, admin)
	var from string
	if err := admin.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&from); err != nil {
		t.Fatal(err)
	}
	var slots int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'reservebench_cost_%'`).Scan(&slots); err != nil || slots == 0 {
		t.Skipf("no slot held (%d, %v): a server not ours, measured without the hold", slots, err)
	}
	churn := func() {
		for i := 0; i < 4; i++ {
			for _, sql := range []string{`INSERT INTO wal_held VALUES (1)`, `SELECT pg_switch_wal()`, `CHECKPOINT`} {
				if _, err := admin.Exec(ctx, sql); err != nil {
					t.Skipf("%s: %v (a server not ours: cannot force a checkpoint)", sql, err)
				}
			}
		}
	}
	read := func() error {
		var flushes, rows int64
		return admin.QueryRow(ctx, sqlCostFromWAL, from, uint32(0), []uint32{}).Scan(&flushes, &rows)
	}
	churn()
	if err := read(); err != nil {
		t.Fatalf("the WAL under the hold, after 4 checkpoints: %v", err)
	}
	release()
	churn()
	if err := read(); !walGone(err) {
		t.Fatalf("the WAL once the hold was let go, after 4 checkpoints: %v; want it removed (the hold's slot still there?)", err)
	}
}
