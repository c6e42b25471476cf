package slotrows

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// Name is the name strategy B registers under.
const Name = "slotrows"

func init() { strategy.Register(Meta()) }

// SlotChoice says which free slot a claim tries first. Every choice is
// equally correct (a claim only ever takes a slot that is free and not locked
// by another claim); they differ in how often concurrent claimers try the
// same slot and skip it.
type SlotChoice int

const (
	// LowestFirst claims the free slot with the lowest number: one probe at
	// the head of the free-slot index. Concurrent claimers all start at the
	// head, so claimer k skips the k-1 slots locked by the claims in flight
	// before it: a failed conditional lock on a row in shared memory each, far
	// cheaper than the round trip around it, and bounded by the pool size.
	// Slots fill in order, which makes every run reproducible (t1 gets slot 1,
	// t2 slot 2). The default.
	LowestFirst SlotChoice = iota
	// KeyHashFirst starts at slot 1 + hash(request key) mod total and wraps
	// around: distinct keys start at different slots, so concurrent claimers
	// rarely meet, and the index entries of taken slots are spread instead of
	// piling up at the head. Still one index probe while the slot at the start
	// point's right is free; a second probe (slots below the start) only when
	// none is.
	KeyHashFirst
)

func (c SlotChoice) String() string {
	switch c {
	case LowestFirst:
		return "lowest-first"
	case KeyHashFirst:
		return "key-hash-first"
	}
	return fmt.Sprintf("SlotChoice(%d)", int(c))
}

// Options tune strategy B. The zero value is the registered strategy.
type Options struct {
	SlotChoice SlotChoice
}

// Meta describes strategy B as registered: LowestFirst.
func Meta() strategy.Meta { return MetaWith(Options{}) }

// MetaWith describes strategy B with other options, for benchmarks that
// compare them; it is not registered. Its name is "slotrows" for the zero
// Options and "slotrows-<choice>" otherwise, so results never mix.
func MetaWith(opts Options) strategy.Meta {
	name := Name
	if opts.SlotChoice != LowestFirst {
		name += "-" + opts.SlotChoice.String()
	}
	return strategy.Meta{
		Name:        name,
		Description: "one row per unit, claimed with FOR UPDATE SKIP LOCKED",
		Correctness: "each slot row has at most one holder; unique indexes on key and (sku, user)",
		Claims: strategy.NoOversell | strategy.IdempotentKey | strategy.OneActivePerUser |
			strategy.ReturnOnce | strategy.Conserves | strategy.NoWait | strategy.SurvivesRestart,
		Open: func(ctx context.Context, cfg strategy.Config) (strategy.Deployment, error) {
			return open(ctx, cfg, opts)
		},
	}
}

//go:embed schema.sql
var schemaSQL string

// The SQL of Open.
const (
	// schemaLockKey serializes concurrent Opens in one database (the key is
	// per database): CREATE ... IF NOT EXISTS is not safe against a
	// concurrent CREATE of the same object.
	schemaLockKey = 0x736c6f74726f7773 // "slotrows"
	sqlSchemaLock = `SELECT pg_advisory_xact_lock($1)`
	// sqlSchemaDone is true once the last object of schema.sql exists. Open
	// runs schema.sql only when it does not: CREATE INDEX IF NOT EXISTS takes
	// a SHARE lock on its table even when the index exists, which would make
	// an Open wait for every write in flight.
	sqlSchemaDone = `SELECT to_regclass('slotrows_slot_free') IS NOT NULL`
	// sqlInsertSKU inserts the SKU row; no row back means the SKU exists.
	sqlCountSKUs = `SELECT count(*) FROM slotrows_sku WHERE sku = ANY($1)`
	sqlInsertSKU = `INSERT INTO slotrows_sku (sku, total) VALUES ($1, $2) ON CONFLICT (sku) DO NOTHING`
	// sqlInsertSlots pre-splits the stock: one free slot per unit.
	sqlInsertSlots = `INSERT INTO slotrows_slot (sku, slot_no) SELECT $1, g FROM generate_series(1, $2::int) AS g`
)

// open validates cfg, creates the schema when it is missing and loads the
// stock, all in one transaction: either every SKU of cfg gets its slots or
// nothing is written.
func open(ctx context.Context, cfg strategy.Config, opts Options) (strategy.Deployment, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch opts.SlotChoice {
	case LowestFirst, KeyHashFirst:
	default:
		return nil, fmt.Errorf("%w: slotrows: unknown slot choice %v", strategy.ErrConfig, opts.SlotChoice)
	}
	tx, err := cfg.DB.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("slotrows: open: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, sqlSchemaLock, int64(schemaLockKey)); err != nil {
		return nil, fmt.Errorf("slotrows: open: schema lock: %w", err)
	}
	var done bool
	if err := tx.QueryRow(ctx, sqlSchemaDone).Scan(&done); err != nil {
		return nil, fmt.Errorf("slotrows: open: look for the schema: %w", err)
	}
	if !done {
		if _, err := tx.Exec(ctx, schemaSQL); err != nil {
			return nil, fmt.Errorf("slotrows: open: create schema: %w", err)
		}
	}
	if cfg.Attach {
		// Another process loaded this stock: check it is there, write nothing.
		var n int
		if err := tx.QueryRow(ctx, sqlCountSKUs, cfg.SKUs()).Scan(&n); err != nil {
			return nil, fmt.Errorf("slotrows: attach: %w", err)
		}
		if n != len(cfg.Stock) {
			return nil, fmt.Errorf("slotrows: attach: %w: %d of %d SKUs have stock", strategy.ErrConfig, n, len(cfg.Stock))
		}
	}
	for _, s := range cfg.Stock {
		if cfg.Attach {
			break
		}
		tag, err := tx.Exec(ctx, sqlInsertSKU, s.SKU, s.Total)
		if err != nil {
			return nil, fmt.Errorf("slotrows: open: insert sku %q: %w", s.SKU, err)
		}
		if tag.RowsAffected() == 0 {
			return nil, fmt.Errorf("slotrows: open: %w: %q", strategy.ErrStockExists, s.SKU)
		}
		if _, err := tx.Exec(ctx, sqlInsertSlots, s.SKU, s.Total); err != nil {
			return nil, fmt.Errorf("slotrows: open: insert %d slots of sku %q: %w", s.Total, s.SKU, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("slotrows: open: commit: %w", err)
	}

	d := &deployment{
		db:     cfg.DB,
		opts:   opts,
		totals: make(map[string]int, len(cfg.Stock)),
		skus:   cfg.SKUs(),
		nodes:  make([]*node, cfg.NodeCount()),
	}
	for _, s := range cfg.Stock {
		d.totals[s.SKU] = s.Total
	}
	for i := range d.nodes {
		d.nodes[i] = &node{d: d, id: i}
	}
	return d, nil
}

// deployment is strategy B over one database. Everything it keeps in memory
// is configuration (the pool, the SKUs and their totals); all state is in
// the database, so nodes are plain handles on the same pool.
type deployment struct {
	db     *pgxpool.Pool
	opts   Options
	totals map[string]int // the deployment's SKUs: Reserve refuses any other
	skus   []string       // the same, in config order, for the SQL that is scoped to them
	closed atomic.Bool

	mu    sync.Mutex
	nodes []*node
}

// errClosed is returned by every call on a closed deployment's nodes.
var errClosed = errors.New("slotrows: deployment is closed")

func (d *deployment) Node(i int) strategy.Strategy {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.nodes[i]
}

// Restart replaces node i with a new handle. Nothing is lost: a node holds
// nothing but a pointer to the deployment.
func (d *deployment) Restart(_ context.Context, i int) error {
	if d.closed.Load() {
		return errClosed
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if i < 0 || i >= len(d.nodes) {
		return fmt.Errorf("slotrows: restart: no node %d (have %d)", i, len(d.nodes))
	}
	d.nodes[i] = &node{d: d, id: i}
	return nil
}

// Close marks the deployment closed. The pool belongs to the caller and
// stays open; no data is dropped.
func (d *deployment) Close() error {
	d.closed.Store(true)
	return nil
}

// node is one node of a deployment. It implements strategy.Strategy and every
// optional node interface.
type node struct {
	d  *deployment
	id int
}

var (
	_ strategy.Strategy       = (*node)(nil)
	_ strategy.Confirmer      = (*node)(nil)
	_ strategy.Releaser       = (*node)(nil)
	_ strategy.Expirer        = (*node)(nil)
	_ strategy.SessionOpener  = (*node)(nil)
	_ strategy.Session        = (*session)(nil)
	_ strategy.SessionExpirer = (*session)(nil)
	_ strategy.Deployment     = (*deployment)(nil)
	_ strategy.Ager           = (*deployment)(nil)
)

// readCommitted is the isolation of every reservation attempt, whatever the
// server's default: the claim relies on READ COMMITTED re-checking holder IS
// NULL on a slot's newest version (under REPEATABLE READ it would fail with
// 40001 instead of moving on to the next slot), and the answer to a conflict
// on a statement snapshot taken after the conflicting attempt finished.
var readCommitted = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// beginTx begins a reservation transaction on the pool, or refuses when
// closed.
func (d *deployment) beginTx(ctx context.Context) (pgx.Tx, error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	return d.db.BeginTx(ctx, readCommitted)
}
