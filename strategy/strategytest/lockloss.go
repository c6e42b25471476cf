package strategytest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/redistest"
	"github.com/reservebench/reservebench/strategy"
)

// lockLossLease is the lease checkLockLostWhileWorking asks for
// (strategy.Config.LockLease): a watchdog that renews every third of it
// meets the loss within a few hundred milliseconds.
const lockLossLease = 300 * time.Millisecond

// lockOf is the lock a reservation of sku takes on node (a
// strategy.LockTaker) and the address of the server it lives on; it skips
// t for a node that takes no such lock.
func lockOf(t tester, node strategy.Strategy, rs map[strategy.Resource]string, sku string) (strategy.LockInfo, string) {
	t.Helper()
	taker, ok := node.(strategy.LockTaker)
	if !ok {
		t.Skip("takes no lock outside PostgreSQL (strategy.LockTaker)")
	}
	info := taker.LockOf(sku)
	addr, ok := rs[info.Resource]
	if !ok {
		t.Fatalf("the lock lives in %q, which the strategy does not declare in Meta.Needs", info.Resource)
	}
	return info, addr
}

// checkLockLostWhileWorking: a request holding its SKU's lock (a
// strategy.LockTaker) is made to wait in PostgreSQL behind a transaction
// that holds every row of the database's tables; meanwhile its lock is
// taken by another (its key set to another token, as a failover of Redis
// or an expired lease would give it away), and the request goes on working
// for two leases, long enough for its renewal to find the lock gone. Then
// the rows are let go. Whatever the strategy does about the lost lock,
// its answer must tell the truth about what it stored: HELD (or an error)
// when Lookup then finds the reservation, not HELD when it does not. A
// strategy that answers BUSY after a commit because its watchdog lost
// the lock ("the answer cannot be trusted, try again") tells a client
// that nothing was written while the unit is held in its name.
//
// The lock-fault scenarios take a lock from a holder whose watchdog is
// stopped, or finish long before the first renewal (10 s of a 30 s
// lease), so no renewal ever met a lost lock before this check.
func checkLockLostWhileWorking(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("lock-lost")
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 2}}, LockLease: lockLossLease})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	node := dep.Node(0)
	info, addr := lockOf(t, node, rs, sku)
	rdb, err := redistest.Client(addr)
	if err != nil {
		t.Fatalf("connect to the lock's server: %v", err)
	}
	defer rdb.Close()

	tx, holder := holdAllRows(ctx, t, admin)
	defer tx.Rollback(context.Background()) //nolint:errcheck // rolled back below on every path that gets there
	req := strategy.Request{Key: "kit-lock-lost-" + sku, User: "kit-lock-lost", SKU: sku, TTL: time.Hour}
	var box panicBox
	defer box.rethrow()
	done := reserveAsync(ctx, &box, node, req)
	waited, probeErr := awaitAnswerOrBlocked(ctx, admin, holder, done)
	if probeErr != nil {
		t.Fatalf("read the lock waits: %v", probeErr)
	}
	if !waited {
		_ = tx.Rollback(context.Background())
		a := <-done
		t.Logf("Reserve %q answered %s, %v without waiting behind the rows held: its lock was not taken from it while it worked", req.Key, a.res.Outcome, a.err)
		return
	}
	if err := rdb.Set(ctx, info.Key, "kit-taken-by-another", time.Minute).Err(); err != nil {
		t.Fatalf("give the lock %s to another: %v", info.Key, err)
	}
	// Two leases: the watchdog renews every third of one. A timer, not a
	// synchronisation: no state of the strategy's says a renewal ran, and
	// the request is known to be waiting (pg_blocking_pids) throughout.
	time.Sleep(2 * lockLossLease)
	if err := tx.Rollback(context.Background()); err != nil {
		t.Errorf("release the rows: %v", err)
	}
	a := <-done
	_ = rdb.Del(context.Background(), info.Key).Err()
	got, err := node.Lookup(ctx, req.Key)
	if err != nil {
		t.Fatalf("Lookup %q: %v", req.Key, err)
	}
	stored := got.Status == strategy.StatusHeld
	switch {
	case stored && a.err == nil && a.res.Outcome != strategy.OutcomeHeld:
		t.Errorf("Reserve %q, whose lock another took while it waited in PostgreSQL: answered %s, but its reservation is HELD (a client told nothing was written holds a unit it does not know of)", req.Key, a.res.Outcome)
	case !stored && a.err == nil && a.res.Outcome == strategy.OutcomeHeld:
		t.Errorf("Reserve %q, whose lock another took while it waited in PostgreSQL: answered HELD, but Lookup finds %s", req.Key, got.Status)
	}
	list, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	for _, s := range list {
		if s.Active > s.Total || s.Drift() != 0 {
			t.Errorf("Audit of %s after the lock was lost: total %d, available %d, active %d", s.SKU, s.Total, s.Available, s.Active)
		}
	}
}
