package memquota_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/memquota"
	"github.com/reservebench/reservebench/strategy"
)

func open(t *testing.T, ctx context.Context, dep strategy.Deployment, node int) strategy.Session {
	t.Helper()
	s, err := dep.Node(node).(strategy.SessionOpener).OpenSession(ctx)
	require.NoError(t, err)
	require.Len(t, s.Backends(), 1)
	require.NotZero(t, s.Backends()[0])
	t.Cleanup(func() { _ = s.Rollback(context.Background()) })
	return s
}

// openExpiry opens the expiry job held open on node node of dep.
func openExpiry(t *testing.T, ctx context.Context, dep strategy.Deployment, node int) strategy.ExpirySession {
	t.Helper()
	s, err := dep.Node(node).(strategy.ExpirySessionOpener).OpenExpirySession(ctx)
	require.NoError(t, err)
	require.Len(t, s.Backends(), 1)
	t.Cleanup(func() { _ = s.Rollback(context.Background()) })
	return s
}

// TestSessionPhantomSoldOut is C28-14 on C: 2 units; t1 reserves and holds
// its attempt open; t2 reserves; t3 is told SOLD_OUT at once, without
// waiting (each call below returns or the test's deadline fails it), while
// one unit is in t1's open transaction and nowhere else: gone from memory,
// in no committed row (the audit's drift is +1 meanwhile). t1 rolls back,
// the unit is back, and t3's retry is HELD.
func TestSessionPhantomSoldOut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dep, sku := deploy(t, freshDB(t), memquota.FromLog, 1, 2)
	req := func(name string) strategy.Request {
		return strategy.Request{Key: "req-" + name + "-" + sku, User: "user-" + name, SKU: sku, TTL: time.Minute}
	}

	t1 := open(t, ctx, dep, 0)
	res, err := t1.Reserve(ctx, req("t1"))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)
	r, err := dep.Node(0).Lookup(ctx, req("t1").Key)
	require.NoError(t, err)
	require.Equal(t, strategy.StatusNotFound, r.Status, "t1 is not committed")

	res, err = dep.Node(0).Reserve(ctx, req("t2"))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)

	res, err = dep.Node(0).Reserve(ctx, req("t3"))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeSoldOut, res.Outcome, "t3: the unit t1 holds open is gone from memory")
	a := audit(t, dep)
	require.Equal(t, 0, a.Available)
	require.Equal(t, 1, a.Active)
	require.Equal(t, 1, a.Drift(), "t1's unit: out of memory, in no committed row")

	require.NoError(t, t1.Rollback(ctx))
	a = audit(t, dep)
	require.Equal(t, 1, a.Available, "t1's unit is back")
	require.Equal(t, 0, a.Drift())
	res, err = dep.Node(0).Reserve(ctx, req("t3"))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome, "t3 retried after the rollback")
	require.NoError(t, t1.Rollback(ctx), "a second Rollback is a no-op")
}

// TestRepeatedKeyWaitsForOpenAttempt: requests with the key, or the user,
// of an attempt held open wait for it, because its commit decides their
// answer: plain or held open, on a node with units (the insert waits on the
// unique index) and on a node with none (the lookup waits on the key's
// advisory lock). Each is seen blocked by the attempt's backend in
// pg_blocking_pids before the attempt ends. Committed: REPLAY, and
// USER_LIMIT for the user's other key. Rolled back: HELD where a unit is
// left, SOLD_OUT where none is, never a REPLAY of nothing.
func TestRepeatedKeyWaitsForOpenAttempt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, admin := sharedDB(t)
	dep, sku := deploy(t, db, memquota.FromLog, 2, 13) // node 0: 7 units, node 1: 6
	require.Equal(t, map[string]int{"HELD": 6}, outcomes(sendAll(ctx, dep, distinct("n1", sku, 1, 6))), "node 1 has no unit left")
	req := func(key, user string) strategy.Request {
		return strategy.Request{Key: key + "-" + sku, User: user, SKU: sku, TTL: time.Minute}
	}
	type reply struct {
		name string
		res  strategy.Result
		err  error
	}
	start := func(replies chan<- reply, name string, f func() (strategy.Result, error)) {
		go func() {
			res, err := f()
			replies <- reply{name, res, err}
		}()
	}
	collect := func(replies <-chan reply, n int) map[string]strategy.Outcome {
		got := map[string]strategy.Outcome{}
		for i := 0; i < n; i++ {
			r := <-replies
			require.NoError(t, r.err, r.name)
			got[r.name] = r.res.Outcome
		}
		return got
	}

	t1 := open(t, ctx, dep, 0)
	res, err := t1.Reserve(ctx, req("k", "u"))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)
	replies := make(chan reply, 4)
	start(replies, "key on node 0", func() (strategy.Result, error) { return dep.Node(0).Reserve(ctx, req("k", "u")) })
	start(replies, "key on node 1 (no unit)", func() (strategy.Result, error) { return dep.Node(1).Reserve(ctx, req("k", "u")) })
	start(replies, "user's other key", func() (strategy.Result, error) { return dep.Node(0).Reserve(ctx, req("k2", "u")) })
	t2 := open(t, ctx, dep, 0)
	start(replies, "key held open", func() (strategy.Result, error) { return t2.Reserve(ctx, req("k", "u")) })
	awaitBlocked(t, admin, t1.Backends()[0], 4)
	require.Empty(t, replies, "nobody answered before t1 ended")
	res, err = dep.Node(0).Reserve(ctx, req("k3", "v"))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome, "another key and user does not wait")

	require.NoError(t, t1.Commit(ctx))
	require.Equal(t, map[string]strategy.Outcome{
		"key on node 0": strategy.OutcomeReplay, "key on node 1 (no unit)": strategy.OutcomeReplay,
		"user's other key": strategy.OutcomeUserLimit, "key held open": strategy.OutcomeReplay,
	}, collect(replies, 4))
	require.NoError(t, t2.Rollback(ctx))

	t3 := open(t, ctx, dep, 0)
	res, err = t3.Reserve(ctx, req("r", "w"))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)
	start(replies, "key on node 1 (no unit)", func() (strategy.Result, error) { return dep.Node(1).Reserve(ctx, req("r", "w")) })
	start(replies, "user's other key", func() (strategy.Result, error) { return dep.Node(0).Reserve(ctx, req("r2", "w")) })
	awaitBlocked(t, admin, t3.Backends()[0], 2)
	require.NoError(t, t3.Rollback(ctx))
	require.Equal(t, map[string]strategy.Outcome{
		"key on node 1 (no unit)": strategy.OutcomeSoldOut, "user's other key": strategy.OutcomeHeld,
	}, collect(replies, 2))

	a := audit(t, dep)
	require.Equal(t, 9, a.Active, "node 1's 6, k, k3 and r2")
	require.Equal(t, 0, a.Drift())
}

// TestSessionCommit: a committed attempt keeps its unit and its row;
// Rollback after Commit is a no-op; a repeated key inside a session is a
// REPLAY that gives its unit back.
func TestSessionCommit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dep, sku := deploy(t, freshDB(t), memquota.FromConfig, 1, 3)
	s := open(t, ctx, dep, 0)
	req := strategy.Request{Key: "c-" + sku, User: "u", SKU: sku, TTL: time.Minute}
	res, err := s.Reserve(ctx, req)
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)
	require.False(t, res.Reservation.ExpiresAt.IsZero())
	res, err = s.Reserve(ctx, req)
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeReplay, res.Outcome, "the same key again in the same attempt")
	require.Equal(t, 2, audit(t, dep).Available)
	require.NoError(t, s.Commit(ctx))
	require.NoError(t, s.Rollback(ctx), "Rollback after Commit")
	require.Error(t, s.Commit(ctx), "a second Commit")
	r, err := dep.Node(0).Lookup(ctx, req.Key)
	require.NoError(t, err)
	require.Equal(t, strategy.StatusHeld, r.Status)
	a := audit(t, dep)
	require.Equal(t, 2, a.Available)
	require.Equal(t, 1, a.Active)
	require.Equal(t, 0, a.Drift())
}

// TestRestartAbandonsHeldOpenAttempt: an attempt held open dies with its
// node. After a FromLog restart has counted the log (where the open attempt
// is not), the attempt cannot commit any more: had it committed, its unit
// would have been sold twice.
func TestRestartAbandonsHeldOpenAttempt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dep, sku := deploy(t, freshDB(t), memquota.FromLog, 1, 1)
	s := open(t, ctx, dep, 0)
	req := strategy.Request{Key: "open-" + sku, User: "u", SKU: sku, TTL: time.Minute}
	res, err := s.Reserve(ctx, req)
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)
	require.Equal(t, 0, audit(t, dep).Available)

	require.NoError(t, dep.Restart(ctx, 0))
	require.Equal(t, 1, audit(t, dep).Available, "the log has no row for the open attempt")
	require.ErrorIs(t, s.Commit(ctx), strategy.ErrNodeClosed)
	r, err := dep.Node(0).Lookup(ctx, req.Key)
	require.NoError(t, err)
	require.Equal(t, strategy.StatusNotFound, r.Status)

	other := strategy.Request{Key: "other-" + sku, User: "v", SKU: sku, TTL: time.Minute}
	res, err = dep.Node(0).Reserve(ctx, other)
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)
	a := audit(t, dep)
	require.Equal(t, 1, a.Active)
	require.Equal(t, 0, a.Oversold())
	require.Equal(t, 0, a.Drift())
}

// TestInDoubtInsertSettles: an insert whose client gave up after sending it
// has an unknown outcome. Its unit stays out of the counter, in doubt
// (positive drift), until Settle learns from the log, once the insert's
// backend is gone, whether the row committed.
//
// Refused: the insert waited for t1, which holds the same user, and the
// client's context was canceled meanwhile; t1 commits, the insert is refused,
// and the unit goes back. Committed: the insert's COMMIT waits for a
// synchronous standby that does not exist (as in the commit-timeout
// scenario) when the client gives up; once the wait is lifted the commit
// completes, and the unit stays sold.
func TestInDoubtInsertSettles(t *testing.T) {
	db, admin := sharedDB(t)
	settled := func(t *testing.T, ctx context.Context, dep strategy.Deployment) {
		t.Helper()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for memquota.InDoubt(dep) > 0 { // until the insert's backend is gone
			_, err := dep.(*memquota.Deployment).Settle(ctx)
			require.NoError(t, err)
			select {
			case <-ctx.Done():
				t.Fatal("the abandoned insert's backend never went away")
			case <-tick.C:
			}
		}
	}

	t.Run("refused", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		dep, sku := deploy(t, db, memquota.FromLog, 1, 5)
		t1 := open(t, ctx, dep, 0)
		res, err := t1.Reserve(ctx, strategy.Request{Key: "a-" + sku, User: "u", SKU: sku, TTL: time.Minute})
		require.NoError(t, err)
		require.Equal(t, strategy.OutcomeHeld, res.Outcome)

		pctx, give := context.WithCancel(ctx)
		done := make(chan error, 1)
		abandoned := strategy.Request{Key: "b-" + sku, User: "u", SKU: sku, TTL: time.Minute}
		go func() {
			_, err := dep.Node(0).Reserve(pctx, abandoned)
			done <- err
		}()
		awaitBlocked(t, admin, t1.Backends()[0], 1)
		give()
		require.Error(t, <-done, "the client gave up: outcome unknown")
		require.Equal(t, 1, memquota.InDoubt(dep))
		a := audit(t, dep)
		require.Equal(t, 3, a.Available, "t1's unit and the abandoned insert's unit are out of memory")
		require.Equal(t, 0, a.Active)

		require.NoError(t, t1.Commit(ctx))
		settled(t, ctx, dep)
		a = audit(t, dep)
		require.Equal(t, strategy.StockAudit{SKU: sku, Total: 5, Available: 4, Active: 1, Nodes: a.Nodes}, a)
		r, err := dep.Node(0).Lookup(ctx, abandoned.Key)
		require.NoError(t, err)
		require.Equal(t, strategy.StatusNotFound, r.Status, "refused by t1's row: its unit went back")
	})

	t.Run("committed", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		dep, sku := deploy(t, db, memquota.FromLog, 1, 500)
		// pg_reload_conf only signals the postmaster: wait until a backend
		// shows the new value, which means the postmaster has reloaded and
		// signalled every backend (CI, on busy cores, once ran 40 requests
		// before it had).
		standby := func(stmt, want string) {
			_, err := admin.Exec(context.Background(), stmt)
			require.NoError(t, err)
			_, err = admin.Exec(context.Background(), "SELECT pg_reload_conf()")
			require.NoError(t, err)
			wctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // also from Cleanup, after ctx ended
			defer cancel()
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for {
				var got string
				require.NoError(t, admin.QueryRow(wctx, "SELECT current_setting('synchronous_standby_names')").Scan(&got))
				if got == want {
					return
				}
				select {
				case <-wctx.Done():
					t.Fatalf("synchronous_standby_names is still %q after reloading", got)
				case <-tick.C:
				}
			}
		}
		standby("ALTER SYSTEM SET synchronous_standby_names = 'memquota_no_such_standby'", "memquota_no_such_standby")
		lifted := false
		lift := func() {
			if !lifted {
				lifted = true
				standby("ALTER SYSTEM RESET synchronous_standby_names", "")
			}
		}
		t.Cleanup(lift)

		// Committing backends learn that a standby is named from shared
		// memory, which the checkpointer updates after its own reload: try
		// until an insert's COMMIT is seen waiting for the standby.
		var abandoned strategy.Request
		held := 0
		deadline := time.Now().Add(30 * time.Second)
		for i := 0; abandoned.Key == ""; i++ {
			require.True(t, i < 400 && time.Now().Before(deadline), "no COMMIT waited for the standby in %d requests", i)
			req := strategy.Request{Key: fmt.Sprintf("c%d-%s", i, sku), User: fmt.Sprintf("u%d", i), SKU: sku, TTL: time.Minute}
			pctx, give := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				_, err := dep.Node(0).Reserve(pctx, req)
				done <- err
			}()
			waiting := awaitSyncRep(t, admin, done)
			give()
			err := <-done
			if waiting {
				require.Error(t, err, "the client gave up during COMMIT")
				abandoned = req
			} else {
				require.NoError(t, err)
				held++
			}
		}
		require.Equal(t, 1, memquota.InDoubt(dep))
		before := audit(t, dep)
		t.Logf("while the COMMIT waits: active %d, available %d, drift %d (the unit in doubt)", before.Active, before.Available, before.Drift())

		lift()
		settled(t, ctx, dep)
		a := audit(t, dep)
		require.Equal(t, 0, a.Drift())
		require.Equal(t, held+1, a.Active, "the abandoned insert committed")
		r, err := dep.Node(0).Lookup(ctx, abandoned.Key)
		require.NoError(t, err)
		require.Equal(t, strategy.StatusHeld, r.Status, "committed although its client gave up: its unit stays sold")
	})
}
