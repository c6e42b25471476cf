package memquota_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/memquota"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
)

var skuSeq atomic.Int64

// newSKU names a SKU no other test uses.
func newSKU(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e9, skuSeq.Add(1))
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// deploy opens strategy C over db with one SKU of total units on nodes nodes.
func deploy(t *testing.T, db *pgxpool.Pool, mode memquota.RestartMode, nodes, total int) (*memquota.Deployment, string) {
	t.Helper()
	sku := newSKU("sku")
	dep, err := memquota.Open(testCtx(t), strategy.Config{DB: db, Nodes: nodes, Stock: []strategy.Stock{{SKU: sku, Total: total}}}, memquota.Options{Restart: mode})
	require.NoError(t, err)
	t.Cleanup(func() { _ = dep.Close() })
	return dep, sku
}

// call is one request sent to one node.
type call struct {
	node int
	req  strategy.Request
}

type answer struct {
	res strategy.Result
	err error
}

// sendAll sends every call at once (all goroutines released together) and
// returns the answers in the order of calls.
func sendAll(ctx context.Context, dep strategy.Deployment, calls []call) []answer {
	out := make([]answer, len(calls))
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	ready.Add(len(calls))
	done.Add(len(calls))
	for i, c := range calls {
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			res, err := dep.Node(c.node).Reserve(ctx, c.req)
			out[i] = answer{res, err}
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
	return out
}

// outcomes counts the answers by outcome; errors count as "error".
func outcomes(as []answer) map[string]int {
	m := map[string]int{}
	for _, a := range as {
		if a.err != nil {
			m["error"]++
			continue
		}
		m[string(a.res.Outcome)]++
	}
	return m
}

// distinct builds n requests with their own keys and users, all for node.
func distinct(prefix, sku string, node, n int) []call {
	calls := make([]call, n)
	for i := range calls {
		calls[i] = call{node: node, req: strategy.Request{
			Key: fmt.Sprintf("%s-key-%05d-%s", prefix, i, sku), User: fmt.Sprintf("%s-user-%05d", prefix, i), SKU: sku, TTL: strategy.TTLForever,
		}}
	}
	return calls
}

// roundRobin spreads calls over nodes nodes.
func roundRobin(calls []call, nodes int) []call {
	for i := range calls {
		calls[i].node = i % nodes
	}
	return calls
}

// audit returns the audit of the deployment's only SKU.
func audit(t *testing.T, dep strategy.Deployment) strategy.StockAudit {
	t.Helper()
	list, err := dep.Audit(testCtx(t))
	require.NoError(t, err)
	require.Len(t, list, 1)
	return list[0]
}

// shared is one database for the package's own tests: every test uses SKUs
// of its own, and deployments with disjoint SKUs may share a database. It
// saves creating a database per test; the server is dropped after the tests.
var shared struct {
	once  sync.Once
	pool  *pgxpool.Pool // the application role, at most 32 connections
	admin *pgxpool.Pool // the superuser, for lock probes
	err   error
}

func sharedDB(t *testing.T) (db, admin *pgxpool.Pool) {
	t.Helper()
	srv := pgtest.Shared(t)
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var d *pgtest.Database
		if d, shared.err = srv.CreateDatabase(ctx, "rb_memquota"); shared.err != nil {
			return
		}
		if shared.pool, shared.err = pgtest.OpenPool(ctx, d.DSN, 32); shared.err != nil {
			return
		}
		shared.admin, shared.err = pgtest.OpenPool(ctx, d.AdminDSN, 4)
	})
	require.NoError(t, shared.err)
	return shared.pool, shared.admin
}

// freshDB returns the shared database as the application role.
func freshDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	db, _ := sharedDB(t)
	return db
}

// awaitBlocked waits until n backends are blocked by the backend pid, as
// pg_blocking_pids reports them: the decision comes from the server's lock
// table, the ticker only paces the question (as PostgreSQL's isolation
// tester does).
func awaitBlocked(t *testing.T, admin *pgxpool.Pool, pid uint32, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var blocked int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, int32(pid)).Scan(&blocked)
		require.NoError(t, err)
		if blocked >= n {
			require.Equal(t, n, blocked, "backends blocked by %d", pid)
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d backends blocked by %d after 20s", blocked, n, pid)
		case <-tick.C:
		}
	}
}

// awaitSyncRep waits until a backend of the database waits for synchronous
// replication (true), or done has a value (false: the request finished
// first). done is left for the caller to read.
func awaitSyncRep(t *testing.T, admin *pgxpool.Pool, done chan error) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var n int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'SyncRep'`).Scan(&n)
		require.NoError(t, err)
		if n > 0 {
			return true
		}
		select {
		case err := <-done:
			done <- err
			return false
		case <-ctx.Done():
			t.Fatal("the request neither finished nor waited for the standby")
		case <-tick.C:
		}
	}
}
