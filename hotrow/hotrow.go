package hotrow

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

func init() { strategy.Register(Meta()) }

// Claims are the guarantees hotrow states, under every isolation level it
// accepts (with retries enabled). It does not claim strategy.NoWait: an
// attempt that has decremented the hot row and not yet committed makes every
// other attempt on that SKU wait for it.
const Claims = strategy.NoOversell | strategy.IdempotentKey | strategy.OneActivePerUser |
	strategy.ReturnOnce | strategy.Conserves | strategy.NoPhantomSoldOut | strategy.SurvivesRestart

// DefaultMaxRetries is how often an operation reruns its transaction after a
// serialization failure (40001) or a deadlock (40P01) when
// Options.MaxRetries is 0. Under READ COMMITTED a reservation practically
// never needs one. Under REPEATABLE READ and SERIALIZABLE every waiter on
// the hot row fails when the holder commits, so a request can lose once per
// unit handed out while it waits; with the jittered pause between attempts
// (retry.go), 120 requests for 40 units through 32 connections took 40 to
// 340 retries in total; with MaxRetries 5 no request gave up in six such
// runs, with 2 one run had 17 give up. 20 leaves a wide margin and still
// bounds a request that keeps losing (see TestIsolationContention).
const DefaultMaxRetries = 20

// Options configure a hotrow deployment. The zero value is the reference
// design: READ COMMITTED, DefaultMaxRetries.
type Options struct {
	// Isolation is the level of every transaction hotrow runs; "" means
	// pgx.ReadCommitted, the level the design is argued for. pgx.RepeatableRead
	// and pgx.Serializable are accepted: there a concurrent decrement of the
	// hot row fails with 40001 instead of being re-evaluated, and the
	// transaction is retried.
	Isolation pgx.TxIsoLevel

	// MaxRetries bounds how often one operation (Reserve, Confirm, Release,
	// ExpireDue, MakeDue) reruns its whole transaction after 40001, 40P01,
	// or a unique-index conflict with a row its snapshot cannot see.
	// 0 means DefaultMaxRetries; a negative value disables retrying, so the
	// error reaches the caller (an outcome the contract calls unknown, though
	// PostgreSQL rolled the transaction back). Sessions never retry.
	MaxRetries int
}

func (o Options) isolation() pgx.TxIsoLevel {
	if o.Isolation == "" {
		return pgx.ReadCommitted
	}
	return o.Isolation
}

func (o Options) maxRetries() int {
	switch {
	case o.MaxRetries < 0:
		return 0
	case o.MaxRetries == 0:
		return DefaultMaxRetries
	}
	return o.MaxRetries
}

func (o Options) validate() error {
	switch o.isolation() {
	case pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable:
		return nil
	}
	return fmt.Errorf("%w: hotrow: isolation level %q not supported (want %q, %q or %q)",
		strategy.ErrConfig, o.Isolation, pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable)
}

// Meta is the registered strategy "hotrow": READ COMMITTED, retries on.
func Meta() strategy.Meta { return New(Options{}) }

// New returns the strategy with these options. Its name is "hotrow" for READ
// COMMITTED and "hotrow-" plus the level otherwise (e.g.
// "hotrow-repeatable-read"), so variants can be registered side by side.
func New(opts Options) strategy.Meta {
	name := "hotrow"
	if iso := opts.isolation(); iso != pgx.ReadCommitted {
		name += "-" + strings.ReplaceAll(string(iso), " ", "-")
	}
	return strategy.Meta{
		Name:        name,
		Description: "one stock row per SKU, conditional UPDATE available = available - 1 WHERE available > 0",
		Correctness: "available > 0 is re-evaluated on the newest row version under the row lock (READ COMMITTED, docs 13.2.1)",
		Claims:      Claims,
		Open: func(ctx context.Context, cfg strategy.Config) (strategy.Deployment, error) {
			d, err := Open(ctx, cfg, opts)
			if err != nil {
				return nil, err // not a typed nil in the interface
			}
			return d, nil
		},
	}
}

// ErrClosed is returned by a node that was restarted or whose deployment was
// closed: the caller must ask the Deployment for the current node.
var ErrClosed = errors.New("hotrow: node closed")

//go:embed schema.sql
var schemaSQL string

// schemaLockKey is the pg_advisory_xact_lock key that serialises schema
// creation between concurrent Opens ("hotrow" in ASCII).
const schemaLockKey int64 = 0x686f74726f77

const (
	sqlSchemaLock = `SELECT pg_advisory_xact_lock($1)`
	// reservation_one_active is the last object schema.sql creates, all in
	// one transaction: when it exists, the schema is complete and Open runs
	// no DDL (CREATE INDEX IF NOT EXISTS would still take a SHARE lock on
	// reservation and wait for every open reservation transaction).
	sqlSchemaPresent = `SELECT to_regclass('reservation_one_active') IS NOT NULL`
	// sqlInsertStock loads the stock; a SKU that already has a row is left
	// alone and missing from RETURNING, and Open rolls everything back.
	sqlInsertStock = `
INSERT INTO sku_stock (sku, total, available)
SELECT sku, total, total FROM unnest($1::text[], $2::int[]) AS s (sku, total)
ON CONFLICT (sku) DO NOTHING
RETURNING sku`
)

// Open deploys hotrow over cfg.DB: it validates cfg and opts before writing
// anything, creates the schema if it is missing, and loads cfg.Stock in one
// transaction. A SKU that already has stock fails the whole Open with an
// error matching strategy.ErrStockExists, and nothing is inserted.
//
// With cfg.Attach it writes nothing: it checks that every SKU of cfg.Stock
// has stock with the same total (else an error matching strategy.ErrConfig)
// and returns a deployment over it, as a second process of the service
// would. Nothing else differs: hotrow keeps no state in memory.
func Open(ctx context.Context, cfg strategy.Config, opts Options) (*Deployment, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	for _, s := range cfg.Stock {
		if s.Total > math.MaxInt32 {
			return nil, fmt.Errorf("%w: hotrow: sku %q: total %d does not fit the int column", strategy.ErrConfig, s.SKU, s.Total)
		}
	}
	if cfg.Attach {
		if err := attachStock(ctx, cfg.DB, cfg.Stock); err != nil {
			return nil, fmt.Errorf("hotrow: attach: %w", err)
		}
	} else {
		if err := ensureSchema(ctx, cfg.DB); err != nil {
			return nil, fmt.Errorf("hotrow: open: %w", err)
		}
		if err := insertStock(ctx, cfg.DB, cfg.Stock); err != nil {
			return nil, fmt.Errorf("hotrow: open: %w", err)
		}
	}
	d := &Deployment{
		db:         cfg.DB,
		iso:        opts.isolation(),
		maxRetries: opts.maxRetries(),
		skus:       cfg.SKUs(),
		owns:       make(map[string]bool, len(cfg.Stock)),
		nodes:      make([]*node, cfg.NodeCount()),
	}
	for _, s := range d.skus {
		d.owns[s] = true
	}
	for i := range d.nodes {
		d.nodes[i] = &node{d: d}
	}
	return d, nil
}

// sqlStockTotals reads the totals an attaching deployment expects to find.
const sqlStockTotals = `SELECT sku, total FROM sku_stock WHERE sku = ANY($1)`

func attachStock(ctx context.Context, db *pgxpool.Pool, stock []strategy.Stock) error {
	var present bool
	if err := db.QueryRow(ctx, sqlSchemaPresent).Scan(&present); err != nil {
		return fmt.Errorf("schema: look up: %w", err)
	}
	if !present {
		return fmt.Errorf("%w: no hotrow schema in this database: nothing to attach to", strategy.ErrConfig)
	}
	skus := make([]string, len(stock))
	for i, s := range stock {
		skus[i] = s.SKU
	}
	rows, err := db.Query(ctx, sqlStockTotals, skus)
	if err != nil {
		return fmt.Errorf("stock: %w", err)
	}
	totals := map[string]int{}
	var sku string
	var total int
	if _, err := pgx.ForEachRow(rows, []any{&sku, &total}, func() error {
		totals[sku] = total
		return nil
	}); err != nil {
		return fmt.Errorf("stock: %w", err)
	}
	for _, s := range stock {
		got, ok := totals[s.SKU]
		switch {
		case !ok:
			return fmt.Errorf("%w: sku %q has no stock to attach to", strategy.ErrConfig, s.SKU)
		case got != s.Total:
			return fmt.Errorf("%w: sku %q has total %d in the database, %d in the config", strategy.ErrConfig, s.SKU, got, s.Total)
		}
	}
	return nil
}

func ensureSchema(ctx context.Context, db *pgxpool.Pool) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("schema: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, sqlSchemaLock, schemaLockKey); err != nil {
		return fmt.Errorf("schema: lock: %w", err)
	}
	var present bool
	if err := tx.QueryRow(ctx, sqlSchemaPresent).Scan(&present); err != nil {
		return fmt.Errorf("schema: look up: %w", err)
	}
	if !present {
		if _, err := tx.Exec(ctx, schemaSQL); err != nil {
			return fmt.Errorf("schema: create: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("schema: commit: %w", err)
	}
	return nil
}

func insertStock(ctx context.Context, db *pgxpool.Pool, stock []strategy.Stock) error {
	skus := make([]string, len(stock))
	totals := make([]int32, len(stock))
	for i, s := range stock {
		skus[i], totals[i] = s.SKU, int32(s.Total)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("stock: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	rows, err := tx.Query(ctx, sqlInsertStock, skus, totals)
	if err != nil {
		return fmt.Errorf("stock: insert: %w", err)
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("stock: insert: %w", err)
	}
	if len(inserted) != len(stock) {
		fresh := make(map[string]bool, len(inserted))
		for _, s := range inserted {
			fresh[s] = true
		}
		var existing []string
		for _, s := range skus {
			if !fresh[s] {
				existing = append(existing, s)
			}
		}
		return fmt.Errorf("%w: %s", strategy.ErrStockExists, strings.Join(existing, ", "))
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("stock: commit: %w", err)
	}
	return nil
}

// Deployment is hotrow deployed over one database. Its nodes are handles on
// the same pool and keep nothing in memory but the deployment's SKU list, so
// a restart loses nothing. It implements strategy.Deployment and
// strategy.Ager.
type Deployment struct {
	db         *pgxpool.Pool
	iso        pgx.TxIsoLevel
	maxRetries int
	skus       []string
	owns       map[string]bool // read-only after Open

	retries atomic.Int64

	mu     sync.RWMutex
	nodes  []*node
	closed bool
}

var (
	_ strategy.Deployment = (*Deployment)(nil)
	_ strategy.Ager       = (*Deployment)(nil)
)

// Isolation is the isolation level of the deployment's transactions.
func (d *Deployment) Isolation() pgx.TxIsoLevel { return d.iso }

// Retries is the number of transactions the deployment's nodes reran after a
// serialization failure (40001), a deadlock (40P01) or a conflicting row
// that the transaction's snapshot could not see, since Open, summed over
// every node including restarted ones. It stays 0 under READ COMMITTED in
// every test of this package.
func (d *Deployment) Retries() int64 { return d.retries.Load() }

// Node returns node i. It panics if i is out of range, like an index.
func (d *Deployment) Node(i int) strategy.Strategy {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if i < 0 || i >= len(d.nodes) {
		panic(fmt.Sprintf("hotrow: Node(%d) of a deployment with %d nodes", i, len(d.nodes)))
	}
	return d.nodes[i]
}

// Restart closes node i (its handle answers ErrClosed from now on) and puts a
// fresh node in its place. There is nothing to recover: the stock row and the
// reservations are the whole state.
func (d *Deployment) Restart(_ context.Context, i int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("hotrow: restart node %d: %w", i, ErrClosed)
	}
	if i < 0 || i >= len(d.nodes) {
		return fmt.Errorf("hotrow: restart node %d of %d: out of range", i, len(d.nodes))
	}
	d.nodes[i].closed.Store(true)
	d.nodes[i] = &node{d: d}
	return nil
}

// Close closes every node. The pool belongs to the caller and stays open;
// sessions already open stay usable until they end.
func (d *Deployment) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	for _, n := range d.nodes {
		n.closed.Store(true)
	}
	return nil
}

// sqlAudit reads stock and active reservations in one statement, so one
// snapshot: the three numbers belong together.
const sqlAudit = `
SELECT s.sku, s.total, s.available,
       (SELECT count(*) FROM reservation r
         WHERE r.sku = s.sku AND r.status IN ('HELD', 'CONFIRMED'))::int AS active
FROM sku_stock s
WHERE s.sku = ANY($1)
ORDER BY array_position($1, s.sku)`

// Audit reports total, the available column and the HELD and CONFIRMED rows
// of each of the deployment's SKUs, in Config order.
func (d *Deployment) Audit(ctx context.Context) ([]strategy.StockAudit, error) {
	rows, err := d.db.Query(ctx, sqlAudit, d.skus)
	if err != nil {
		return nil, fmt.Errorf("hotrow: audit: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (strategy.StockAudit, error) {
		var a strategy.StockAudit
		err := row.Scan(&a.SKU, &a.Total, &a.Available, &a.Active)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("hotrow: audit: %w", err)
	}
	return out, nil
}

// sqlMakeDue moves expires_at of HELD rows into the past, as seed 000 does
// to simulate expiry.
const sqlMakeDue = `
UPDATE reservation SET expires_at = now() - interval '1 second', updated_at = now()
WHERE request_key = ANY($1) AND sku = ANY($2) AND status = 'HELD'`

// MakeDue makes the HELD reservations with these keys (of this deployment's
// SKUs) due and returns how many it moved.
func (d *Deployment) MakeDue(ctx context.Context, keys []string) (int, error) {
	var n int
	err := d.inTx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, sqlMakeDue, keys, d.skus)
		n = int(tag.RowsAffected())
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("hotrow: make due: %w", err)
	}
	return n, nil
}

// node is one handle on the deployment. Every node is the same code over the
// same pool; the harness spreads requests over them as over processes.
type node struct {
	d      *Deployment
	closed atomic.Bool
}

var (
	_ strategy.Strategy      = (*node)(nil)
	_ strategy.Confirmer     = (*node)(nil)
	_ strategy.Releaser      = (*node)(nil)
	_ strategy.Expirer       = (*node)(nil)
	_ strategy.SessionOpener = (*node)(nil)
)

func (n *node) check() error {
	if n.closed.Load() {
		return ErrClosed
	}
	return nil
}
