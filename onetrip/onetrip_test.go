package onetrip_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/hotrow"
	"github.com/reservebench/reservebench/onetrip"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
)

var skuSeq atomic.Int64

func newSKU() string { return fmt.Sprintf("sku-%d-%d", time.Now().UnixNano()%1e9, skuSeq.Add(1)) }

func req(key, user, sku string) strategy.Request {
	return strategy.Request{Key: key, User: user, SKU: sku, TTL: strategy.TTLForever}
}

// trips counts what a pool sends: each Query/Exec and each Prepare is one
// round trip (bench counts them the same way).
type trips struct{ n atomic.Int64 }

func (c *trips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *trips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *trips) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *trips) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// TestRoundTrips: HELD is one round trip; REPLAY, KEY_REUSED and
// USER_LIMIT two (the statement, refused, then the question why). SOLD_OUT
// is two the first time a node meets the empty SKU, and one after that: the
// node sends the question first while it last found the SKU empty.
// Before each case a HELD request on another key warms the connection:
// pgx prepares a statement again after it failed, and that trip belongs to
// the warm-up, not to the case.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.NewDatabase(t)
	cfg, err := pgxpool.ParseConfig(d.DSN)
	require.NoError(t, err)
	cfg.MaxConns = 1 // one connection: its statement cache is warm after the first round
	counter := &trips{}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	sku, empty := newSKU(), newSKU()
	dep, err := onetrip.Open(ctx, strategy.Config{DB: pool, Stock: []strategy.Stock{{SKU: sku, Total: 100}, {SKU: empty, Total: 0}}}, onetrip.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = dep.Close() })

	warm := 0
	for round := 0; round < 2; round++ {
		r := fmt.Sprint(round)
		cases := []struct {
			name  string
			req   strategy.Request
			want  strategy.Outcome
			trips int64
		}{
			{"held", req("k-"+r, "u-"+r, sku), strategy.OutcomeHeld, 1},
			{"replay", req("k-"+r, "u-"+r, sku), strategy.OutcomeReplay, 2},
			{"key reused", req("k-"+r, "v-"+r, sku), strategy.OutcomeKeyReused, 2},
			{"user limit", req("k2-"+r, "u-"+r, sku), strategy.OutcomeUserLimit, 2},
			{"sold out", req("k3-"+r, "w-"+r, empty), strategy.OutcomeSoldOut, 2 - int64(round)},
		}
		for _, c := range cases {
			warm++
			res, err := dep.Node(0).Reserve(ctx, req(fmt.Sprint("warm-", warm), fmt.Sprint("warm-", warm), sku))
			require.NoError(t, err)
			require.Equal(t, strategy.OutcomeHeld, res.Outcome)
			before := counter.n.Load()
			res, err = dep.Node(0).Reserve(ctx, c.req)
			require.NoError(t, err, c.name)
			require.Equal(t, c.want, res.Outcome, c.name)
			if round == 1 || c.name == "sold out" {
				require.Equal(t, c.trips, counter.n.Load()-before, "%s, round %d: round trips", c.name, round)
			}
		}
	}
}

// TestNoMultiXactOnTheStockRow: while one attempt holds an uncommitted
// decrement, a second request for the same SKU waits on the stock row. In
// onetrip the stock row then has one locker, not a MultiXact: nothing
// takes a KEY SHARE lock on it (no foreign key), and the waiter's first
// step is the UPDATE itself. hotrow, whose reservation has a foreign key
// to the stock row and inserts before it updates, shows the MultiXact in
// the same situation: that is what this design removes.
func TestNoMultiXactOnTheStockRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, admin := pgtest.Pools(t)
	_, err := admin.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pgrowlocks`)
	require.NoError(t, err)
	for _, c := range []struct {
		meta  strategy.Meta
		table string
		multi bool
	}{
		{onetrip.Meta(), "onetrip_stock", false},
		{hotrow.Meta(), "sku_stock", true},
	} {
		t.Run(c.meta.Name, func(t *testing.T) {
			sku := newSKU()
			dep, err := c.meta.Open(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 5}}})
			require.NoError(t, err)
			defer dep.Close()
			holder, err := dep.Node(0).(strategy.SessionOpener).OpenSession(ctx)
			require.NoError(t, err)
			defer holder.Rollback(ctx) //nolint:errcheck // a no-op after Commit
			res, err := holder.Reserve(ctx, req("holder-"+sku, "u1", sku))
			require.NoError(t, err)
			require.Equal(t, strategy.OutcomeHeld, res.Outcome)

			done := make(chan error, 1)
			go func() {
				_, err := dep.Node(0).Reserve(ctx, req("waiter-"+sku, "u2", sku))
				done <- err
			}()
			waitFor(t, admin, holder.Backends()[0], done)

			var multi bool
			var lockers int
			err = admin.QueryRow(ctx, `SELECT bool_or(multi), coalesce(max(cardinality(pids)), 0)
				FROM pgrowlocks($1)`, c.table).Scan(&multi, &lockers)
			require.NoError(t, err)
			require.Equal(t, c.multi, multi, "%s: is the locked stock row a MultiXact?", c.table)
			if !c.multi {
				require.Equal(t, 1, lockers, "one locker of the stock row")
			}
			require.NoError(t, holder.Commit(ctx))
			require.NoError(t, <-done)
		})
	}
}

// waitFor polls the lock table, as the isolation tester does, until some
// backend waits for holder; it fails if the waiter finishes first.
func waitFor(t *testing.T, admin *pgxpool.Pool, holder uint32, done <-chan error) {
	t.Helper()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	for {
		var n int
		err := admin.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE $1::int4 = ANY (pg_blocking_pids(pid))`, int32(holder)).Scan(&n)
		require.NoError(t, err)
		if n > 0 {
			return
		}
		select {
		case err := <-done: // nil: never ready
			t.Fatalf("the second request finished instead of waiting: %v", err)
		case <-deadline:
			t.Fatal("nothing waited for the holder within 20s")
		case <-tick.C:
		}
	}
}

// TestLastUnitWhileWaiting: a request that saw a unit in its snapshot and
// waited for the row while another attempt took the last one is SOLD_OUT,
// and the reservation its statement had inserted is undone with it; if the
// other attempt rolls back instead, the waiter gets the unit. Requests sent
// afterwards on the same pool (whose cached statement the error dropped)
// are served as before.
func TestLastUnitWhileWaiting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, admin := pgtest.Pools(t)
	for _, end := range []string{"commit", "rollback"} {
		t.Run(end, func(t *testing.T) {
			sku := newSKU()
			dep, err := onetrip.Open(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 1}}}, onetrip.Options{})
			require.NoError(t, err)
			defer dep.Close()
			holder, err := dep.Node(0).(strategy.SessionOpener).OpenSession(ctx)
			require.NoError(t, err)
			defer holder.Rollback(ctx) //nolint:errcheck // a no-op after the end
			res, err := holder.Reserve(ctx, req("holder-"+sku, "u1", sku))
			require.NoError(t, err)
			require.Equal(t, strategy.OutcomeHeld, res.Outcome)

			type answer struct {
				res strategy.Result
				err error
			}
			done := make(chan answer, 1)
			go func() {
				res, err := dep.Node(0).Reserve(ctx, req("waiter-"+sku, "u2", sku))
				done <- answer{res, err}
			}()
			waitFor(t, admin, holder.Backends()[0], nil)
			want := strategy.OutcomeSoldOut
			if end == "commit" {
				require.NoError(t, holder.Commit(ctx))
			} else {
				require.NoError(t, holder.Rollback(ctx))
				want = strategy.OutcomeHeld
			}
			a := <-done
			require.NoError(t, a.err)
			require.Equal(t, want, a.res.Outcome)
			got, err := dep.Node(0).Lookup(ctx, "waiter-"+sku)
			require.NoError(t, err)
			if want == strategy.OutcomeSoldOut {
				require.Equal(t, strategy.StatusNotFound, got.Status, "the waiter's insert was undone with its statement")
			}
			audit, err := dep.Audit(ctx)
			require.NoError(t, err)
			require.Equal(t, strategy.StockAudit{SKU: sku, Total: 1, Available: 0, Active: 1}, audit[0])
			res, err = dep.Node(0).Reserve(ctx, req("after-"+sku, "u3", sku))
			require.NoError(t, err)
			require.Equal(t, strategy.OutcomeSoldOut, res.Outcome)
		})
	}
}

// TestSoldOutThenBack: a node that found the SKU empty asks first; once a
// unit comes back (a release, on another node) its next request holds it.
// The stock row cannot be deleted: sqlInsertAndTake relies on finding it.
func TestSoldOutThenBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := pgtest.Pools(t)
	sku := newSKU()
	dep, err := onetrip.Open(ctx, strategy.Config{DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: sku, Total: 1}}}, onetrip.Options{})
	require.NoError(t, err)
	defer dep.Close()
	a, b := dep.Node(0), dep.Node(1)
	res, err := a.Reserve(ctx, req("first-"+sku, "u1", sku))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)
	for i := range 2 { // the first meets the CHECK, the second asks first
		res, err = a.Reserve(ctx, req(fmt.Sprint("empty-", i, sku), fmt.Sprint("e", i), sku))
		require.NoError(t, err)
		require.Equal(t, strategy.OutcomeSoldOut, res.Outcome)
	}
	n, err := b.(strategy.Releaser).Release(ctx, "first-"+sku)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	res, err = a.Reserve(ctx, req("again-"+sku, "u2", sku))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)
	audit, err := dep.Audit(ctx)
	require.NoError(t, err)
	require.Equal(t, strategy.StockAudit{SKU: sku, Total: 1, Available: 0, Active: 1}, audit[0])

	_, err = db.Exec(ctx, `DELETE FROM onetrip_stock WHERE sku = $1`, sku)
	require.ErrorContains(t, err, "never deleted")
}
