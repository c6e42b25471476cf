package slotrows_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
)

// TestPhantomSoldOut is seed case C28-14, step by step, and the boundary of
// strategy B: a unit that another attempt has locked but not committed is
// skipped, so a request can be told SOLD_OUT while that unit is in fact free.
//
//	t1 claims slot 1 and holds its attempt open
//	t2 claims slot 2 (t1's lock is skipped, nobody waits)
//	t3 is told SOLD_OUT at once, while t1 still holds its attempt
//	   (t3 never shows up in pg_blocking_pids): slot 1 is free but locked
//	t1 rolls back: one unit is free, as the audit says
//	t3 retries and gets slot 1
func TestPhantomSoldOut(t *testing.T) {
	ctx := testCtx(t)
	db, admin := pgtest.Pools(t)
	const sku = "sku-lab-01"
	dep := deploy(t, db, 1, strategy.Stock{SKU: sku, Total: 2})
	n := dep.Node(0)
	opener := n.(strategy.SessionOpener)

	t1, err := opener.OpenSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Rollback(ctx) //nolint:errcheck
	if res, err := t1.Reserve(ctx, request("t1", "0001", sku)); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("t1: %+v, %v; want HELD", res, err)
	}
	if got := lockableFreeSlots(t, admin, sku); len(got) != 1 || got[0] != 2 {
		t.Fatalf("with t1 open, the free slots another claim can lock are %v, want [2]: t1 locks slot 1 and only it", got)
	}

	if res, err := n.Reserve(ctx, request("t2", "0002", sku)); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("t2: %+v, %v; want HELD", res, err)
	}
	if got := holders(t, admin, sku); got[2] != "req-t2" || len(got) != 1 {
		t.Fatalf("committed holders after t2: %v, want slot 2 held by req-t2 only", got)
	}

	// t3 runs in a session of its own so its backend is known; it must
	// answer without ever being blocked, while t1 still holds its attempt.
	t3, err := opener.OpenSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res3, waited := watchNoWait(t, admin, t3, request("t3", "0003", sku), func() { _ = t1.Rollback(ctx) })
	if waited {
		t.Errorf("t3 was blocked in PostgreSQL (pg_blocking_pids) by the attempt t1 holds open")
	}
	if res3.Outcome != strategy.OutcomeSoldOut {
		t.Errorf("t3: %s, want SOLD_OUT (the phantom sold-out of C28-14)", res3.Outcome)
	}
	if err := t3.Commit(ctx); err != nil {
		t.Fatalf("t3 commit: %v", err)
	}
	if state := backendState(t, admin, t1.Backends()[0]); state != "idle in transaction" {
		t.Errorf("t1's backend is %q after t3 answered, want \"idle in transaction\": t3 answered while t1 still held slot 1", state)
	}

	// The phantom: SOLD_OUT was answered while one unit is free in the
	// committed state, only locked by t1's open attempt.
	if a := auditOf(t, dep, sku); a.Available != 1 || a.Active != 1 {
		t.Errorf("audit while t1 holds: %+v, want available 1 (slot 1, locked by t1), active 1 (t2)", a)
	}
	if free, lockable := freeSlots(t, admin, sku), lockableFreeSlots(t, admin, sku); len(free) != 1 || free[0] != 1 || len(lockable) != 0 {
		t.Errorf("while t1 holds: free slots %v, lockable %v; want [1] free and none lockable", free, lockable)
	}

	if err := t1.Rollback(ctx); err != nil {
		t.Fatalf("t1 rollback: %v", err)
	}
	if a := auditOf(t, dep, sku); a.Available != 1 || a.Active != 1 {
		t.Errorf("audit after t1 rolled back: %+v, want available 1, active 1: one unit is in fact free", a)
	}
	if r, err := n.Lookup(ctx, "req-t1"); err != nil || r.Status != strategy.StatusNotFound {
		t.Errorf("t1 after rollback: %+v, %v; want NOT_FOUND", r, err)
	}

	retry, err := n.Reserve(ctx, request("t3", "0003", sku))
	if err != nil || retry.Outcome != strategy.OutcomeHeld {
		t.Fatalf("t3 retried after the rollback: %+v, %v; want HELD", retry, err)
	}
	if got := holders(t, admin, sku); got[1] != "req-t3" || got[2] != "req-t2" {
		t.Errorf("holders at the end: %v, want slot 1 req-t3, slot 2 req-t2", got)
	}
	if a := auditOf(t, dep, sku); a.Available != 0 || a.Active != 2 {
		t.Errorf("audit at the end: %+v, want available 0, active 2", a)
	}
}

// watchNoWait runs s.Reserve(req) and, until it returns, asks PostgreSQL
// whether the session's backend is blocked, as the isolation tester does.
// It reports the answer and whether the backend was ever seen blocked. When
// it is, unblock is called (so the test fails instead of hanging).
func watchNoWait(t *testing.T, admin *pgxpool.Pool, s strategy.Session, req strategy.Request, unblock func()) (strategy.Result, bool) {
	t.Helper()
	ctx := testCtx(t)
	type answer struct {
		res strategy.Result
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := s.Reserve(ctx, req)
		done <- answer{res, err}
	}()
	pids := make([]int32, 0, 1)
	for _, p := range s.Backends() {
		pids = append(pids, int32(p))
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	waited := false
	for {
		select {
		case a := <-done:
			if a.err != nil {
				t.Fatalf("%s: %v", req.Key, a.err)
			}
			return a.res, waited
		case <-tick.C:
		}
		var blocked bool
		err := admin.QueryRow(ctx, `SELECT coalesce(bool_or(cardinality(pg_blocking_pids(p)) > 0), false) FROM unnest($1::int4[]) AS p`, pids).Scan(&blocked)
		if err != nil {
			t.Fatalf("probe pg_blocking_pids: %v", err)
		}
		if blocked && !waited {
			waited = true
			unblock()
		}
	}
}

func backendState(t *testing.T, admin *pgxpool.Pool, pid uint32) string {
	t.Helper()
	var state string
	if err := admin.QueryRow(testCtx(t), `SELECT coalesce(state, '') FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&state); err != nil {
		t.Fatalf("pg_stat_activity: %v", err)
	}
	return state
}

// freeSlots lists the committed free slots of sku.
func freeSlots(t *testing.T, admin *pgxpool.Pool, sku string) []int {
	t.Helper()
	return slotList(t, admin, `SELECT slot_no FROM slotrows_slot WHERE sku = $1 AND holder IS NULL ORDER BY slot_no`, sku)
}

// lockableFreeSlots lists the free slots a claim could take now: those not
// locked by an attempt in flight. It locks them in a transaction it rolls
// back.
func lockableFreeSlots(t *testing.T, admin *pgxpool.Pool, sku string) []int {
	t.Helper()
	return slotList(t, admin, `SELECT slot_no FROM slotrows_slot WHERE sku = $1 AND holder IS NULL ORDER BY slot_no FOR UPDATE SKIP LOCKED`, sku)
}

func slotList(t *testing.T, admin *pgxpool.Pool, sql, sku string) []int {
	t.Helper()
	ctx := testCtx(t)
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // nothing to keep
	rows, err := tx.Query(ctx, sql, sku)
	if err != nil {
		t.Fatalf("slots: %v", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatalf("slots: %v", err)
	}
	return out
}

// holders maps each held slot of sku to its holder's request key, as
// committed.
func holders(t *testing.T, admin *pgxpool.Pool, sku string) map[int]string {
	t.Helper()
	rows, err := admin.Query(testCtx(t), `
SELECT s.slot_no, r.request_key FROM slotrows_slot s JOIN slotrows_reservation r ON r.id = s.holder
WHERE s.sku = $1`, sku)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	var slot int
	var key string
	_, err = pgx.ForEachRow(rows, []any{&slot, &key}, func() error { out[slot] = key; return nil })
	if err != nil {
		t.Fatal(err)
	}
	return out
}
