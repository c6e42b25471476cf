package hotrow_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/hotrow"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

// TestContention is C28-13: 120 users at once, one request each, for 40
// units over 2 nodes. Every decrement queues on the one stock row and sees
// the available left by the one committed before it.
func TestContention(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.Pools(t)
	dep, sku := open(t, db, hotrow.Options{}, 2, 40)
	ctx := context.Background()

	got := newTally()
	strategytest.Together(120, func(i int) {
		got.add(dep.Node(i%2).Reserve(ctx, req(fmt.Sprintf("req-%03d", i), fmt.Sprintf("user-%03d", i), sku)))
	})
	require.Zero(t, got.errors(), "errors %v, first: %v", got.errs, got.firstErr)
	require.Equal(t, map[strategy.Outcome]int{strategy.OutcomeHeld: 40, strategy.OutcomeSoldOut: 80}, got.outcomes)
	a := audit(t, dep)
	require.Equal(t, 0, a.Available)
	require.Equal(t, 40, a.Active)
	require.Zero(t, dep.Retries(), "READ COMMITTED re-evaluates the WHERE; it never needs a retry here")
}

// TestStorm is seed 002's shape: 10,000 requests at once for 1 unit, through
// a pool of 16 connections. Exactly one is HELD, and while it runs the
// database never has more than 16 backends of the strategy's pool: the
// 10,000 goroutines queue on the pool, not on PostgreSQL.
//
// Under the race detector this is the slowest test of the package (about
// 10s of its runtime); it keeps the full 10,000 because the bound is the
// point. Each request runs begin, savepoint, insert, update (0 rows once the
// unit is gone: no lock is taken on a row whose available is 0), rollback to
// the savepoint, commit.
func TestStorm(t *testing.T) {
	t.Parallel()
	const (
		requests = 10_000
		maxConns = 16
		appName  = "hotrow-storm"
	)
	d := pgtest.NewDatabase(t)
	cfg, err := pgxpool.ParseConfig(d.DSN)
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	ctx := context.Background()
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	admin := d.AdminPool(t, 1)

	dep, sku := open(t, db, hotrow.Options{}, 2, 1)

	// Sample the backends of the strategy's pool until the storm is over.
	// Sampling observes; it synchronises nothing.
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	var peakBackends, peakPool, samples int
	var sampleErr error
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			var n int
			if err := admin.QueryRow(ctx,
				`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`,
				appName).Scan(&n); err != nil {
				sampleErr = err
				return
			}
			samples++
			peakBackends = max(peakBackends, n)
			peakPool = max(peakPool, int(db.Stat().TotalConns()))
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()

	got := newTally()
	start := time.Now()
	strategytest.Together(requests, func(i int) {
		got.add(dep.Node(i%2).Reserve(ctx, req(fmt.Sprintf("storm-%05d", i), fmt.Sprintf("user-%05d", i), sku)))
	})
	elapsed := time.Since(start)
	close(stop)
	sampler.Wait()
	require.NoError(t, sampleErr)

	require.Zero(t, got.errors(), "errors %v, first: %v", got.errs, got.firstErr)
	require.Equal(t, map[strategy.Outcome]int{strategy.OutcomeHeld: 1, strategy.OutcomeSoldOut: requests - 1}, got.outcomes)
	a := audit(t, dep)
	require.Equal(t, 1, a.Active)
	require.Equal(t, 0, a.Available)

	t.Logf("%d requests in %v; peak %d backends of the pool in pg_stat_activity over %d samples, peak pool size %d (MaxConns %d)",
		requests, elapsed.Round(time.Millisecond), peakBackends, samples, peakPool, maxConns)
	require.LessOrEqual(t, peakBackends, maxConns, "more backends than the pool allows")
	require.LessOrEqual(t, peakPool, maxConns)
	require.Greater(t, peakBackends, 1, "the sampler never saw the storm's connections")
}
