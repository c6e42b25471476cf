package redislock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/redislock"
	"github.com/reservebench/reservebench/redistest"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

func TestMain(m *testing.M) { strategytest.Main(m) }

// TestConformance runs every scenario of table 28-1, the lock faults of
// seed 002 among them, against redislock's claims.
func TestConformance(t *testing.T) {
	strategytest.Run(t, redislock.Meta(), pgtest.Pools)
}

func open(t *testing.T, opts redislock.Options, total int) (*redislock.Deployment, *redistest.Server, string) {
	t.Helper()
	db, _ := pgtest.Pools(t)
	srv := redistest.New(t)
	sku := fmt.Sprintf("sku-%d", time.Now().UnixNano())
	dep, err := redislock.Open(context.Background(), strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: sku, Total: total}},
		Resources: map[strategy.Resource]string{strategy.Redis: srv.Addr()}}, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = dep.Close() })
	return dep, srv, sku
}

// TestStorm is seed 002's run: 10,000 requests at once for 1 unit end in
// exactly 1 reservation; every other answer is a definite refusal.
func TestStorm(t *testing.T) {
	dep, _, sku := open(t, redislock.Options{}, 1)
	ctx := context.Background()
	got := map[strategy.Outcome]int{}
	results := make([]strategy.Outcome, 10_000)
	errs := make([]error, len(results))
	start := time.Now()
	strategytest.Together(len(results), func(i int) {
		res, err := dep.Node(0).Reserve(ctx, strategy.Request{Key: fmt.Sprintf("k%05d", i), User: fmt.Sprintf("u%05d", i), SKU: sku, TTL: time.Hour})
		results[i], errs[i] = res.Outcome, err
	})
	for i := range results {
		require.NoError(t, errs[i])
		got[results[i]]++
	}
	t.Logf("10,000 requests in %v: %v", time.Since(start).Round(time.Millisecond), got)
	require.Equal(t, 1, got[strategy.OutcomeHeld])
	require.Equal(t, len(results)-1, got[strategy.OutcomeSoldOut]+got[strategy.OutcomeBusy])
	a, err := dep.Audit(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, a[0].Active)
	require.Zero(t, a[0].Available)
}

// TestBusy: a request that cannot get the SKU's lock within the wait
// bound, or finds Redis down, is BUSY and writes nothing.
func TestBusy(t *testing.T) {
	ctx := context.Background()
	dep, srv, sku := open(t, redislock.Options{Wait: 100 * time.Millisecond}, 5)
	s, err := dep.Node(0).(strategy.SessionOpener).OpenSession(ctx)
	require.NoError(t, err)
	res, err := s.Reserve(ctx, strategy.Request{Key: "holder", User: "u0", SKU: sku, TTL: time.Hour})
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)

	req := strategy.Request{Key: "waiter", User: "u1", SKU: sku, TTL: time.Hour}
	res, err = dep.Node(0).Reserve(ctx, req)
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeBusy, res.Outcome, "the holder keeps the lock until its commit")
	r, err := dep.Node(0).Lookup(ctx, req.Key)
	require.NoError(t, err)
	require.Equal(t, strategy.StatusNotFound, r.Status)

	require.NoError(t, s.Commit(ctx))
	res, err = dep.Node(0).Reserve(ctx, req)
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome, "the commit released the lock")

	require.NoError(t, srv.Kill(ctx))
	down := strategy.Request{Key: "down", User: "u2", SKU: sku, TTL: time.Hour}
	res, err = dep.Node(0).Reserve(ctx, down)
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeBusy, res.Outcome, "Redis down")
	r, err = dep.Node(0).Lookup(ctx, down.Key)
	require.NoError(t, err)
	require.Equal(t, strategy.StatusNotFound, r.Status)
	require.NoError(t, srv.Restart(ctx))
	res, err = dep.Node(0).Reserve(ctx, down)
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome, "served again once Redis is back")
}

// TestOpenNeedsRedis: without a Redis address Open refuses the config and
// writes nothing.
func TestOpenNeedsRedis(t *testing.T) {
	db, _ := pgtest.Pools(t)
	_, err := redislock.Open(context.Background(), strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: "s", Total: 1}}}, redislock.Options{})
	require.ErrorIs(t, err, strategy.ErrMissingResource)
	require.ErrorIs(t, err, strategy.ErrConfig)
}

// TestTwinForTheLastUnit: two copies of one request (same key, user and
// SKU) sent at once for a SKU's last unit. The one that waits for the
// SKU's lock read its key unknown and a unit left before the other
// committed; under the lock the unit is gone, and the key is its own:
// REPLAY (or BUSY, had the lock not come within its bound), never
// SOLD_OUT. Before the key was looked up again there (and after the
// unlocked pre-check, which reads the key and the stock in two statements),
// 23 to 31 of the 40 pairs answered SOLD_OUT in each of four runs.
func TestTwinForTheLastUnit(t *testing.T) {
	const pairs = 40
	db, _ := pgtest.Pools(t)
	srv := redistest.New(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("twin-%d", time.Now().UnixNano())
	var stock []strategy.Stock
	for i := 0; i < pairs; i++ {
		stock = append(stock, strategy.Stock{SKU: fmt.Sprintf("%s-%02d", prefix, i), Total: 1})
	}
	dep, err := redislock.Open(ctx, strategy.Config{DB: db, Nodes: 2, Stock: stock, Resources: map[strategy.Resource]string{strategy.Redis: srv.Addr()}}, redislock.Options{})
	require.NoError(t, err)
	defer dep.Close()
	results := make([]strategy.Result, 2*pairs)
	errs := make([]error, len(results))
	strategytest.Together(len(results), func(i int) {
		sku := stock[i/2].SKU
		results[i], errs[i] = dep.Node(i%2).Reserve(ctx, strategy.Request{Key: sku + "-k", User: "u", SKU: sku, TTL: time.Hour})
	})
	soldOut := 0
	for p := 0; p < pairs; p++ {
		var held int
		for _, i := range []int{2 * p, 2*p + 1} {
			require.NoError(t, errs[i])
			switch results[i].Outcome {
			case strategy.OutcomeHeld:
				held++
			case strategy.OutcomeSoldOut:
				soldOut++
			}
		}
		require.Equal(t, 1, held, "pair %d: %s and %s", p, results[2*p].Outcome, results[2*p+1].Outcome)
	}
	require.Zero(t, soldOut, "twins answered SOLD_OUT for the unit their own key holds")
}
