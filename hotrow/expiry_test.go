package hotrow_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/hotrow"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

// holdN makes n HELD reservations on the deployment's SKU and returns their keys.
func holdN(t *testing.T, dep *hotrow.Deployment, sku string, n int) []string {
	t.Helper()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("hold-%s-%02d", sku, i)
		res, err := dep.Node(i%2).Reserve(context.Background(), req(keys[i], fmt.Sprintf("user-%02d", i), sku))
		require.NoError(t, err)
		require.Equal(t, strategy.OutcomeHeld, res.Outcome)
	}
	return keys
}

func statuses(t *testing.T, n strategy.Strategy, keys []string) map[strategy.Status]int {
	t.Helper()
	out := map[strategy.Status]int{}
	for _, k := range keys {
		r, err := n.Lookup(context.Background(), k)
		require.NoError(t, err)
		out[r.Status]++
	}
	return out
}

// TestExpiryReplay is C28-07 with the seed's numbers: 20 held, 8 due: the
// expiry returns 8; a replay 0; 4 concurrent replays 0 in total; the other
// 12 become due and 4 concurrent runs return exactly 12 in total. Every
// count is checked against the audit too, not only against what the job
// reports.
func TestExpiryReplay(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.Pools(t)
	ctx := context.Background()
	dep, sku := open(t, db, hotrow.Options{}, 2, 40)
	keys := holdN(t, dep, sku, 20)
	expire := func(i int) int {
		units, err := dep.Node(i % 2).(strategy.Expirer).ExpireDue(ctx)
		assert.NoError(t, err) // also runs in goroutines: no FailNow
		return units
	}
	concurrentExpire := func() int {
		var total atomic.Int64
		strategytest.Together(4, func(i int) { total.Add(int64(expire(i))) })
		return int(total.Load())
	}
	available := func() int { return audit(t, dep).Available }

	n, err := dep.MakeDue(ctx, keys[:8])
	require.NoError(t, err)
	require.Equal(t, 8, n)
	require.Equal(t, 20, available())

	require.Equal(t, 8, expire(0), "first run returns the 8 due units")
	require.Equal(t, 28, available())
	require.Equal(t, 0, expire(1), "a replay returns nothing")
	require.Equal(t, 0, concurrentExpire(), "4 concurrent replays return nothing in total")
	require.Equal(t, 28, available())

	n, err = dep.MakeDue(ctx, keys[8:])
	require.NoError(t, err)
	require.Equal(t, 12, n)
	require.Equal(t, 12, concurrentExpire(), "4 concurrent runs return exactly the 12 due units")
	require.Equal(t, 40, available())
	require.Equal(t, map[strategy.Status]int{strategy.StatusExpired: 20}, statuses(t, dep.Node(0), keys))

	n, err = dep.MakeDue(ctx, keys)
	require.NoError(t, err)
	require.Zero(t, n, "MakeDue moves HELD rows only")
	require.Zero(t, dep.Retries())
}

// TestConfirmVsExpire is C28-08: 40 due HELD rows; 4 confirmers (the late
// payment callback, ConfirmUntilExpired) and 4 expiry jobs race for them.
// Each row ends CONFIRMED or EXPIRED, never both, never neither; units come
// back only for EXPIRED rows. Repeated 5 times; the split varies.
func TestConfirmVsExpire(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.Pools(t)
	ctx := context.Background()
	for trial := 1; trial <= 5; trial++ {
		dep, sku := open(t, db, hotrow.Options{}, 2, 40)
		keys := holdN(t, dep, sku, 40)
		n, err := dep.MakeDue(ctx, keys)
		require.NoError(t, err)
		require.Equal(t, 40, n)

		queue := make(chan string, len(keys))
		for _, i := range rand.Perm(len(keys)) {
			queue <- keys[i]
		}
		close(queue)
		var mu sync.Mutex
		confirmedByCall := map[string]bool{}
		var expiredUnits atomic.Int64
		strategytest.Together(8, func(i int) {
			if i < 4 {
				c := dep.Node(i % 2).(strategy.Confirmer)
				for k := range queue {
					moved, err := c.Confirm(ctx, k, strategy.ConfirmUntilExpired)
					assert.NoError(t, err)
					if moved {
						mu.Lock()
						confirmedByCall[k] = true
						mu.Unlock()
					}
				}
				return
			}
			units, err := dep.Node(i % 2).(strategy.Expirer).ExpireDue(ctx)
			assert.NoError(t, err)
			expiredUnits.Add(int64(units))
		})
		st := statuses(t, dep.Node(0), keys)
		confirmed, expired := st[strategy.StatusConfirmed], st[strategy.StatusExpired]
		require.Equal(t, 40, confirmed+expired, "trial %d: statuses %v", trial, st)
		require.Len(t, confirmedByCall, confirmed, "trial %d: confirm calls that moved a row == CONFIRMED rows", trial)
		for k := range confirmedByCall {
			r, err := dep.Node(1).Lookup(ctx, k)
			require.NoError(t, err)
			require.Equal(t, strategy.StatusConfirmed, r.Status)
		}
		require.EqualValues(t, expired, expiredUnits.Load(), "trial %d: units reported == EXPIRED rows", trial)
		a := audit(t, dep)
		require.Equal(t, expired, a.Available, "trial %d: units came back only for EXPIRED rows", trial)
		require.Equal(t, confirmed, a.Active)
		t.Logf("trial %d: confirmed %d + expired %d = 40; available %d", trial, confirmed, expired, a.Available)
		require.NoError(t, dep.Close())
	}
}

// TestConfirmModes: ConfirmBeforeExpiry refuses a due reservation that
// ConfirmUntilExpired still confirms; neither confirms a row twice, nor a
// released or expired one. A confirmed reservation keeps its unit: release
// and expiry do not touch it.
func TestConfirmModes(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.Pools(t)
	ctx := context.Background()
	dep, sku := open(t, db, hotrow.Options{}, 2, 5)
	keys := holdN(t, dep, sku, 4)
	n := dep.Node(0)
	c := n.(strategy.Confirmer)

	moved, err := c.Confirm(ctx, keys[0], strategy.ConfirmBeforeExpiry)
	require.NoError(t, err)
	require.True(t, moved, "HELD and not due: confirmed")
	moved, err = c.Confirm(ctx, keys[0], strategy.ConfirmUntilExpired)
	require.NoError(t, err)
	require.False(t, moved, "already CONFIRMED")

	_, err = dep.MakeDue(ctx, keys[1:3])
	require.NoError(t, err)
	moved, err = c.Confirm(ctx, keys[1], strategy.ConfirmBeforeExpiry)
	require.NoError(t, err)
	require.False(t, moved, "due: ConfirmBeforeExpiry refuses")
	moved, err = c.Confirm(ctx, keys[1], strategy.ConfirmUntilExpired)
	require.NoError(t, err)
	require.True(t, moved, "due but not expired yet: the late callback wins")

	units, err := n.(strategy.Expirer).ExpireDue(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, units, "only keys[2] was still HELD and due")
	moved, err = c.Confirm(ctx, keys[2], strategy.ConfirmUntilExpired)
	require.NoError(t, err)
	require.False(t, moved, "EXPIRED cannot be confirmed")

	units, err = n.(strategy.Releaser).Release(ctx, keys[0])
	require.NoError(t, err)
	require.Zero(t, units, "CONFIRMED is not released")

	units, err = n.(strategy.Releaser).Release(ctx, keys[3])
	require.NoError(t, err)
	require.Equal(t, 1, units)
	moved, err = c.Confirm(ctx, keys[3], strategy.ConfirmUntilExpired)
	require.NoError(t, err)
	require.False(t, moved, "RELEASED cannot be confirmed")

	for _, k := range []string{"no-such-key", "bad-\xff", "nul\x00"} {
		moved, err = c.Confirm(ctx, k, strategy.ConfirmUntilExpired)
		require.NoError(t, err)
		require.False(t, moved)
		units, err = n.(strategy.Releaser).Release(ctx, k)
		require.NoError(t, err)
		require.Zero(t, units)
		r, err := n.Lookup(ctx, k)
		require.NoError(t, err)
		require.Equal(t, strategy.StatusNotFound, r.Status)
	}

	a := audit(t, dep)
	require.Equal(t, 2, a.Active, "keys[0] and keys[1] CONFIRMED")
	require.Equal(t, 3, a.Available)
}

// TestReleaseReplay: a release returns its unit once; a replay returns 0,
// so do 4 concurrent replays; of 4 concurrent first releases exactly one
// returns the unit.
func TestReleaseReplay(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.Pools(t)
	ctx := context.Background()
	dep, sku := open(t, db, hotrow.Options{}, 2, 5)
	keys := holdN(t, dep, sku, 2)
	release := func(i int, key string) int {
		units, err := dep.Node(i%2).(strategy.Releaser).Release(ctx, key)
		assert.NoError(t, err) // also runs in goroutines: no FailNow
		return units
	}
	concurrentRelease := func(key string) int {
		var total atomic.Int64
		strategytest.Together(4, func(i int) { total.Add(int64(release(i, key))) })
		return int(total.Load())
	}

	require.Equal(t, 1, release(0, keys[0]))
	require.Equal(t, 0, release(1, keys[0]), "replay")
	require.Equal(t, 0, concurrentRelease(keys[0]), "4 concurrent replays")
	require.Equal(t, 1, concurrentRelease(keys[1]), "4 concurrent first releases: exactly one moves the row")
	require.Equal(t, 0, release(0, keys[1]))

	a := audit(t, dep)
	require.Equal(t, 5, a.Available)
	require.Equal(t, map[strategy.Status]int{strategy.StatusReleased: 2}, statuses(t, dep.Node(0), keys))

	// The user may hold again: RELEASED is not active.
	res, err := dep.Node(0).Reserve(ctx, req("again", "user-00", sku))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)
}
