package rediscounter_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/rediscounter"
	"github.com/reservebench/reservebench/redistest"
	"github.com/reservebench/reservebench/strategy"
)

// TestExpirySweepsFailedRelease: a release whose give-back never reached
// Redis (here Redis refuses scripts by ACL while it runs) has moved its row
// and marked it unit_owed; its client does not send it again. The expiry
// job's next run gives that unit back, as the package doc says: the audit
// balances and a new buyer gets the unit. The kit resends every release
// that failed, which gives the unit back too, so only this test holds the
// job to it (outsider round 29's rcreleasenotowed, a release that no
// longer marked its row, passed the kit).
func TestExpirySweepsFailedRelease(t *testing.T) {
	if os.Getenv(redistest.EnvAddr) != "" {
		t.Skip("changes the ACL of its Redis: needs a throwaway one, not " + redistest.EnvAddr + "'s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, _ := pgtest.Pools(t)
	rs := redistest.New(t)
	rdb, err := rs.Client()
	require.NoError(t, err)
	defer rdb.Close()
	sku := fmt.Sprintf("sku-sweep-%d", time.Now().UnixNano())
	dep, err := rediscounter.Meta().Open(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 1}},
		Resources: map[strategy.Resource]string{strategy.Redis: rs.Addr()}})
	require.NoError(t, err)
	defer dep.Close()
	node := dep.Node(0)
	key := "req-" + sku
	res, err := node.Reserve(ctx, strategy.Request{Key: key, User: "user-sweep-1", SKU: sku, TTL: time.Hour})
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)

	require.NoError(t, rdb.Do(ctx, "ACL", "SETUSER", "default", "-@scripting").Err())
	_, relErr := node.(strategy.Releaser).Release(ctx, key)
	require.NoError(t, rdb.Do(ctx, "ACL", "SETUSER", "default", "+@all").Err())
	require.Error(t, relErr, "the release's give-back ran although Redis refused scripts")
	r, err := node.Lookup(ctx, key)
	require.NoError(t, err)
	require.Equal(t, strategy.StatusReleased, r.Status, "the release moved its row before its give-back failed")

	_, err = node.(strategy.Expirer).ExpireDue(ctx)
	require.NoError(t, err)
	a, err := dep.Audit(ctx)
	require.NoError(t, err)
	require.Len(t, a, 1)
	require.Equal(t, 0, a[0].Drift(), "after the expiry job: %+v", a[0])
	require.Equal(t, 1, a[0].Available, "after the expiry job: %+v", a[0])
	next, err := node.Reserve(ctx, strategy.Request{Key: "req2-" + sku, User: "user-sweep-2", SKU: sku, TTL: time.Hour})
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, next.Outcome)
}
