package advisorylock_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/advisorylock"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestConformance runs every scenario of table 28-1 and checks each claim.
func TestConformance(t *testing.T) {
	strategytest.Run(t, advisorylock.Meta(), pgtest.Pools)
}

// TestPhantomWaitsInsteadOfSellingOut shows the boundary in the package doc:
// in the seed's ordering (C28-14) t2 and t3 wait for t1's SKU lock, and get
// both units after t1 rolls back (woken together: which went first is the
// server's choice, so the label does not say).
func TestPhantomWaitsInsteadOfSellingOut(t *testing.T) {
	db, admin := pgtest.Pools(t)
	r, err := strategytest.RunScenario(context.Background(), strategytest.Env{Meta: advisorylock.Meta(), DB: db, Admin: admin}, strategytest.MustScenario("phantom"))
	require.NoError(t, err)
	require.Equal(t, "t1 HELD (rolled back); t2, t3 woken together: HELD after waiting, HELD after waiting; 0 free at end",
		r.Fact("seed order: t1.reserve, t2, t3, t1.end"))
	require.Empty(t, r.Violations())
}

// TestDeploymentsShareDatabase: two deployments with disjoint SKUs in one
// database. Reserve refuses the other's SKU; Confirm, Release, MakeDue and
// ExpireDue of one never touch the other's reservations; keys are unique
// across both.
func TestDeploymentsShareDatabase(t *testing.T) {
	ctx := context.Background()
	db, _ := pgtest.Pools(t)
	a, err := advisorylock.Open(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: "a", Total: 3}}}, advisorylock.Options{})
	require.NoError(t, err)
	b, err := advisorylock.Open(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: "b", Total: 3}}}, advisorylock.Options{})
	require.NoError(t, err)
	na, nb := a.Node(0), b.Node(0)
	for _, k := range []string{"b1", "b2", "b3"} {
		res, err := nb.Reserve(ctx, strategy.Request{Key: k, User: k, SKU: "b", TTL: time.Hour})
		require.NoError(t, err)
		require.Equal(t, strategy.OutcomeHeld, res.Outcome)
	}

	res, err := na.Reserve(ctx, strategy.Request{Key: "a1", User: "u", SKU: "b", TTL: time.Hour})
	require.ErrorIs(t, err, strategy.ErrBadRequest, "b's SKU is unknown to a")
	require.Equal(t, strategy.OutcomeBadRequest, res.Outcome)
	res, err = na.Reserve(ctx, strategy.Request{Key: "b1", User: "b1", SKU: "a", TTL: time.Hour})
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeKeyReused, res.Outcome, "keys are unique across deployments")

	moved, err := na.(strategy.Confirmer).Confirm(ctx, "b1", strategy.ConfirmUntilExpired)
	require.NoError(t, err)
	require.False(t, moved, "a confirmed b's reservation")
	units, err := na.(strategy.Releaser).Release(ctx, "b2")
	require.NoError(t, err)
	require.Zero(t, units, "a released b's reservation")
	n, err := a.MakeDue(ctx, []string{"b3"})
	require.NoError(t, err)
	require.Zero(t, n, "a made b's reservation due")
	n, err = b.MakeDue(ctx, []string{"b3"})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	units, err = na.(strategy.Expirer).ExpireDue(ctx)
	require.NoError(t, err)
	require.Zero(t, units, "a expired b's reservation")
	r, err := na.Lookup(ctx, "b3")
	require.NoError(t, err)
	require.Equal(t, strategy.StatusHeld, r.Status, "Lookup sees every key")
}

// TestRestartAndClose: a restarted node's old handle answers ErrNodeClosed,
// the new one sees everything; a bad index is ErrNodeRange.
func TestRestartAndClose(t *testing.T) {
	ctx := context.Background()
	db, _ := pgtest.Pools(t)
	dep, err := advisorylock.Open(ctx, strategy.Config{DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: "s", Total: 1}}}, advisorylock.Options{})
	require.NoError(t, err)
	req := strategy.Request{Key: "k", User: "u", SKU: "s", TTL: time.Hour}
	old := dep.Node(1)
	res, err := old.Reserve(ctx, req)
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)
	require.NoError(t, dep.Restart(ctx, 1))
	_, err = old.Lookup(ctx, "k")
	require.ErrorIs(t, err, strategy.ErrNodeClosed)
	res, err = dep.Node(1).Reserve(ctx, req)
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeReplay, res.Outcome)
	require.ErrorIs(t, dep.Restart(ctx, 2), strategy.ErrNodeRange)
	require.Panics(t, func() { dep.Node(2) })
	require.NoError(t, dep.Close())
	_, err = dep.Node(0).Reserve(ctx, req)
	require.ErrorIs(t, err, strategy.ErrNodeClosed)
	require.ErrorIs(t, dep.Restart(ctx, 0), strategy.ErrNodeClosed)
}
