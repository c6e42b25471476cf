package memquota_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/memquota"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/pgtest/pgproxy"
	"github.com/reservebench/reservebench/strategy"
)

// TestReleaseInDoubtSettles: a release whose connection breaks once the
// server has executed its UPDATE (a proxy cuts it there) committed, and its
// client cannot tell. Its unit is then in neither place (drift +1) until
// Settle reads from the log which row the release moved, once its backend
// is gone; then it is back, once, on the node that sold it. Found by the
// soak (make soak): before the fix the unit stayed lost.
func TestReleaseInDoubtSettles(t *testing.T) {
	ctx := testCtx(t)
	d := pgtest.NewDatabase(t)
	cfg, err := pgxpool.ParseConfig(d.DSN)
	require.NoError(t, err)
	p, err := pgproxy.Start(cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = p.Addr()
	cfg.ConnConfig.Fallbacks = nil
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	admin := d.AdminPool(t, 2)

	for _, mode := range []memquota.RestartMode{memquota.FromConfig, memquota.FromLog} {
		dep, sku := deploy(t, pool, mode, 2, 4)
		req := strategy.Request{Key: "k-" + sku, User: "u", SKU: sku, TTL: time.Minute}
		res, err := dep.Node(0).Reserve(ctx, req)
		require.NoError(t, err)
		require.Equal(t, strategy.OutcomeHeld, res.Outcome)

		p.Arm(pgproxy.Fault{Point: pgproxy.Write, Action: pgproxy.Drop, Hits: 1})
		_, err = dep.Node(1).(strategy.Releaser).Release(ctx, req.Key)
		require.Error(t, err, "the release's answer never arrived")
		h := <-p.Hits()
		r, err := dep.Node(0).Lookup(ctx, req.Key)
		require.NoError(t, err)
		require.Equal(t, strategy.StatusReleased, r.Status, "the release committed")
		require.Equal(t, 1, audit(t, dep).Drift(), "the unit is out of memory and in no active row")

		for gone := false; !gone; time.Sleep(5 * time.Millisecond) { // paces the question; the answer decides
			var n int
			require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", h.Backend).Scan(&n))
			gone = n == 0
		}
		back, err := dep.Settle(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, back)
		a := audit(t, dep)
		require.Equal(t, 0, a.Drift())
		require.Equal(t, 4, a.Available)
		require.Equal(t, 2, a.Nodes[0].Available, "back on node 0, which sold it")
		back, err = dep.Settle(ctx)
		require.NoError(t, err)
		require.Zero(t, back, "settled once")
	}
}
