package pgstrategy_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestAwaitWritersDone: a statement running in a transaction that wrote to
// the table is waited for; a transaction idle between statements, and a
// writer of another table, are not.
func TestAwaitWritersDone(t *testing.T) {
	db, admin := pgtest.Pools(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, sql := range []string{`CREATE TABLE sales (x int)`, `CREATE TABLE other (x int)`} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	writer := func(table string) *pgxpool.Conn {
		c, err := db.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = c.Exec(context.Background(), "ROLLBACK"); c.Release() })
		if _, err := c.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
			t.Fatal(err)
		}
		return c
	}
	writer("sales") // idle in transaction: not waited for
	if err := pgstrategy.AwaitWritersDone(ctx, db, "sales"); err != nil {
		t.Fatalf("with a writer idle in its transaction: %v, want nil at once", err)
	}

	// Two writers, of sales and of other, each running a statement held
	// on an advisory lock the admin takes first.
	holder, err := admin.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock(42)"); err != nil {
		t.Fatal(err)
	}
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			if _, err := holder.Exec(context.Background(), "SELECT pg_advisory_unlock(42)"); err != nil {
				t.Error(err)
			}
		}
	}
	defer unlock()
	done := make(chan error, 2)
	for _, table := range []string{"sales", "other"} {
		c := writer(table)
		go func() {
			_, err := c.Exec(ctx, "SELECT pg_advisory_xact_lock_shared(42)")
			done <- err
		}()
	}
	for {
		var waiting int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting == 2 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the writers were never seen waiting on the advisory lock")
		}
	}
	short, shortCancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = pgstrategy.AwaitWritersDone(short, db, "sales")
	shortCancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("with a writer of sales running a statement: %v, want it to wait (until the deadline)", err)
	}
	// The writer of other, running too, holds back no wait for another table.
	if err := pgstrategy.AwaitWritersDone(ctx, db, "nothing_writes_here"); err != nil {
		t.Errorf("a table nobody writes (or that does not exist): %v, want nil", err)
	}

	// Once the statements end (their transactions stay open), the wait ends.
	waited := make(chan error, 1)
	go func() { waited <- pgstrategy.AwaitWritersDone(ctx, db, "sales") }()
	unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Errorf("once the writer's statement ended: %v, want nil", err)
	}
}
