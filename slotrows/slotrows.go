package slotrows

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// Name is the name strategy B registers under; variants append to it (New).
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
	// OneSavepoint is a deliberate mistake, for the negative control
	// ctl-slot-one-savepoint only: an attempt held open marks its savepoint
	// once, at its first request, and every later request rolls back to it
	// on SOLD_OUT ("a round trip saved per request"), undoing the units
	// the attempt had answered HELD before.
	OneSavepoint bool
	// TTLInMillis is a deliberate mistake, for the negative control
	// ctl-slot-ttl-millis only: a reservation's TTL is kept in whole
	// milliseconds (the HTTP API's ttl_ms), so a TTL under a millisecond
	// makes a reservation due when it is made.
	TTLInMillis bool
}

func (o Options) validate() error {
	switch o.SlotChoice {
	case LowestFirst, KeyHashFirst:
		return nil
	}
	return fmt.Errorf("%w: slotrows: unknown slot choice %v", strategy.ErrConfig, o.SlotChoice)
}

// Meta describes strategy B as registered: LowestFirst.
func Meta() strategy.Meta { return New(Options{}) }

// New describes strategy B with other options, for benchmarks that compare
// them; it is not registered. Its name is Name for the zero Options and
// Name plus "-<choice>" otherwise, so results never mix.
func New(opts Options) strategy.Meta {
	name := Name
	if opts.SlotChoice != LowestFirst {
		name += "-" + opts.SlotChoice.String()
	}
	return strategy.Meta{
		Name:        name,
		Description: "one row per unit, claimed with FOR UPDATE SKIP LOCKED",
		Correctness: "each slot row has at most one holder; unique indexes on key and (sku, user)",
		Isolation:   string(readCommitted),
		Retry:       "none: a claim skips locked slots instead of waiting, and finding none free is SOLD_OUT",
		Claims: strategy.NoOversell | strategy.IdempotentKey | strategy.OneActivePerUser |
			strategy.ReturnOnce | strategy.Conserves | strategy.NoWait | strategy.SurvivesRestart | strategy.LeastPrivilege,
		Open:   pgstrategy.Bind(Open, opts),
		Attach: pgstrategy.Bind(attach, opts),
		Setup:  schema.Setup,
	}
}

//go:embed schema.sql
var schemaSQL string

// schema is strategy B's tables for pgstrategy: the advisory lock key that
// serializes concurrent Opens in one database ("slotrows" in ASCII), and
// slotrows_slot_free, the last object of schema.sql.
// Every strategy declares its pgstrategy.Schema like this, with its own values.
var schema = pgstrategy.Schema{
	DDL:     schemaSQL,
	Last:    "slotrows_slot_free",
	LockKey: 0x736c6f74726f7773,
	Totals:  `SELECT sku, total FROM slotrows_sku WHERE sku = ANY($1)`,
	// Least privilege: a SKU row is written once; slots and reservations
	// are claimed and moved, never deleted (a claim locks its slot FOR
	// UPDATE, which needs UPDATE).
	Grants: []pgstrategy.Grant{
		{Table: "slotrows_sku", Privileges: "SELECT, INSERT"},
		{Table: "slotrows_reservation", Privileges: "SELECT, INSERT, UPDATE"},
		{Table: "slotrows_slot", Privileges: "SELECT, INSERT, UPDATE"},
	},
}

// The SQL that loads the stock.
const (
	// sqlInsertSKU inserts the SKU row; no row back means the SKU exists.
	sqlInsertSKU = `INSERT INTO slotrows_sku (sku, total) VALUES ($1, $2) ON CONFLICT (sku) DO NOTHING`
	// sqlInsertSlots pre-splits the stock: one free slot per unit.
	sqlInsertSlots = `INSERT INTO slotrows_slot (sku, slot_no) SELECT $1, g FROM generate_series(1, $2::int) AS g`
)

// Open validates cfg and opts, creates the schema when it is missing and
// loads the stock, all in one transaction: either every SKU of cfg gets its
// slots or nothing is written. A SKU that already has stock fails the whole
// Open with an error matching strategy.ErrStockExists.
func Open(ctx context.Context, cfg strategy.Config, opts Options) (*Deployment, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	err := schema.Load(ctx, cfg, func(tx pgx.Tx) error {
		for _, s := range cfg.Stock {
			tag, err := tx.Exec(ctx, sqlInsertSKU, s.SKU, s.Total)
			if err != nil {
				return fmt.Errorf("insert sku %q: %w", s.SKU, err)
			}
			if tag.RowsAffected() == 0 {
				return fmt.Errorf("%w: %q", strategy.ErrStockExists, s.SKU)
			}
			if _, err := tx.Exec(ctx, sqlInsertSlots, s.SKU, s.Total); err != nil {
				return fmt.Errorf("insert %d slots of sku %q: %w", s.Total, s.SKU, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("slotrows: open: %w", err)
	}
	return newDeployment(cfg, opts), nil
}

// attach is Meta.Attach: another process loaded this stock. It checks that
// every SKU of cfg has stock with the same total and writes nothing.
// Every strategy's attach has this shape (its options, then
// pgstrategy.Schema.Attach, then its deployment) on purpose.
func attach(ctx context.Context, cfg strategy.Config, opts Options) (*Deployment, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if err := schema.Attach(ctx, cfg); err != nil {
		return nil, fmt.Errorf("slotrows: %w", err)
	}
	return newDeployment(cfg, opts), nil
}

func newDeployment(cfg strategy.Config, opts Options) *Deployment {
	d := &Deployment{
		db:     cfg.DB,
		opts:   opts,
		totals: pgstrategy.NewSKUs(cfg),
		skus:   cfg.SKUs(),
	}
	d.Handles = pgstrategy.NewHandles(Name, cfg.NodeCount(), func(h *pgstrategy.Handle) strategy.Strategy {
		return &node{Handle: h, d: d}
	})
	return d
}

// Deployment is strategy B over one database. Everything it keeps in memory
// is configuration (the pool, the SKUs and their totals); all state is in
// the database, so nodes are plain handles on the same pool and Node,
// Restart and Close are pgstrategy.Handles'. It implements
// strategy.Deployment, strategy.Restarter and strategy.Ager, and the
// pgbench script of package bench.
type Deployment struct {
	*pgstrategy.Handles
	db     *pgxpool.Pool
	opts   Options
	totals pgstrategy.SKUs // the deployment's SKUs and their totals: Reserve refuses any other
	skus   []string        // the same, in config order, for the SQL that is scoped to them
}

// node is one node of a deployment. It implements strategy.Strategy and every
// optional node interface. Its Handle's Check says whether it was restarted
// or closed.
type node struct {
	*pgstrategy.Handle
	d *Deployment
}

// Compile-time checks of what the package offers. Every strategy package has
// such a list, alike on purpose: it is the package's row of capabilities.
var (
	_ strategy.Strategy            = (*node)(nil)
	_ strategy.Confirmer           = (*node)(nil)
	_ strategy.Releaser            = (*node)(nil)
	_ strategy.Expirer             = (*node)(nil)
	_ strategy.SessionOpener       = (*node)(nil)
	_ strategy.ExpirySessionOpener = (*node)(nil)
	_ strategy.Session             = (*session)(nil)
	_ strategy.ExpirySession       = (*session)(nil)
	_ strategy.Deployment          = (*Deployment)(nil)
	_ strategy.Restarter           = (*Deployment)(nil)
	_ strategy.Ager                = (*Deployment)(nil)
)

// readCommitted is the isolation of every reservation attempt, whatever the
// server's default: the claim relies on READ COMMITTED re-checking holder IS
// NULL on a slot's newest version (under REPEATABLE READ it would fail with
// 40001 instead of moving on to the next slot), and the answer to a conflict
// on a statement snapshot taken after the conflicting attempt finished.
const readCommitted = pgx.ReadCommitted
