package memquota_test

import (
	"context"
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

// TestSessionNeverWaits: requests with the key or the user of an attempt
// held open do not wait for it (each call below returns, or the test's
// deadline fails it). The key's outcome is whatever the open attempt
// commits, so a request with that key gets ErrInFlight (unknown yet), even
// on a node with no unit left; the user's other keys get USER_LIMIT. After
// the attempt commits: REPLAY and USER_LIMIT from the log.
func TestSessionNeverWaits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dep, sku := deploy(t, freshDB(t), memquota.FromLog, 2, 3) // node 0: 2 units, node 1: 1
	key := strategy.Request{Key: "k-" + sku, User: "u", SKU: sku, TTL: time.Minute}
	user := strategy.Request{Key: "k2-" + sku, User: "u", SKU: sku, TTL: time.Minute}

	t1 := open(t, ctx, dep, 0)
	res, err := t1.Reserve(ctx, key)
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)
	res, err = dep.Node(1).Reserve(ctx, strategy.Request{Key: "x-" + sku, User: "x", SKU: sku, TTL: time.Minute})
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome, "node 1 now has no unit left")

	for node := 0; node < 2; node++ {
		_, err = dep.Node(node).Reserve(ctx, key)
		require.ErrorIs(t, err, memquota.ErrInFlight, "node %d, plain", node)
		s := open(t, ctx, dep, node)
		_, err = s.Reserve(ctx, key)
		require.ErrorIs(t, err, memquota.ErrInFlight, "node %d, held open", node)
		require.NoError(t, s.Rollback(ctx))
	}
	res, err = dep.Node(0).Reserve(ctx, user)
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeUserLimit, res.Outcome, "plain")
	s := open(t, ctx, dep, 0)
	res, err = s.Reserve(ctx, user)
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeUserLimit, res.Outcome, "held open")
	require.NoError(t, s.Rollback(ctx))
	a := audit(t, dep)
	require.Equal(t, 1, a.Nodes[0].Available, "the refused requests gave their units back")
	require.Equal(t, 0, a.Nodes[1].Available)

	require.NoError(t, t1.Commit(ctx))
	for node := 0; node < 2; node++ {
		res, err = dep.Node(node).Reserve(ctx, key)
		require.NoError(t, err)
		require.Equal(t, strategy.OutcomeReplay, res.Outcome, "node %d", node)
	}
	res, err = dep.Node(0).Reserve(ctx, user)
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeUserLimit, res.Outcome)
	a = audit(t, dep)
	require.Equal(t, 2, a.Active)
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
	require.ErrorIs(t, s.Commit(ctx), memquota.ErrNodeClosed)
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
