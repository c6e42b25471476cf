package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkAuditOneSnapshot: Audit reads the stock and the reservations as of
// one moment. An Audit of two statements outside a transaction (the stock,
// then a GROUP BY of the reservations: "cheaper for the dashboard that
// polls it") reads them in two snapshots, and a sale that commits between
// the two is counted active but not yet taken from the stock: drift that is
// not there, or a real drift hidden. Every Audit of the kit runs when
// nothing else does. Here, for each of the database's tables in turn, an
// attempt held open holds a sale (without attempts held open, a plain
// request held at its COMMIT, its writes done, by a deferred trigger on
// its rows: holdCommitNaming; outsider round 28b's m15, an Audit of two
// reads in a strategy without sessions, skipped this check and passed
// everything); an admin transaction asks for the table
// in ACCESS EXCLUSIVE mode (queued behind the attempt, if it wrote there);
// Audit starts and is seen waiting behind that request (pg_blocking_pids),
// having read whatever it reads first; the attempt commits and the admin
// lets go. The audit must balance: the sale is in it whole, or not at all.
// Only for a strategy whose whole state is in PostgreSQL: a counter in a
// node or in Redis is taken before the commit, and may rightly differ
// from the rows for that moment.
func checkAuditOneSnapshot(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	if len(rs) > 0 {
		t.Skip("keeps state outside PostgreSQL: its audit may rightly see a unit in flight")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("audit-snapshot")
	const total = 5
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: total}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	if _, inMemory := dep.(strategy.ReserveCrasher); inMemory {
		t.Skip("counts stock in a node's memory: its audit may rightly see a unit in flight")
	}
	opener, sessions := dep.Node(0).(strategy.SessionOpener)
	list, err := admin.Begin(ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	tables, err := gateTables(ctx, list)
	_ = list.Rollback(ctx)
	if err != nil {
		t.Fatalf("%v", err)
	}
	for i, table := range tables {
		req := strategy.Request{Key: fmt.Sprintf("kit-audit-%d-%s", i, sku), User: fmt.Sprintf("kit-audit-%d", i), SKU: sku, TTL: time.Hour}
		var commit func(context.Context) error
		var abandon func()
		if sessions {
			session, _ := holdInSession(ctx, t, opener, req, "a sale held open")
			commit = func(ctx context.Context) error {
				if err := session.Commit(ctx); err != nil && !abortedByConflict(err) {
					return fmt.Errorf("commit of the sale: %w", err)
				}
				return nil
			}
			abandon = func() { _ = session.Rollback(ctx) }
		} else {
			sale := holdSaleAtCommit(ctx, t, admin, dep.Node(0), req)
			commit, abandon = sale.commit, func() { sale.remove(t) }
		}
		a, blocked, err := auditBehindTableLock(ctx, dep, admin, commit, table)
		abandon()
		if err != nil {
			t.Fatalf("Audit while a sale commits, %s held: %v", table, err)
		}
		for _, st := range a {
			if st.SKU == sku && (st.Drift() != 0 || st.Active > st.Total) {
				t.Errorf("an Audit that waited for %s while a sale committed (seen waiting: %v): total %d, available %d, active %d; want them to balance (one snapshot)",
					table, blocked, st.Total, st.Available, st.Active)
			}
		}
		if i+1 >= total {
			break // the SKU is sold out; no strategy has this many tables
		}
	}
}

// auditBehindTableLock runs Audit behind an admin's request for table in
// ACCESS EXCLUSIVE mode while a sale is held before its commit, commits it
// once Audit waits (or has answered), and returns Audit's answer and
// whether it was seen waiting.
func auditBehindTableLock(ctx context.Context, dep strategy.Deployment, admin *pgxpool.Pool, commit func(context.Context) error, table string) ([]strategy.StockAudit, bool, error) {
	lock, err := requestTableLock(ctx, admin, table)
	if err != nil {
		return nil, false, err
	}
	defer lock.close(ctx)
	type audited struct {
		list []strategy.StockAudit
		err  error
	}
	done := make(chan audited, 1)
	go func() {
		l, err := dep.Audit(ctx)
		done <- audited{l, err}
	}()
	blocked, err := awaitAnswerOrBlocked(ctx, admin, lock.pid, done)
	if err != nil {
		return nil, false, err
	}
	if err := commit(ctx); err != nil {
		return nil, blocked, err
	}
	if err := lock.letGo(ctx); err != nil {
		return nil, blocked, err
	}
	a := <-done
	return a.list, blocked, a.err
}
