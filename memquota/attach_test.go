package memquota_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/memquota"
	"github.com/reservebench/reservebench/strategy"
)

// TestAttach: a second process attached to loaded stock writes nothing and
// starts its counters as a restart would: from config, the whole shares
// again (the same units counted by two processes); from the log, what is
// left of them. Stock that is missing or differs is a config error.
func TestAttach(t *testing.T) {
	ctx := testCtx(t)
	db := freshDB(t)
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			dep, sku := deploy(t, db, m.mode, 2, 10)
			require.Equal(t, map[string]int{"HELD": 3}, outcomes(sendAll(ctx, dep, distinct("a", sku, 0, 3))))
			second, err := memquota.New(memquota.Options{Restart: m.mode}).Attach(ctx, strategy.Config{DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: sku, Total: 10}}})
			require.NoError(t, err)
			defer second.Close()
			a := audit(t, second)
			require.Equal(t, 3, a.Active, "the same log")
			if m.mode == memquota.FromLog {
				require.Equal(t, []int{2, 5}, []int{a.Nodes[0].Available, a.Nodes[1].Available})
			} else {
				require.Equal(t, []int{5, 5}, []int{a.Nodes[0].Available, a.Nodes[1].Available}, "node 0's whole share again")
			}
			require.Equal(t, 7, audit(t, dep).Available, "the first process is not touched")
		})
	}
	for name, cfg := range map[string]strategy.Config{
		"unknown sku":      {DB: db, Stock: []strategy.Stock{{SKU: newSKU("never-loaded"), Total: 1}}},
		"other total":      {DB: db, Nodes: 2},
		"other node count": {DB: db, Nodes: 3},
	} {
		if cfg.Stock == nil {
			_, sku := deploy(t, db, memquota.FromLog, 2, 4)
			cfg.Stock = []strategy.Stock{{SKU: sku, Total: 4}}
			if name == "other total" {
				cfg.Stock[0].Total = 5
			}
		}
		_, err := memquota.Meta().Attach(ctx, cfg)
		require.ErrorIs(t, err, strategy.ErrConfig, name)
	}
}

// TestSessionExpireDue: the expiry job inside an attempt held open gives its
// units back when the attempt commits, to the nodes that sold them, and not
// at all when it rolls back; the rows then stay HELD and a rerun expires
// them once.
func TestSessionExpireDue(t *testing.T) {
	ctx := testCtx(t)
	dep, sku := deploy(t, freshDB(t), memquota.FromLog, 2, 10)
	calls := roundRobin(distinct("x", sku, 0, 4), 2)
	require.Equal(t, map[string]int{"HELD": 4}, outcomes(sendAll(ctx, dep, calls)))
	n, err := dep.MakeDue(ctx, []string{calls[0].req.Key, calls[1].req.Key})
	require.NoError(t, err)
	require.Equal(t, 2, n)

	s := openExpiry(t, ctx, dep, 1)
	units, err := s.ExpireDue(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, units)
	require.Equal(t, 6, audit(t, dep).Available, "nothing back before the commit")
	require.NoError(t, s.Rollback(ctx))
	require.Equal(t, 6, audit(t, dep).Available, "nothing back after a rollback")

	s = openExpiry(t, ctx, dep, 1)
	units, err = s.ExpireDue(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, units, "the rows stayed HELD")
	require.NoError(t, s.Commit(ctx))
	a := audit(t, dep)
	require.Equal(t, []int{4, 4}, []int{a.Nodes[0].Available, a.Nodes[1].Available}, "one unit back to each node that sold one")
	require.Equal(t, 0, a.Drift())
	units, err = dep.Node(0).(strategy.Expirer).ExpireDue(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, units)
}
