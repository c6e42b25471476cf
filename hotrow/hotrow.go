package hotrow

import (
	"context"
	_ "embed"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// Name is the name hotrow registers under; variants append to it (New).
const Name = "hotrow"

// init registers the reference design and its variants at the stricter
// isolation levels, with retries: the isolation matrix of table 28-1 and of
// docs/performance.md (the same design, what each level costs it).
func init() {
	strategy.Register(Meta())
	strategy.Register(New(Options{Isolation: pgx.RepeatableRead}))
	strategy.Register(New(Options{Isolation: pgx.Serializable}))
}

// Claims are the guarantees hotrow states, under every isolation level it
// accepts (with retries enabled). It does not claim strategy.NoWait: an
// attempt that has decremented the hot row and not yet committed makes every
// other attempt on that SKU wait for it.
const Claims = strategy.NoOversell | strategy.IdempotentKey | strategy.OneActivePerUser |
	strategy.ReturnOnce | strategy.Conserves | strategy.NoPhantomSoldOut | strategy.SurvivesRestart |
	strategy.LeastPrivilege

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
	// 0 means DefaultMaxRetries. A Reserve whose retries all failed answers
	// BUSY (nothing was written); the other operations return the error. A
	// negative value disables retrying, so the first error reaches the
	// caller (an outcome the contract calls unknown, though PostgreSQL
	// rolled the transaction back). Sessions never retry.
	MaxRetries int

	// RetriesSpentSoldOut is a deliberate mistake, for the negative control
	// ctl-retries-spent-sold-out only: a Reserve whose retries all failed
	// answers SOLD_OUT instead of BUSY ("others are taking the last
	// units"), although nothing was tried to the end.
	RetriesSpentSoldOut bool
	// UnitsSummedOverRetries is a deliberate mistake, for the negative
	// control ctl-units-summed-over-retries only: Release and ExpireDue
	// add up the units each attempt's statement returned, so an attempt
	// whose COMMIT failed and was retried counts its units twice
	// (outsider round 40's hotrow-serializable).
	UnitsSummedOverRetries bool
	// ReplayFromMemory is a deliberate mistake, for the negative control
	// ctl-replay-from-memory only: a process answers a resend from the
	// reservations it answered, forgetting one only when one of its own
	// nodes releases or confirms it, so after another process moved it a
	// resend is REPLAY of a HELD reservation that is not (outsider round
	// 41's ssicount).
	ReplayFromMemory bool
	// LostLastUnitSoldOut is a deliberate mistake, for the negative control
	// ctl-lost-last-unit-sold-out only: a Reserve reads the stock row
	// first, and when it saw the last unit and the row then changed under
	// its decrement ("someone took the last one"), it answers SOLD_OUT,
	// though the change may have been a unit given back (an optimistic
	// design's mistake, outsider round 57's m16).
	LostLastUnitSoldOut bool
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

// correctness is Meta.Correctness for opts: where the guarantee comes from
// differs between the levels.
func correctness(opts Options) string {
	if opts.isolation() == pgx.ReadCommitted {
		return "available > 0 is re-evaluated on the newest row version under the row lock (READ COMMITTED, docs 13.2.1)"
	}
	return "a decrement that meets a row changed after its snapshot fails with 40001 instead of re-evaluating (docs 13.2.2, 13.2.3), and the whole transaction runs again on a new snapshot"
}

// retryPolicy is Meta.Retry for opts.
func retryPolicy(opts Options) string {
	n := opts.maxRetries()
	if n == 0 {
		return "none: 40001 and 40P01 reach the caller (an unknown outcome)"
	}
	p := fmt.Sprintf("40001, 40P01, a conflict its snapshot cannot see and PostgreSQL's internal multixact error (XX000, aborted): the whole transaction again, up to %d times, after a jittered pause (200 µs doubling to 20 ms)", n)
	if opts.isolation() == pgx.ReadCommitted {
		p += "; at READ COMMITTED a waiter re-evaluates instead, and none is needed"
	}
	return p
}

// Meta is the registered strategy "hotrow": READ COMMITTED, retries on.
func Meta() strategy.Meta { return New(Options{}) }

// New returns the strategy with these options. Its name is Name for READ
// COMMITTED and Name plus "-" and the level otherwise (e.g.
// "hotrow-repeatable-read"), so variants can be registered side by side;
// init registers the three levels with the default retries.
func New(opts Options) strategy.Meta {
	name := Name
	if iso := opts.isolation(); iso != pgx.ReadCommitted {
		name += "-" + strings.ReplaceAll(string(iso), " ", "-")
	}
	return strategy.Meta{
		Name:        name,
		Description: "one stock row per SKU, conditional UPDATE available = available - 1 WHERE available > 0",
		Correctness: correctness(opts),
		Isolation:   string(opts.isolation()),
		Retry:       retryPolicy(opts),
		Claims:      Claims,
		Open:        pgstrategy.Bind(Open, opts),
		Attach:      pgstrategy.Bind(attach, opts),
		Setup:       schema.Setup,
	}
}

//go:embed schema.sql
var schemaSQL string

// schema is hotrow's tables for pgstrategy: the advisory lock key that
// serialises their creation ("hotrow" in ASCII), and reservation_one_active,
// the last object schema.sql creates.
// Every strategy declares its pgstrategy.Schema like this, with its own values.
var schema = pgstrategy.Schema{
	DDL:     schemaSQL,
	Last:    "reservation_one_active",
	LockKey: 0x686f74726f77,
	Totals:  `SELECT sku, total FROM sku_stock WHERE sku = ANY($1)`,
	// Least privilege: rows are never deleted, and nothing else is needed
	// (USAGE on reservation's bigserial comes with the grants).
	Grants: []pgstrategy.Grant{
		{Table: "sku_stock", Privileges: "SELECT, INSERT, UPDATE (available)"},
		{Table: "reservation", Privileges: "SELECT, INSERT, UPDATE"},
	},
}

// sqlInsertStock loads the stock; a SKU that already has a row is left
// alone and missing from RETURNING, and Open rolls everything back.
const sqlInsertStock = `
INSERT INTO sku_stock (sku, total, available)
SELECT sku, total, total FROM unnest($1::text[], $2::int[]) AS s (sku, total)
ON CONFLICT (sku) DO NOTHING
RETURNING sku`

// Open deploys hotrow over cfg.DB: it validates cfg and opts before writing
// anything, then, in one transaction, creates the schema if it is missing
// and loads cfg.Stock. A SKU that already has stock fails the whole Open
// with an error matching strategy.ErrStockExists, and nothing is inserted.
func Open(ctx context.Context, cfg strategy.Config, opts Options) (*Deployment, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if err := schema.Load(ctx, cfg, func(tx pgx.Tx) error { return insertStock(ctx, tx, cfg.Stock) }); err != nil {
		return nil, fmt.Errorf("hotrow: open: %w", err)
	}
	return newDeployment(cfg, opts), nil
}

// attach is Meta.Attach: it writes nothing, checks that every SKU of
// cfg.Stock has stock with the same total (else an error matching
// strategy.ErrConfig) and returns a deployment over it, as a second process
// of the service would. Nothing else differs from Open: hotrow keeps no
// state in memory.
// Every strategy's attach has this shape (its options, then
// pgstrategy.Schema.Attach, then its deployment) on purpose.
func attach(ctx context.Context, cfg strategy.Config, opts Options) (*Deployment, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if err := schema.Attach(ctx, cfg); err != nil {
		return nil, fmt.Errorf("hotrow: %w", err)
	}
	return newDeployment(cfg, opts), nil
}

func newDeployment(cfg strategy.Config, opts Options) *Deployment {
	d := &Deployment{
		db:         cfg.DB,
		iso:        opts.isolation(),
		maxRetries: opts.maxRetries(),
		spentSold:  opts.RetriesSpentSoldOut,
		sumUnits:   opts.UnitsSummedOverRetries,
		remember:   opts.ReplayFromMemory,
		lostLast:   opts.LostLastUnitSoldOut,
		skus:       cfg.SKUs(),
		owns:       pgstrategy.NewSKUs(cfg),
	}
	d.Handles = pgstrategy.NewHandles(Name, cfg.NodeCount(), func(h *pgstrategy.Handle) strategy.Strategy {
		return &node{Handle: h, d: d}
	})
	return d
}

func insertStock(ctx context.Context, tx pgx.Tx, stock []strategy.Stock) error {
	skus := make([]string, len(stock))
	totals := make([]int32, len(stock))
	for i, s := range stock {
		skus[i], totals[i] = s.SKU, int32(s.Total) // Config.Validate bounds Total to MaxTotal, int4's maximum
	}
	rows, err := tx.Query(ctx, sqlInsertStock, skus, totals)
	if err != nil {
		return fmt.Errorf("stock: insert: %w", err)
	}
	return pgstrategy.AllInserted(rows, skus)
}

// Deployment is hotrow deployed over one database. Its nodes are handles on
// the same pool and keep nothing in memory but the deployment's SKU list, so
// a restart loses nothing: Node, Restart and Close are pgstrategy.Handles'.
// It implements strategy.Deployment, strategy.Restarter and strategy.Ager.
type Deployment struct {
	*pgstrategy.Handles
	db         *pgxpool.Pool
	iso        pgx.TxIsoLevel
	maxRetries int
	spentSold  bool // Options.RetriesSpentSoldOut
	sumUnits   bool // Options.UnitsSummedOverRetries
	remember   bool // Options.ReplayFromMemory: answered holds in answered
	lostLast   bool // Options.LostLastUnitSoldOut
	answered   sync.Map
	skus       []string
	owns       pgstrategy.SKUs

	retries atomic.Int64
}

// Compile-time checks of what the package offers. Every strategy package has
// such a list, alike on purpose: it is the package's row of capabilities.
var (
	_ strategy.Deployment          = (*Deployment)(nil)
	_ strategy.Restarter           = (*Deployment)(nil)
	_ strategy.Ager                = (*Deployment)(nil)
	_ strategy.Strategy            = (*node)(nil)
	_ strategy.Confirmer           = (*node)(nil)
	_ strategy.Releaser            = (*node)(nil)
	_ strategy.Expirer             = (*node)(nil)
	_ strategy.SessionOpener       = (*node)(nil)
	_ strategy.ExpirySessionOpener = (*node)(nil)
	_ strategy.Session             = (*session)(nil)
	_ strategy.ExpirySession       = (*session)(nil)
)

// Retries is the number of transactions the deployment's nodes reran after a
// serialization failure (40001), a deadlock (40P01) or a conflicting row
// that the transaction's snapshot could not see, since Open, summed over
// every node including restarted ones. It stays 0 under READ COMMITTED in
// every test of this package.
func (d *Deployment) Retries() int64 { return d.retries.Load() }

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
UPDATE reservation SET expires_at = now() - interval '400 days', updated_at = now()
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
// same pool; the harness spreads requests over them as over processes. Its
// Handle's Check says whether it was restarted or closed.
type node struct {
	*pgstrategy.Handle
	d *Deployment
}
