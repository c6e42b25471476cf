package hotrow_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/hotrow"
	"github.com/reservebench/reservebench/strategy"
)

var skuSeq atomic.Int64

// newSKU names a SKU no other test in this process uses.
func newSKU(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e9, skuSeq.Add(1))
}

// open deploys hotrow with opts over db: one SKU with total units.
func open(t *testing.T, db *pgxpool.Pool, opts hotrow.Options, nodes, total int) (*hotrow.Deployment, string) {
	t.Helper()
	sku := newSKU("sku")
	dep, err := hotrow.Open(context.Background(), strategy.Config{DB: db, Nodes: nodes, Stock: []strategy.Stock{{SKU: sku, Total: total}}}, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = dep.Close() })
	return dep, sku
}

// audit returns the one StockAudit of a single-SKU deployment and checks
// that it balances (drift 0, no oversell): the check after every case.
func audit(t *testing.T, dep strategy.Deployment) strategy.StockAudit {
	t.Helper()
	list, err := dep.Audit(context.Background())
	require.NoError(t, err)
	require.Len(t, list, 1)
	a := list[0]
	require.Zero(t, a.Drift(), "conservation: total %d - available %d - active %d", a.Total, a.Available, a.Active)
	require.Zero(t, a.Oversold(), "oversold: %d active for %d units", a.Active, a.Total)
	return a
}

// tally counts outcomes, and errors by SQLSTATE ("other" when none).
type tally struct {
	mu       sync.Mutex
	outcomes map[strategy.Outcome]int
	errs     map[string]int
	firstErr error
}

func newTally() *tally {
	return &tally{outcomes: map[strategy.Outcome]int{}, errs: map[string]int{}}
}

func (c *tally) add(res strategy.Result, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		code := "other"
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			code = pgErr.Code
		}
		c.errs[code]++
		if c.firstErr == nil {
			c.firstErr = err
		}
		return
	}
	c.outcomes[res.Outcome]++
}

func (c *tally) errors() int {
	n := 0
	for _, v := range c.errs {
		n += v
	}
	return n
}

func req(key, user, sku string) strategy.Request {
	return strategy.Request{Key: key, User: user, SKU: sku, TTL: strategy.TTLForever}
}

// blockedBy polls PostgreSQL's lock table, the way the isolation tester
// does, until backend pid waits on a lock; it returns the PIDs blocking it.
// The decision comes from pg_blocking_pids; the ticker only paces the
// question. It fails the test if the step finishes instead (done closes) or
// nothing blocks within 20s.
func blockedBy(t *testing.T, admin *pgxpool.Pool, pid uint32, done <-chan struct{}) []int32 {
	t.Helper()
	ctx := context.Background()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	for {
		var blockers []int32
		err := admin.QueryRow(ctx, `SELECT pg_blocking_pids($1)`, int32(pid)).Scan(&blockers)
		require.NoError(t, err)
		if len(blockers) > 0 {
			return blockers
		}
		select {
		case <-done:
			t.Fatalf("backend %d finished its step instead of waiting", pid)
		case <-deadline:
			t.Fatalf("backend %d neither finished nor waited on a lock within 20s", pid)
		case <-tick.C:
		}
	}
}

// waiterOn polls the lock table until some backend waits for holder (holder
// is among its pg_blocking_pids) and returns that backend's PID. It fails
// the test if done closes first or nothing waits within 20s.
func waiterOn(t *testing.T, admin *pgxpool.Pool, holder uint32, done <-chan struct{}) int32 {
	t.Helper()
	ctx := context.Background()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	for {
		var waiters []int32
		err := admin.QueryRow(ctx,
			`SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity WHERE $1::int4 = ANY (pg_blocking_pids(pid))`,
			int32(holder)).Scan(&waiters)
		require.NoError(t, err)
		if len(waiters) > 0 {
			return waiters[0]
		}
		select {
		case <-done:
			t.Fatalf("the step finished instead of waiting for backend %d", holder)
		case <-deadline:
			t.Fatalf("nothing waited for backend %d within 20s", holder)
		case <-tick.C:
		}
	}
}
