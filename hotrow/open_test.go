package hotrow_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/hotrow"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

// TestRegistered: "hotrow" is registered with the READ COMMITTED default,
// claims everything but NoWait, and variants get their own names.
func TestRegistered(t *testing.T) {
	t.Parallel()
	m, ok := strategy.Lookup("hotrow")
	require.True(t, ok)
	require.Equal(t, hotrow.Claims, m.Claims)
	require.False(t, m.Claims.Has(strategy.NoWait), "t3 waits in the phantom input")
	require.True(t, m.Claims.Has(strategy.NoPhantomSoldOut|strategy.SurvivesRestart|strategy.IdempotentKey))
	require.NotEmpty(t, m.Description)
	require.NotEmpty(t, m.Correctness)
	require.Equal(t, "hotrow-repeatable-read", hotrow.New(hotrow.Options{Isolation: pgx.RepeatableRead}).Name)
	require.Equal(t, "hotrow-serializable", hotrow.New(hotrow.Options{Isolation: pgx.Serializable}).Name)
	require.Equal(t, "hotrow", hotrow.New(hotrow.Options{Isolation: pgx.ReadCommitted, MaxRetries: 3}).Name)
}

// TestOpenValidatesFirst: a refused Config or Options writes nothing, not
// even the schema, into a fresh database.
func TestOpenValidatesFirst(t *testing.T) {
	t.Parallel()
	db, admin := pgtest.Pools(t)
	ctx := context.Background()
	bad := map[string]struct {
		cfg  strategy.Config
		opts hotrow.Options
	}{
		"no stock":            {strategy.Config{DB: db}, hotrow.Options{}},
		"sku twice":           {strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: "a", Total: 1}, {SKU: "a", Total: 1}}}, hotrow.Options{}},
		"total past int4":     {strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: "a", Total: math.MaxInt32 + 1}}}, hotrow.Options{}},
		"read uncommitted":    {strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: "a", Total: 1}}}, hotrow.Options{Isolation: pgx.ReadUncommitted}},
		"made-up isolation":   {strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: "a", Total: 1}}}, hotrow.Options{Isolation: "snapshot"}},
		"negative node count": {strategy.Config{DB: db, Nodes: -1, Stock: []strategy.Stock{{SKU: "a", Total: 1}}}, hotrow.Options{}},
	}
	for name, c := range bad {
		dep, err := hotrow.New(c.opts).Open(ctx, c.cfg)
		require.ErrorIs(t, err, strategy.ErrConfig, name)
		require.Nil(t, dep, "%s: a failed Open returns a nil Deployment interface", name)
	}
	var tables int
	require.NoError(t, admin.QueryRow(ctx,
		`SELECT count(*) FROM pg_class WHERE relname IN ('sku_stock', 'reservation') AND relkind = 'r'`).Scan(&tables))
	require.Zero(t, tables, "a refused Open created the schema")
}

// TestOpenConcurrently: 8 Opens at once on a database without the schema,
// with disjoint SKUs, all succeed: the advisory lock serialises schema
// creation (without it, concurrent CREATE TABLE IF NOT EXISTS can fail on
// the catalog's unique index).
func TestOpenConcurrently(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.Pools(t)
	ctx := context.Background()
	deps := make([]*hotrow.Deployment, 8)
	errs := make([]error, 8)
	strategytest.Together(8, func(i int) {
		deps[i], errs[i] = hotrow.Open(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: fmt.Sprintf("sku-%d", i), Total: i}}}, hotrow.Options{})
	})
	for i := range deps {
		require.NoError(t, errs[i], "Open %d", i)
		list, err := deps[i].Audit(ctx)
		require.NoError(t, err)
		require.Equal(t, []strategy.StockAudit{{SKU: fmt.Sprintf("sku-%d", i), Total: i, Available: i}}, list)
	}
}

// TestOpenStockExists: opening a SKU that has stock fails with
// ErrStockExists and inserts none of the Config's SKUs (one transaction),
// also when two Opens of one SKU race: exactly one wins.
func TestOpenStockExists(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.Pools(t)
	ctx := context.Background()
	old := newSKU("old")
	_, err := hotrow.Open(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: old, Total: 3}}}, hotrow.Options{})
	require.NoError(t, err)

	fresh := newSKU("fresh")
	_, err = hotrow.Open(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: fresh, Total: 5}, {SKU: old, Total: 7}}}, hotrow.Options{})
	require.ErrorIs(t, err, strategy.ErrStockExists)
	require.Contains(t, err.Error(), old)
	dep, err := hotrow.Open(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: fresh, Total: 5}}}, hotrow.Options{})
	require.NoError(t, err, "the refused Open inserted %s", fresh)
	require.Equal(t, 5, audit(t, dep).Available)

	contested := newSKU("contested")
	errs := make([]error, 6)
	strategytest.Together(len(errs), func(i int) {
		_, errs[i] = hotrow.Open(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: contested, Total: 2}}}, hotrow.Options{})
	})
	won := 0
	for _, err := range errs {
		if err == nil {
			won++
		} else {
			require.ErrorIs(t, err, strategy.ErrStockExists)
		}
	}
	require.Equal(t, 1, won)
}

// TestDeploymentsShareDatabase: two deployments with disjoint SKUs in one
// database. MakeDue, ExpireDue, Audit, Confirm and Release of one never
// touch the other's SKUs; request keys are unique across both.
func TestDeploymentsShareDatabase(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.Pools(t)
	ctx := context.Background()
	depA, skuA := open(t, db, hotrow.Options{}, 2, 5)
	depB, skuB := open(t, db, hotrow.Options{}, 2, 5)
	keysA, keysB := holdN(t, depA, skuA, 3), holdN(t, depB, skuB, 3)
	a := depA.Node(0)

	n, err := depA.MakeDue(ctx, append(append([]string{}, keysA...), keysB...))
	require.NoError(t, err)
	require.Equal(t, 3, n, "MakeDue of A moved B's reservations")
	n, err = depB.MakeDue(ctx, keysB[:1])
	require.NoError(t, err)
	require.Equal(t, 1, n)

	units, err := a.(strategy.Expirer).ExpireDue(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, units, "ExpireDue of A expired B's due reservation")
	r, err := a.Lookup(ctx, keysB[0])
	require.NoError(t, err)
	require.Equal(t, strategy.StatusHeld, r.Status, "Lookup sees every key; B's due row is still HELD")

	moved, err := a.(strategy.Confirmer).Confirm(ctx, keysB[1], strategy.ConfirmUntilExpired)
	require.NoError(t, err)
	require.False(t, moved, "A confirmed B's reservation")
	units, err = a.(strategy.Releaser).Release(ctx, keysB[2])
	require.NoError(t, err)
	require.Zero(t, units, "A released B's reservation")

	res, err := a.Reserve(ctx, req("x", "u", skuB))
	var rerr *strategy.RequestError
	require.ErrorAs(t, err, &rerr, "B's SKU is unknown to A")
	require.Equal(t, "sku", rerr.Field)
	require.Equal(t, strategy.OutcomeBadRequest, res.Outcome)
	res, err = a.Reserve(ctx, req(keysB[1], "user-01", skuA))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeKeyReused, res.Outcome, "keys are unique across deployments")

	require.Equal(t, strategy.StockAudit{SKU: skuA, Total: 5, Available: 5}, audit(t, depA))
	require.Equal(t, strategy.StockAudit{SKU: skuB, Total: 5, Available: 2, Active: 3}, audit(t, depB))
}

// TestRestart: a restarted node's old handle answers strategy.ErrNodeClosed,
// the new one sees everything; a bad index is strategy.ErrNodeRange; Close
// closes every node.
func TestRestart(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.Pools(t)
	ctx := context.Background()
	dep, sku := open(t, db, hotrow.Options{}, 2, 3)
	old := dep.Node(0)
	res, err := old.Reserve(ctx, req("k1", "u1", sku))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)

	require.NoError(t, dep.Restart(ctx, 0))
	_, err = old.Reserve(ctx, req("k2", "u2", sku))
	require.ErrorIs(t, err, strategy.ErrNodeClosed)
	_, err = old.Lookup(ctx, "k1")
	require.ErrorIs(t, err, strategy.ErrNodeClosed)
	require.NotSame(t, old, dep.Node(0))
	res, err = dep.Node(0).Reserve(ctx, req("k1", "u1", sku))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeReplay, res.Outcome)
	require.ErrorIs(t, dep.Restart(ctx, 2), strategy.ErrNodeRange)
	require.PanicsWithError(t, fmt.Sprintf("%v: node 2 of a deployment with 2 nodes", strategy.ErrNodeRange), func() { dep.Node(2) })

	require.NoError(t, dep.Close())
	_, err = dep.Node(1).Lookup(ctx, "k1")
	require.ErrorIs(t, err, strategy.ErrNodeClosed)
	require.ErrorIs(t, dep.Restart(ctx, 0), strategy.ErrNodeClosed)
}

// TestBadInput: every kind of malformed request, through a node and through
// a session, is BAD_REQUEST with a *strategy.RequestError naming the field,
// and writes no row (counted in the table, not only through the audit).
func TestBadInput(t *testing.T) {
	t.Parallel()
	db, admin := pgtest.Pools(t)
	ctx := context.Background()
	dep, sku := open(t, db, hotrow.Options{}, 1, 3)
	valid := req("req-bad", "user-0042", sku)
	with := func(f func(r *strategy.Request)) strategy.Request { r := valid; f(&r); return r }
	cases := []struct {
		name, field string
		r           strategy.Request
	}{
		{"empty key", "key", with(func(r *strategy.Request) { r.Key = "" })},
		{"empty user", "user", with(func(r *strategy.Request) { r.User = "" })},
		{"empty sku", "sku", with(func(r *strategy.Request) { r.SKU = "" })},
		{"oversized key", "key", with(func(r *strategy.Request) { r.Key = strings.Repeat("k", strategy.MaxKeyLen+1) })},
		{"oversized user", "user", with(func(r *strategy.Request) { r.User = strings.Repeat("u", strategy.MaxUserLen+1) })},
		{"oversized sku", "sku", with(func(r *strategy.Request) { r.SKU = strings.Repeat("s", strategy.MaxSKULen+1) })},
		{"key not UTF-8", "key", with(func(r *strategy.Request) { r.Key = "req-\xff" })},
		{"NUL in user", "user", with(func(r *strategy.Request) { r.User = "user\x00x" })},
		{"control character in key", "key", with(func(r *strategy.Request) { r.Key = "req\n" })},
		{"zero TTL", "ttl", with(func(r *strategy.Request) { r.TTL = 0 })},
		{"negative TTL", "ttl", with(func(r *strategy.Request) { r.TTL = -time.Second })},
		{"TTL over the maximum", "ttl", with(func(r *strategy.Request) { r.TTL = strategy.MaxTTL + time.Second })},
		{"unknown sku", "sku", with(func(r *strategy.Request) { r.SKU = "sku-nobody-sells" })},
	}
	sess := openSession(t, dep.Node(0))
	for _, c := range cases {
		for via, reserve := range map[string]func(context.Context, strategy.Request) (strategy.Result, error){
			"node": dep.Node(0).Reserve, "session": sess.Reserve,
		} {
			res, err := reserve(ctx, c.r)
			require.Equal(t, strategy.OutcomeBadRequest, res.Outcome, "%s via %s", c.name, via)
			require.ErrorIs(t, err, strategy.ErrBadRequest, "%s via %s", c.name, via)
			var rerr *strategy.RequestError
			require.True(t, errors.As(err, &rerr), "%s via %s: %v", c.name, via, err)
			assert.Equal(t, c.field, rerr.Field, "%s via %s", c.name, via)
		}
	}
	require.NoError(t, sess.Commit(ctx), "bad requests leave the session usable")
	var rows int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM reservation`).Scan(&rows))
	require.Zero(t, rows)
	require.Equal(t, 3, audit(t, dep).Available)

	res, err := dep.Node(0).Reserve(ctx, valid)
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome, "a valid request after the bad ones")
	require.WithinDuration(t, time.Now().Add(strategy.TTLForever), res.Reservation.ExpiresAt, time.Minute)
}

// TestAttach: a second deployment attaches to stock another one loaded (a
// second process of the service): it writes nothing, sees and sells the same
// stock, and refuses SKUs without stock, totals that differ, and a database
// without the schema, with ErrConfig.
func TestAttach(t *testing.T) {
	t.Parallel()
	db, admin := pgtest.Pools(t)
	ctx := context.Background()

	attach := hotrow.Meta().Attach
	_, err := attach(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: "a", Total: 1}}})
	require.ErrorIs(t, err, strategy.ErrConfig, "no schema yet")
	var tables int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname IN ('sku_stock', 'reservation')`).Scan(&tables))
	require.Zero(t, tables, "Attach wrote the schema")

	first, sku := open(t, db, hotrow.Options{}, 2, 3)
	res, err := first.Node(0).Reserve(ctx, req("k1", "u1", sku))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)

	cfg := strategy.Config{DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: sku, Total: 3}}}
	second, err := attach(ctx, cfg)
	require.NoError(t, err)
	defer second.Close()
	r, err := second.Node(1).Lookup(ctx, "k1")
	require.NoError(t, err)
	require.Equal(t, strategy.StatusHeld, r.Status)
	res, err = second.Node(0).Reserve(ctx, req("k2", "u2", sku))
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)
	require.Equal(t, audit(t, first), audit(t, second))
	require.Equal(t, 1, audit(t, first).Available)

	for name, stock := range map[string][]strategy.Stock{
		"sku without stock": {{SKU: sku, Total: 3}, {SKU: newSKU("never-loaded"), Total: 1}},
		"other total":       {{SKU: sku, Total: 4}},
	} {
		_, err := attach(ctx, strategy.Config{DB: db, Stock: stock})
		require.ErrorIs(t, err, strategy.ErrConfig, name)
	}
	require.Equal(t, 1, audit(t, first).Available)
}
