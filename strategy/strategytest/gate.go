package strategytest

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A race bug shows only when two calls fall into one short window: two
// inserts of one key both pass the arbiter's pre-check before either writes
// its index entry (the seed's intermittent USER_LIMIT), two expiry jobs both
// read the due ids before either commits. Goroutines released together hit
// such a window by luck, in some trials. The gate makes it the rule: the
// harness locks every table of the strategy's schema (ACCESS EXCLUSIVE, in
// a transaction of its own), starts the calls, waits until they queue on
// that lock, read from the server's lock waits the way PostgreSQL's
// isolation tester reads them, and then rolls back: every queued statement is granted
// its lock at once and they run side by side from the same instant.
//
// The gate only provokes orderings. No verdict depends on it: a check
// judges the history and the durable state whatever the interleaving was.
// When the calls stop joining the queue (some answer from memory, some
// wait in the strategy for one another rather than for the gate) the gate
// opens once the count of waiters stops growing: that pause paces the
// provocation, it orders nothing a check relies on.

// gateSettle is how long the count of calls queued on the gate may stay
// unchanged, with calls still outside it, before the gate opens anyway.
const gateSettle = 15 * time.Millisecond

// gateMax bounds how long the gate stays closed.
const gateMax = 3 * time.Second

// concurrently runs f(0), ..., f(n-1) at once: behind the gate when the
// scenario asks for it, else released together (Together).
func (t *trial) concurrently(ctx context.Context, n int, f func(i int)) error {
	if !t.in.Gate {
		Together(n, f)
		return nil
	}
	return t.gated(ctx, n, f, gateOptions{})
}

// gateOptions change what a round behind the gate does.
type gateOptions struct {
	// hold keeps the gate closed this long after every call has queued on
	// it: a transaction that holds the strategy's tables for a while (a
	// migration, a long report), which a strategy must wait out or answer
	// BUSY, never SOLD_OUT while units remain. It is the fault itself, not
	// a wait for an ordering.
	hold time.Duration
}

// gated runs f(0..n-1) behind the gate.
func (t *trial) gated(ctx context.Context, n int, f func(i int), opt gateOptions) error {
	tables, err := t.tablesToGate(ctx)
	if err != nil {
		return err
	}
	if len(tables) == 0 { // nothing in the database to queue on (a strategy that keeps no tables)
		Together(n, f)
		return nil
	}
	conn, err := t.env.Admin.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("gate: %w", err)
	}
	defer conn.Release()
	// One round trip closes the gate (a query without arguments goes as a
	// simple query, statements and all): table 28-1 runs some 12,000 gated
	// rounds, and BEGIN, SET and LOCK one by one were a tenth of its
	// statements. Opening it is a ROLLBACK, on every path: here when no
	// other path did.
	tx := &gateTx{conn: conn}
	defer func() {
		if !tx.open {
			conn.Exec(context.Background(), "ROLLBACK") //nolint:errcheck // a warning outside a transaction
		}
	}()
	if _, err := conn.Exec(ctx, "BEGIN; SET LOCAL lock_timeout = '10s'; LOCK TABLE "+strings.Join(tables, ", ")+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		return fmt.Errorf("gate: lock the strategy's tables: %w", err)
	}
	gatePID := conn.Conn().PgConn().PID()

	var finished atomic.Int64
	done := make(chan struct{})
	var box panicBox
	defer box.rethrow() // after every return below has waited for done
	go func() {
		defer close(done)
		defer box.catch()
		Together(n, func(i int) {
			defer finished.Add(1)
			f(i)
		})
	}()

	start, lastChange, last := time.Now(), time.Now(), -1
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		// A tick first: the calls were started just now, and a count taken
		// at once finds none of them queued yet (one wasted round trip
		// per gate, and the table opens some 10,000 gates).
		select {
		case <-done: // every call finished without reaching the gate
			return nil
		case <-tick.C:
		}
		var queued int
		// While the gate is closed nothing else runs in this database, so
		// every lock wait in it is the gate's doing: a call queued on the
		// gate itself, or one queued behind a call that is (a per-SKU
		// advisory lock taken before the first table is touched).
		if err := t.env.Admin.QueryRow(ctx, sqlQueuedOnGate, gatePID).Scan(&queued); err != nil {
			_ = tx.Rollback(ctx)
			<-done
			return fmt.Errorf("gate: count the calls queued on it: %w", err)
		}
		if queued != last {
			last, lastChange = queued, time.Now()
		}
		outside := n - int(finished.Load()) - queued
		if outside <= 0 || time.Since(lastChange) >= gateSettle && queued > 0 || time.Since(start) > gateMax {
			break
		}
	}
	t.vary("calls queued on the gate when it opened", last)
	if opt.hold > 0 {
		hold := time.NewTimer(opt.hold)
		select {
		case <-hold.C:
		case <-done:
			hold.Stop()
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		<-done
		return fmt.Errorf("gate: open: %w", err)
	}
	<-done
	return nil
}

// sqlQueuedOnGate counts the backends of this database, the gate's own
// excepted ($1), that wait for a heavyweight lock: what pg_stat_activity
// says in wait_event_type = 'Lock', read through the functions under that
// view, because the view clips every backend's query text on each read
// (0.52 ms a read with 450 connections open, against 0.16 ms here), and
// the table reads this count some 20,000 times.
const sqlQueuedOnGate = `
SELECT count(*) FROM pg_stat_get_backend_idset() AS b(id)
WHERE pg_stat_get_backend_dbid(b.id) = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND pg_stat_get_backend_pid(b.id) <> $1
  AND pg_stat_get_backend_wait_event_type(b.id) = 'Lock'`

// gateTx opens the gate: the ROLLBACK of its transaction.
type gateTx struct {
	conn *pgxpool.Conn
	open bool // rolled back: the gate is open
}

func (g *gateTx) Rollback(ctx context.Context) error {
	_, err := g.conn.Exec(ctx, "ROLLBACK")
	g.open = err == nil
	return err
}

// tablesToGate lists the tables the gate locks once per trial.
func (t *trial) tablesToGate(ctx context.Context) ([]string, error) {
	t.gateMu.Lock()
	defer t.gateMu.Unlock()
	if t.gateTables != nil {
		return t.gateTables, nil
	}
	tx, err := t.env.Admin.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("gate: %w", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // read only
	tables, err := gateTables(ctx, tx)
	if err != nil {
		return nil, err
	}
	t.gateTables = append([]string{}, tables...)
	return t.gateTables, nil
}

// gateTables lists the ordinary tables of the database's own schemas,
// quoted: the strategy's tables, whatever it calls them.
func gateTables(ctx context.Context, tx pgx.Tx) ([]string, error) {
	rows, err := tx.Query(ctx, `
		SELECT format('%I.%I', n.nspname, c.relname)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'
		ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("gate: list tables: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
