package rediscounter_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/rediscounter"
	"github.com/reservebench/reservebench/redistest"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

func TestMain(m *testing.M) { strategytest.Main(m) }

// TestConformance runs the whole kit against the registered variant, and
// against the others the scenarios in which what Redis keeps matters (their
// request path is the same code): each with a Redis configured as it needs.
// Table 28-1 runs every scenario against all four.
func TestConformance(t *testing.T) {
	strategytest.Run(t, rediscounter.Meta(), pgtest.Pools)
	for _, k := range rediscounter.Keeps[1:] {
		t.Run(string(k), func(t *testing.T) {
			strategytest.RunWith(t, rediscounter.New(rediscounter.Options{Keep: k}), pgtest.Pools,
				strategytest.Options{Only: []string{"restart", "restart-in-flight", "node-death", "redis-restart", "server-crash", "storm"}})
		})
	}
}

// TestRefusesRedisWithoutItsSettings: an AOF variant on a Redis without
// AOF is a config error, and writes nothing.
func TestRefusesRedisWithoutItsSettings(t *testing.T) {
	db, _ := pgtest.Pools(t)
	srv := redistest.New(t)
	cfg := strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: "s", Total: 1}}, Resources: map[strategy.Resource]string{strategy.Redis: srv.Addr()}}
	_, err := rediscounter.Open(context.Background(), cfg, rediscounter.Options{Keep: rediscounter.KeepAOFAlways})
	require.ErrorIs(t, err, strategy.ErrConfig)
	dep, err := rediscounter.Open(context.Background(), cfg, rediscounter.Options{})
	require.NoError(t, err, "the refused Open wrote stock")
	require.NoError(t, dep.Close())
}

// TestStorm is seed 002's input: 10,000 requests at once for 1 unit; the
// counter in Redis lets exactly one through.
func TestStorm(t *testing.T) {
	db, _ := pgtest.Pools(t)
	srv := redistest.New(t)
	ctx := context.Background()
	dep, err := rediscounter.Open(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: "storm", Total: 1}},
		Resources: map[strategy.Resource]string{strategy.Redis: srv.Addr()}}, rediscounter.Options{})
	require.NoError(t, err)
	defer dep.Close()
	out := make([]strategy.Outcome, 10_000)
	errs := make([]error, len(out))
	start := time.Now()
	strategytest.Together(len(out), func(i int) {
		res, err := dep.Node(0).Reserve(ctx, strategy.Request{Key: fmt.Sprintf("k%05d", i), User: fmt.Sprintf("u%05d", i), SKU: "storm", TTL: time.Hour})
		out[i], errs[i] = res.Outcome, err
	})
	got := map[strategy.Outcome]int{}
	for i := range out {
		require.NoError(t, errs[i])
		got[out[i]]++
	}
	t.Logf("10,000 requests in %v: %v", time.Since(start).Round(time.Millisecond), got)
	require.Equal(t, map[strategy.Outcome]int{strategy.OutcomeHeld: 1, strategy.OutcomeSoldOut: len(out) - 1}, got)
}
