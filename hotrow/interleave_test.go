package hotrow_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/hotrow"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
)

// step is a reservation running in its own goroutine.
type step struct {
	done chan struct{}
	res  strategy.Result
	err  error
}

func (s *step) wait() (strategy.Result, error) { <-s.done; return s.res, s.err }

// goReserve runs a plain Reserve in a goroutine.
func goReserve(ctx context.Context, n strategy.Strategy, r strategy.Request) *step {
	s := &step{done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.res, s.err = n.Reserve(ctx, r)
	}()
	return s
}

// goSessionReserve runs Reserve and Commit of an open session in a goroutine.
func goSessionReserve(ctx context.Context, sess strategy.Session, r strategy.Request) *step {
	s := &step{done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.res, s.err = sess.Reserve(ctx, r)
		if s.err == nil {
			s.err = sess.Commit(ctx)
		}
	}()
	return s
}

func openSession(t *testing.T, n strategy.Strategy) strategy.Session {
	t.Helper()
	s, err := n.(strategy.SessionOpener).OpenSession(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Rollback(context.Background()) })
	require.Len(t, s.Backends(), 1)
	return s
}

// TestPhantomInputWaitsThenSucceeds is C28-14 on hotrow: 2 units; t1
// reserves and holds its transaction open; t2 and t3 reserve. Both are seen
// blocked in PostgreSQL (pg_blocking_pids of their backends: t2 waits for
// t1's row lock, t3 for t1 or t2), not answered SOLD_OUT; after t1 rolls
// back both succeed. hotrow has no phantom sold-out; the price is the wait.
func TestPhantomInputWaitsThenSucceeds(t *testing.T) {
	t.Parallel()
	db, admin := pgtest.Pools(t)
	ctx := context.Background()
	dep, sku := open(t, db, hotrow.Options{}, 1, 2)
	n := dep.Node(0)

	t1 := openSession(t, n)
	res, err := t1.Reserve(ctx, req("req-t1", "user-0001", sku))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)
	require.Equal(t, 2, audit(t, dep).Available, "t1's decrement is not visible before commit")

	s2 := openSession(t, n)
	t2 := goSessionReserve(ctx, s2, req("req-t2", "user-0002", sku))
	blockers := blockedBy(t, admin, s2.Backends()[0], t2.done)
	require.Contains(t, blockers, int32(t1.Backends()[0]), "t2 waits for t1, the uncommitted holder of the stock row")

	s3 := openSession(t, n)
	t3 := goSessionReserve(ctx, s3, req("req-t3", "user-0003", sku))
	blockers = blockedBy(t, admin, s3.Backends()[0], t3.done)
	t.Logf("t3 blocked by %v (t1 %d, t2 %d)", blockers, t1.Backends()[0], s2.Backends()[0])
	select {
	case <-t3.done:
		t.Fatal("t3 finished while t1 still holds its attempt open")
	default:
	}

	require.NoError(t, t1.Rollback(ctx))
	for name, s := range map[string]*step{"t2": t2, "t3": t3} {
		res, err := s.wait()
		require.NoError(t, err, name)
		require.Equal(t, strategy.OutcomeHeld, res.Outcome, "%s after t1's rollback", name)
	}
	r, err := n.Lookup(ctx, "req-t1")
	require.NoError(t, err)
	require.Equal(t, strategy.StatusNotFound, r.Status, "t1 rolled back")
	a := audit(t, dep)
	require.Equal(t, 0, a.Available)
	require.Equal(t, 2, a.Active)
}

// TestWaitThenReevaluate is the boundary in both directions, on the last
// unit: t1 decrements it and holds its transaction open; t2 (a plain
// Reserve) waits for t1. If t1 commits, t2 re-evaluates available > 0 on the
// newest row version, finds 0 and answers SOLD_OUT (correct: the unit is
// gone). If t1 rolls back, the newest version still has the unit and t2 is
// HELD. Neither needs a retry under READ COMMITTED.
func TestWaitThenReevaluate(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"commit", "rollback"} {
		t.Run(end, func(t *testing.T) {
			db, admin := pgtest.Pools(t)
			ctx := context.Background()
			dep, sku := open(t, db, hotrow.Options{}, 2, 1)
			t1 := openSession(t, dep.Node(0))
			res, err := t1.Reserve(ctx, req("req-t1", "user-1", sku))
			require.NoError(t, err)
			require.Equal(t, strategy.OutcomeHeld, res.Outcome)

			t2 := goReserve(ctx, dep.Node(1), req("req-t2", "user-2", sku))
			waiterOn(t, admin, t1.Backends()[0], t2.done)
			want := strategy.OutcomeSoldOut
			if end == "commit" {
				require.NoError(t, t1.Commit(ctx))
			} else {
				require.NoError(t, t1.Rollback(ctx))
				want = strategy.OutcomeHeld
			}
			res, err = t2.wait()
			require.NoError(t, err)
			require.Equal(t, want, res.Outcome)
			a := audit(t, dep)
			require.Equal(t, 1, a.Active)
			require.Zero(t, dep.Retries())
		})
	}
}

// TestWhoWaits: while t1 holds an uncommitted decrement of SKU A, requests
// that never reach A's stock row do not wait: another SKU, a replay of a
// committed key, a known key with another user, Lookup, Audit. A request
// with t1's own key or t1's user on A waits for t1 in the unique indexes
// (request_key, reservation_one_active) and is answered after t1 ends.
func TestWhoWaits(t *testing.T) {
	t.Parallel()
	db, admin := pgtest.Pools(t)
	ctx := context.Background()
	skuA, skuB := newSKU("a"), newSKU("b")
	dep, err := hotrow.Open(ctx, strategy.Config{DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: skuA, Total: 5}, {SKU: skuB, Total: 5}}}, hotrow.Options{})
	require.NoError(t, err)
	defer dep.Close()
	n := dep.Node(1)
	done, err := n.Reserve(ctx, req("req-done", "user-0", skuA))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, done.Outcome)

	t1 := openSession(t, dep.Node(0))
	res, err := t1.Reserve(ctx, req("req-t1", "user-1", skuA))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)

	// None of these may block: a bounded context turns a wait into a failure.
	quick, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, c := range []struct {
		r    strategy.Request
		want strategy.Outcome
	}{
		{req("req-b", "user-2", skuB), strategy.OutcomeHeld},
		{req("req-done", "user-0", skuA), strategy.OutcomeReplay},
		{req("req-done", "user-9", skuA), strategy.OutcomeKeyReused},
	} {
		res, err := n.Reserve(quick, c.r)
		require.NoError(t, err, "%+v", c.r)
		require.Equal(t, c.want, res.Outcome, "%+v", c.r)
	}
	r, err := n.Lookup(quick, "req-t1")
	require.NoError(t, err)
	require.Equal(t, strategy.StatusNotFound, r.Status)
	_, err = dep.Audit(quick)
	require.NoError(t, err)

	sameKey := goReserve(ctx, n, req("req-t1", "user-1", skuA))
	waiterOn(t, admin, t1.Backends()[0], sameKey.done)
	sameUser := goReserve(ctx, n, req("req-t1-other", "user-1", skuA))
	waiterOn(t, admin, t1.Backends()[0], sameUser.done)
	require.NoError(t, t1.Commit(ctx))
	res, err = sameKey.wait()
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeReplay, res.Outcome, "the same key, after t1 committed")
	res, err = sameUser.wait()
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeUserLimit, res.Outcome, "the same user, after t1 committed")
	list, err := dep.Audit(ctx)
	require.NoError(t, err)
	require.Equal(t, []strategy.StockAudit{{SKU: skuA, Total: 5, Available: 3, Active: 2}, {SKU: skuB, Total: 5, Available: 4, Active: 1}}, list)
}

// TestSession: the session contract on hotrow, beyond the kit's check: the
// backend is the session's own and idle in a transaction; nothing is
// visible before Commit; SOLD_OUT, USER_LIMIT and BAD_REQUEST inside a
// session leave it usable; Rollback after Commit is a no-op; a second
// Commit and a Reserve after the end are refused.
func TestSession(t *testing.T) {
	t.Parallel()
	db, admin := pgtest.Pools(t)
	ctx := context.Background()
	dep, sku := open(t, db, hotrow.Options{}, 1, 1)
	n := dep.Node(0)
	s := openSession(t, n)

	var state string
	require.NoError(t, admin.QueryRow(ctx, `SELECT state FROM pg_stat_activity WHERE pid = $1`, int32(s.Backends()[0])).Scan(&state))
	require.Equal(t, "idle in transaction", state)

	res, err := s.Reserve(ctx, strategy.Request{Key: "k1", User: "u1", SKU: sku})
	require.ErrorIs(t, err, strategy.ErrBadRequest)
	require.Equal(t, strategy.OutcomeBadRequest, res.Outcome)

	res, err = s.Reserve(ctx, req("k1", "u1", sku))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)
	res, err = s.Reserve(ctx, req("k2", "u1", sku))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeUserLimit, res.Outcome, "its own uncommitted reservation counts")
	res, err = s.Reserve(ctx, req("k3", "u3", sku))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeSoldOut, res.Outcome, "its own uncommitted decrement counts")
	res, err = s.Reserve(ctx, req("k1", "u1", sku))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeReplay, res.Outcome)

	r, err := n.Lookup(ctx, "k1")
	require.NoError(t, err)
	require.Equal(t, strategy.StatusNotFound, r.Status)
	require.NoError(t, s.Commit(ctx))
	require.NoError(t, s.Rollback(ctx), "Rollback after Commit is a no-op")
	require.ErrorIs(t, s.Commit(ctx), strategy.ErrSessionEnded)
	_, err = s.Reserve(ctx, req("k4", "u4", sku))
	require.ErrorIs(t, err, strategy.ErrSessionEnded)

	r, err = n.Lookup(ctx, "k1")
	require.NoError(t, err)
	require.Equal(t, strategy.StatusHeld, r.Status)
	a := audit(t, dep)
	require.Equal(t, 1, a.Active)
	require.Equal(t, int32(0), db.Stat().AcquiredConns(), "the session's connection went back to the pool")
}

// TestSessionExpireKilled is C28-09 inside one test process: the expiry job
// runs in a session and moves 5 due rows, then its backend is terminated
// before the commit (pg_terminate_backend: the server ends the connection
// as if the client had been killed, and rolls the transaction back, docs
// 55.2.9). Nothing came back; a rerun returns the 5 units once, and a
// second rerun 0.
func TestSessionExpireKilled(t *testing.T) {
	t.Parallel()
	db, admin := pgtest.Pools(t)
	ctx := context.Background()
	dep, sku := open(t, db, hotrow.Options{}, 2, 10)
	keys := holdN(t, dep, sku, 10)
	_, err := dep.MakeDue(ctx, keys[:5])
	require.NoError(t, err)

	s, err := dep.Node(0).(strategy.ExpirySessionOpener).OpenExpirySession(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Rollback(context.Background()) })
	units, err := s.ExpireDue(ctx)
	require.NoError(t, err)
	require.Equal(t, 5, units, "moved inside the session, not committed")
	require.Equal(t, 0, audit(t, dep).Available, "uncommitted: nothing visible")

	var terminated bool
	require.NoError(t, admin.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, int32(s.Backends()[0])).Scan(&terminated))
	require.True(t, terminated)
	require.Error(t, s.Commit(ctx), "the session's connection is gone")

	a := audit(t, dep)
	require.Equal(t, 0, a.Available, "the killed job returned nothing")
	require.Equal(t, 10, a.Active)
	units, err = dep.Node(1).(strategy.Expirer).ExpireDue(ctx)
	require.NoError(t, err)
	require.Equal(t, 5, units, "the rerun returns the 5 units")
	units, err = dep.Node(0).(strategy.Expirer).ExpireDue(ctx)
	require.NoError(t, err)
	require.Zero(t, units, "and only once")
	a = audit(t, dep)
	require.Equal(t, 5, a.Available)
	require.Equal(t, map[strategy.Status]int{strategy.StatusExpired: 5, strategy.StatusHeld: 5}, statuses(t, dep.Node(0), keys))
}
