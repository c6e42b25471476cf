package combine

import (
	"context"
	_ "embed"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// Name is the name combine registers under.
const Name = "combine"

func init() { strategy.Register(Meta()) }

// Claims are hotrow's: every request still gets its own answer, from the
// same row lock and the same unique indexes, and least privilege (its
// schema created by an owner role, Meta.Setup). Like hotrow it does not claim
// strategy.NoWait: a batch (or a session) in flight makes the next one wait.
const Claims = strategy.NoOversell | strategy.IdempotentKey | strategy.OneActivePerUser |
	strategy.ReturnOnce | strategy.Conserves | strategy.NoPhantomSoldOut | strategy.SurvivesRestart |
	strategy.LeastPrivilege

// Defaults of Options.
const (
	// DefaultMaxBatch bounds how many requests one transaction serves. It
	// bounds the blast radius of a failed batch (every request in it is
	// then unknown) and the statement's arrays; under a closed loop a batch
	// holds at most the requests that arrived while the previous one ran.
	DefaultMaxBatch = 64
	// DefaultBatchTimeout bounds one batch's database work. A batch does
	// not run under any one request's context (its requests have their
	// own deadlines and may give up; the batch must still finish for the
	// others), so it has a deadline of its own.
	// strategy.Config.InternalDeadline, when shorter, replaces it.
	DefaultBatchTimeout = 30 * time.Second
	// DefaultMaxRequeues bounds how often one request goes back to the
	// queue (its batch was refused with 40001 or 40P01, or a conflict it
	// met was gone by the time it was looked up) before it is answered
	// with an error.
	DefaultMaxRequeues = 20
)

// Options configure combine. The zero value is the registered strategy.
type Options struct {
	MaxBatch     int           // 0: DefaultMaxBatch
	BatchTimeout time.Duration // 0: DefaultBatchTimeout
	MaxRequeues  int           // 0: DefaultMaxRequeues; negative: none
	// Mistake is a deliberate mistake, for the negative controls of table
	// 28-1 only (package compare). NoMistake, the zero value, is the
	// strategy.
	Mistake Mistake
}

// Mistake names a deliberate mistake of Options.Mistake.
type Mistake int

const (
	NoMistake Mistake = iota
	// KeysInOneBatch: a batch takes several requests with one key, so one
	// key's rows meet in one insert and each request is answered from the
	// row that won.
	KeysInOneBatch
	// TakeByCandidates: a batch takes from the stock as many units as it
	// tried to insert rows, not as many as it inserted: a row that ON
	// CONFLICT DO NOTHING dropped (its key or user committed by another
	// batch after this one's snapshot) still takes a unit.
	TakeByCandidates
	// SoldOutUntried: a request ranked past the units the batch saw, and
	// so never tried, is answered SOLD_OUT even when an earlier request's
	// insert met a conflict and left a unit over.
	SoldOutUntried
	// DeadlineIsBusy: a batch whose own deadline (BatchTimeout) expired
	// answers each of its requests BUSY, as if it had written nothing,
	// though its COMMIT may have been sent and may well have committed.
	DeadlineIsBusy
	// BatchUnderFirstCaller: a batch runs under its first request's
	// context, bounded by BatchTimeout, instead of a context of its own:
	// when that caller gives up, the others in the batch, whose callers
	// did not, end with its cancellation.
	BatchUnderFirstCaller
	// GaveUpSoldOut: a request sent back to the queue MaxRequeues times
	// without an error (its row never went in while units were left)
	// answers SOLD_OUT instead of an error ("every batch it was in gave
	// the units to requests ahead of it"), though nothing refused it.
	GaveUpSoldOut
	// AnswersByPosition: a batch's statement has no ORDER BY (its input is
	// read in request order, "so the rows come back in it"), and each row
	// answers the request at its position rather than the one its ord
	// names: when the server's plan returns the rows in another order, a
	// request gets another's answer.
	AnswersByPosition
	// WhyNotByPosition: AnswersByPosition in the second statement, the one
	// that asks why the requests the batch could not settle were refused
	// ("unnest keeps its order"): a request refused by a key committed
	// while the batch waited gets the owner of another request's key.
	WhyNotByPosition
	// SessionRequeueSoldOut: an attempt held open answers SOLD_OUT where
	// its batch of one would be sent back to the queue (its row did not go
	// in, and nothing that refused it is left when it looks), though the
	// SKU has units (outsider round 56's m15).
	SessionRequeueSoldOut
	// IgnoresInternalDeadline: a batch keeps Options.BatchTimeout however
	// short strategy.Config.InternalDeadline is: a batch whose callers
	// all gave up goes on waiting for its 30 s (outsider round 56's m13).
	IgnoresInternalDeadline
	// ResendsAfterEOF: a batch whose connection ended in an unexpected end
	// of stream goes back to the queue, as if nothing had been written.
	// PostgreSQL ends that way a backend it ended while its COMMIT waited
	// for a synchronous standby, having committed locally: the batch sent
	// again finds its rows and answers REPLAY for reservations a failover
	// loses (outsider round 56's m35).
	ResendsAfterEOF
	// AttachDropsInternalDeadline: a deployment made by Meta.Attach keeps
	// Options.BatchTimeout whatever strategy.Config.InternalDeadline says;
	// one made by Open honours it (outsider round 56's m36).
	AttachDropsInternalDeadline
	// FailedBatchErrorToFirst: a batch that failed answers its error to
	// its first request only and sends the others again, as if nothing had
	// been written for them: where its COMMIT had been in doubt and went
	// through, they are answered REPLAY (outsider round 56's m17).
	FailedBatchErrorToFirst
)

func (o Options) withDefaults() Options {
	if o.MaxBatch <= 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.BatchTimeout <= 0 {
		o.BatchTimeout = DefaultBatchTimeout
	}
	switch {
	case o.MaxRequeues < 0:
		o.MaxRequeues = 0
	case o.MaxRequeues == 0:
		o.MaxRequeues = DefaultMaxRequeues
	}
	return o
}

// Meta is the registered strategy "combine".
func Meta() strategy.Meta { return New(Options{}) }

// New returns the strategy with these options; it is not registered.
func New(opts Options) strategy.Meta {
	return strategy.Meta{
		Name:        Name,
		Description: "one stock row per SKU; each node combines the concurrent requests for a SKU into one autocommit statement: one conditional decrement by n, n reservation rows",
		Correctness: "the batch locks the row and re-reads available (READ COMMITTED, docs 13.2.1), inserts at most that many rows through the unique indexes, and decrements by the rows it inserted, in one statement",
		Isolation:   string(pgx.ReadCommitted),
		Retry:       "a batch refused with 40001/40P01, and a request whose conflict was gone when looked up, go back to the queue, at most 20 times",
		Claims:      Claims,
		Open:        pgstrategy.Bind(Open, opts),
		Attach:      pgstrategy.Bind(attach, opts),
		Setup:       schema.Setup,
	}
}

//go:embed schema.sql
var schemaSQL string

// schema is combine's tables for pgstrategy: the advisory lock key that
// serialises their creation ("combine" in ASCII) and the last object
// schema.sql creates.
var schema = pgstrategy.Schema{
	DDL:     schemaSQL,
	Last:    "combine_reservation_one_active",
	LockKey: 0x636f6d62696e65,
	Totals:  `SELECT sku, total FROM combine_stock WHERE sku = ANY($1)`,
	// Least privilege: rows are never deleted, and the ids' identity
	// needs no grant of its own.
	Grants: []pgstrategy.Grant{
		{Table: "combine_stock", Privileges: "SELECT, INSERT, UPDATE (available)"},
		{Table: "combine_reservation", Privileges: "SELECT, INSERT, UPDATE"},
	},
}

// sqlInsertStock loads the stock; a SKU that already has a row is left
// alone and missing from RETURNING, and Open rolls everything back.
const sqlInsertStock = `
INSERT INTO combine_stock (sku, total, available)
SELECT sku, total, total FROM unnest($1::text[], $2::int[]) AS s (sku, total)
ON CONFLICT (sku) DO NOTHING
RETURNING sku`

// Open deploys combine over cfg.DB: it validates cfg before writing
// anything, then, in one transaction, creates the schema if it is missing
// and loads cfg.Stock (strategy.ErrStockExists if any SKU has stock).
func Open(ctx context.Context, cfg strategy.Config, opts Options) (*Deployment, error) {
	if err := schema.Load(ctx, cfg, func(tx pgx.Tx) error { return insertStock(ctx, tx, cfg.Stock) }); err != nil {
		return nil, fmt.Errorf("combine: open: %w", err)
	}
	return newDeployment(cfg, opts), nil
}

// attach is Meta.Attach: it writes nothing and checks that every SKU of
// cfg.Stock has stock with the same total, as a second process of the
// service would. What a node keeps in memory is only requests waiting for
// their batch, which a new process does not have.
func attach(ctx context.Context, cfg strategy.Config, opts Options) (*Deployment, error) {
	if err := schema.Attach(ctx, cfg); err != nil {
		return nil, fmt.Errorf("combine: %w", err)
	}
	if opts.Mistake == AttachDropsInternalDeadline {
		cfg.InternalDeadline = 0 // the mistake
	}
	return newDeployment(cfg, opts), nil
}

func newDeployment(cfg strategy.Config, opts Options) *Deployment {
	opts = opts.withDefaults()
	if cfg.InternalDeadline > 0 && cfg.InternalDeadline < opts.BatchTimeout && opts.Mistake != IgnoresInternalDeadline {
		opts.BatchTimeout = cfg.InternalDeadline
	}
	d := &Deployment{db: cfg.DB, opts: opts, skus: cfg.SKUs(), owns: pgstrategy.NewSKUs(cfg)}
	d.Handles = pgstrategy.NewHandles(Name, cfg.NodeCount(), func(h *pgstrategy.Handle) strategy.Strategy {
		n := &node{Handle: h, d: d, combiners: make(map[string]*combiner, len(d.skus))}
		for _, sku := range d.skus {
			n.combiners[sku] = &combiner{d: d, sku: sku}
		}
		return n
	})
	return d
}

func insertStock(ctx context.Context, tx pgx.Tx, stock []strategy.Stock) error {
	skus := make([]string, len(stock))
	totals := make([]int32, len(stock))
	for i, s := range stock {
		skus[i], totals[i] = s.SKU, int32(s.Total) // Config.Validate bounds Total to int4
	}
	rows, err := tx.Query(ctx, sqlInsertStock, skus, totals)
	if err != nil {
		return fmt.Errorf("stock: insert: %w", err)
	}
	return pgstrategy.AllInserted(rows, skus)
}

// Deployment is combine deployed over one database. Each node combines the
// requests that reach it; nodes share nothing but the pool. A restart
// loses only requests waiting for a batch, which had no answer yet (their
// callers get strategy.ErrNodeClosed or their batch's answer). It
// implements strategy.Deployment, strategy.Restarter and strategy.Ager.
type Deployment struct {
	*pgstrategy.Handles
	db   *pgxpool.Pool
	opts Options
	skus []string
	owns pgstrategy.SKUs

	batches, batched, largest, requeued atomic.Int64
}

// Compile-time checks of what the package offers: its row of capabilities.
var (
	_ strategy.Deployment          = (*Deployment)(nil)
	_ strategy.Restarter           = (*Deployment)(nil)
	_ strategy.Ager                = (*Deployment)(nil)
	_ strategy.Strategy            = (*node)(nil)
	_ strategy.Confirmer           = (*node)(nil)
	_ strategy.Releaser            = (*node)(nil)
	_ strategy.Expirer             = (*node)(nil)
	_ strategy.SessionOpener       = (*node)(nil)
	_ strategy.Queuer              = (*node)(nil)
	_ strategy.ExpirySessionOpener = (*node)(nil)
	_ strategy.Session             = (*session)(nil)
	_ strategy.ExpirySession       = (*session)(nil)
)

// BatchStats counts the batches the deployment's nodes sent since Open.
type BatchStats struct {
	Batches  int64 // transactions sent (a requeued batch counts again)
	Requests int64 // requests in them: Requests/Batches is the mean batch size
	Largest  int64 // the most requests one batch carried
	Requeued int64 // requests that went back to the queue
}

// BatchStats returns the counts so far.
func (d *Deployment) BatchStats() BatchStats {
	return BatchStats{Batches: d.batches.Load(), Requests: d.batched.Load(), Largest: d.largest.Load(), Requeued: d.requeued.Load()}
}

// BatchCounts is BatchStats in the shape of bench.BatchCounter, so the
// benchmarks report batch sizes without importing this package.
func (d *Deployment) BatchCounts() (batches, requests, largest int64) {
	s := d.BatchStats()
	return s.Batches, s.Requests, s.Largest
}

func (d *Deployment) countBatch(n int) {
	d.batches.Add(1)
	d.batched.Add(int64(n))
	for {
		cur := d.largest.Load()
		if int64(n) <= cur || d.largest.CompareAndSwap(cur, int64(n)) {
			return
		}
	}
}

// Audit reports total, the available column and the HELD and CONFIRMED rows
// of each of the deployment's SKUs, in Config order (pgstrategy.StockRow).
func (d *Deployment) Audit(ctx context.Context) ([]strategy.StockAudit, error) {
	return moves.Audit(ctx, d.db, d.skus)
}

// MakeDue makes the HELD reservations with these keys (of this deployment's
// SKUs) due, as seed 000 does to simulate expiry, and returns how many it
// moved.
func (d *Deployment) MakeDue(ctx context.Context, keys []string) (int, error) {
	return moves.MakeDue(ctx, d.db, keys, d.skus)
}

// node is one process of the service: its own combiner per SKU, so the
// requests that reach it are combined with each other, never with another
// node's. Its Handle says whether it was restarted or closed.
type node struct {
	*pgstrategy.Handle
	d         *Deployment
	combiners map[string]*combiner // read-only after newDeployment
}
