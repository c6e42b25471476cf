package combine_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/combine"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
)

var skuSeq atomic.Int64

func newSKU() string { return fmt.Sprintf("sku-%d-%d", time.Now().UnixNano()%1e9, skuSeq.Add(1)) }

func req(key, user, sku string) strategy.Request {
	return strategy.Request{Key: key, User: user, SKU: sku, TTL: strategy.TTLForever}
}

func open(t *testing.T, db *pgxpool.Pool, total int) (*combine.Deployment, string) {
	t.Helper()
	sku := newSKU()
	dep, err := combine.Open(context.Background(), strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: sku, Total: total}}}, combine.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = dep.Close() })
	return dep, sku
}

type outcome struct {
	res strategy.Result
	err error
}

// holdRow opens a session that reserves one unit of sku and keeps its
// transaction open: the stock row stays locked until the caller commits or
// rolls it back, and every batch for sku waits for it.
func holdRow(t *testing.T, dep *combine.Deployment, sku string) strategy.Session {
	t.Helper()
	ctx := context.Background()
	s, err := dep.Node(0).(strategy.SessionOpener).OpenSession(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Rollback(ctx) })
	res, err := s.Reserve(ctx, req("holder-"+sku, "holder", sku))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)
	return s
}

// queueBehind sends one request, waits until its batch is seen waiting for
// the holder in PostgreSQL, then sends the others and waits until they all
// wait in the combiner: the next batch is exactly reqs[1:].
func queueBehind(t *testing.T, dep *combine.Deployment, admin *pgxpool.Pool, holder strategy.Session, sku string, reqs []strategy.Request) (out []chan outcome, firstBatchPID int32) {
	t.Helper()
	ctx := context.Background()
	send := func(r strategy.Request) chan outcome {
		ch := make(chan outcome, 1)
		go func() {
			res, err := dep.Node(0).Reserve(ctx, r)
			ch <- outcome{res, err}
		}()
		return ch
	}
	out = append(out, send(reqs[0]))
	firstBatchPID = waiterOn(t, admin, holder.Backends()[0])
	// One at a time, each seen in the queue before the next is sent: the
	// queue's order is then the slice's (arrival order ranks a batch).
	for i, r := range reqs[1:] {
		out = append(out, send(r))
		for deadline := time.Now().Add(20 * time.Second); dep.Queued(0, sku) < i+1; {
			require.True(t, time.Now().Before(deadline), "request %d did not reach the combiner's queue", i+1)
			time.Sleep(time.Millisecond) // paces the polling; the decision is the queue's length
		}
	}
	return out, firstBatchPID
}

// waiterOn polls the lock table until a backend waits for holder, and
// returns its PID.
func waiterOn(t *testing.T, admin *pgxpool.Pool, holder uint32) int32 {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		var pids []int32
		err := admin.QueryRow(context.Background(),
			`SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity WHERE $1::int4 = ANY (pg_blocking_pids(pid))`, int32(holder)).Scan(&pids)
		require.NoError(t, err)
		if len(pids) > 0 {
			return pids[0]
		}
		require.True(t, time.Now().Before(deadline), "nothing waited for the holder within 20s")
		time.Sleep(2 * time.Millisecond) // paces the question; the answer comes from pg_blocking_pids
	}
}

// TestOneBatchOneTransaction: requests that arrive while a batch is in
// flight form the next batch, and it serves all of them with one
// transaction: a replay and a partial fill in arrival order. A key or a
// user already in the batch waits for the next one, and gets the answer it
// would have got alone (KEY_REUSED, USER_LIMIT).
func TestOneBatchOneTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, admin := pgtest.Pools(t)
	dep, sku := open(t, db, 5)
	first, err := dep.Node(0).Reserve(ctx, req("k-old", "u-old", sku))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, first.Outcome)
	holder := holdRow(t, dep, sku) // 3 units left

	reqs := []strategy.Request{
		req("k-first", "u-first", sku), // batch 1, alone: waits for the holder
		req("k-old", "u-old", sku),     // REPLAY
		req("k-old", "u-other", sku),   // KEY_REUSED, next batch (same key as the one before)
		req("k-limit", "u-old", sku),   // USER_LIMIT
		req("k-a", "u-a", sku),         // HELD: the last unit after k-first
		req("k-b", "u-b", sku),         // SOLD_OUT: partial fill
		req("k-a2", "u-a", sku),        // u-a twice: next batch, then USER_LIMIT
		req("k-c", "u-c", sku),         // SOLD_OUT
	}
	chans, _ := queueBehind(t, dep, admin, holder, sku, reqs)
	before := dep.BatchStats()
	require.NoError(t, holder.Commit(ctx))
	want := []strategy.Outcome{
		strategy.OutcomeHeld, strategy.OutcomeReplay, strategy.OutcomeKeyReused, strategy.OutcomeUserLimit,
		strategy.OutcomeHeld, strategy.OutcomeHeld, strategy.OutcomeUserLimit, strategy.OutcomeSoldOut,
	}
	for i, ch := range chans {
		o := <-ch
		require.NoError(t, o.err, reqs[i].Key)
		require.Equal(t, want[i], o.res.Outcome, "%s (user %s)", reqs[i].Key, reqs[i].User)
	}
	after := dep.BatchStats()
	// Batch 1 was counted before the commit; then batches 2 (4 requests)
	// and 3 (3 requests).
	require.Equal(t, int64(2), after.Batches-before.Batches, "batches after the holder's commit: %+v", after)
	require.Equal(t, int64(len(reqs)-1), after.Requests-before.Requests)
	require.Equal(t, int64(4), after.Largest)
	a, err := dep.Audit(ctx)
	require.NoError(t, err)
	require.Equal(t, strategy.StockAudit{SKU: sku, Total: 5, Available: 0, Active: 5}, a[0])
}

// TestBlastRadius: a batch that fails answers every request in it with an
// error, an unknown outcome: here its backend is terminated while the batch
// waits for the row, so nothing was written, and the same requests sent
// again are served. One failure, as many unknown answers as the batch had
// requests.
func TestBlastRadius(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, admin := pgtest.Pools(t)
	dep, sku := open(t, db, 20)
	holder := holdRow(t, dep, sku)
	var reqs []strategy.Request
	for i := 0; i < 9; i++ {
		reqs = append(reqs, req(fmt.Sprintf("k-%d", i), fmt.Sprintf("u-%d", i), sku))
	}
	chans, pid := queueBehind(t, dep, admin, holder, sku, reqs)
	_, err := admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	require.Error(t, (<-chans[0]).err, "the first batch's one request")
	// The second batch (8 requests) is now sent and waits for the holder too.
	pid = waiterOn(t, admin, holder.Backends()[0])
	_, err = admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	failed := 0
	for _, ch := range chans[1:] {
		if o := <-ch; o.err != nil {
			failed++
		}
	}
	require.Equal(t, 8, failed, "one failed batch: every request in it unknown")
	require.NoError(t, holder.Commit(ctx))
	var wg sync.WaitGroup
	for _, r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := dep.Node(0).Lookup(ctx, r.Key)
			require.NoError(t, err)
			require.Equal(t, strategy.StatusNotFound, got.Status, "a batch that failed before its commit wrote nothing")
			res, err := dep.Node(0).Reserve(ctx, r)
			require.NoError(t, err)
			require.Equal(t, strategy.OutcomeHeld, res.Outcome, "resolved by sending the same request again")
		}()
	}
	wg.Wait()
	a, err := dep.Audit(ctx)
	require.NoError(t, err)
	require.Zero(t, a[0].Drift())
	require.Equal(t, 10, a[0].Active)
}
