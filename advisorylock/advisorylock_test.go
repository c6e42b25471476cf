package advisorylock_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/advisorylock"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestConformance runs every scenario of table 28-1 and checks each claim.
func TestConformance(t *testing.T) {
	strategytest.Run(t, advisorylock.Meta(), pgtest.Pools)
}

// TestPhantomWaitsInsteadOfSellingOut shows the boundary in the package doc:
// in the seed's ordering (C28-14) t2 and t3 wait for t1's SKU lock, and get
// both units after t1 rolls back.
func TestPhantomWaitsInsteadOfSellingOut(t *testing.T) {
	db, admin := pgtest.Pools(t)
	r, err := strategytest.RunScenario(context.Background(), strategytest.Env{Meta: advisorylock.Meta(), DB: db, Admin: admin}, strategytest.MustScenario("phantom"))
	require.NoError(t, err)
	require.Equal(t, "t1 HELD (rolled back); t2 HELD after waiting; t3 HELD after waiting; 0 free at end",
		r.Fact("seed order: t1.reserve, t2, t3, t1.end"))
	require.Empty(t, r.Violations())
}
