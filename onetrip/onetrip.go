package onetrip

import (
	"context"
	_ "embed"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// Name is the name onetrip registers under.
const Name = "onetrip"

func init() { strategy.Register(Meta()) }

// Claims are hotrow's: the same guarantees from the same row lock, and
// least privilege (its schema created by an owner role, Meta.Setup). Like
// hotrow it does not claim strategy.NoWait: a decrement in flight makes the
// next one wait, only for less time.
const Claims = strategy.NoOversell | strategy.IdempotentKey | strategy.OneActivePerUser |
	strategy.ReturnOnce | strategy.Conserves | strategy.NoPhantomSoldOut | strategy.SurvivesRestart |
	strategy.LeastPrivilege

// DefaultMaxRetries bounds how often Reserve runs again when a conflict it
// met is not there any more when it looks (errInvisibleConflict: the other
// reservation was released or expired in between). It practically never
// happens; the bound keeps a pathological case from looping.
const DefaultMaxRetries = 20

// Options configure onetrip. The zero value is the registered strategy.
type Options struct {
	// MaxRetries bounds the reruns of Reserve after errInvisibleConflict; 0
	// means DefaultMaxRetries, negative disables them (the error then reaches
	// the caller, an outcome the contract calls unknown).
	MaxRetries int
	// SoldOutFromMemory is a deliberate mistake, for the negative control
	// ctl-sold-out-from-memory: while a node's hint says its SKU is sold
	// out, a new request is SOLD_OUT whatever the stock says, and only the
	// node's own Release or ExpireDue clears the hint. A unit given back
	// through another node is never seen by this one: a phantom sold-out.
	SoldOutFromMemory bool
	// WhyNotOutsideSession is a deliberate mistake, for the negative control
	// ctl-why-not-outside-session: an attempt held open reads why its
	// insert was refused from the pool, not from its own transaction, so
	// it does not see its own rows: its key sent again, or a new key of a
	// user it holds the SKU for, ends in an error.
	WhyNotOutsideSession bool
	// ExpiryHealsCount is a deliberate mistake, for the negative control
	// ctl-expiry-heals-count: after moving the due rows, the expiry job
	// sets each SKU's available to its total less the active reservations
	// it counts ("available is derived: any drift heals within a tick").
	// Its UPDATE waits for an attempt's lock on the stock row and then
	// keeps the count its statement read before that attempt committed:
	// the attempt's unit comes back while its reservation holds it.
	ExpiryHealsCount bool
	// ConfirmGivesUp is a deliberate mistake, for the negative control
	// ctl-confirm-gives-up: Confirm waits at most 2 s for the reservation's
	// row (lock_timeout) and, when another transaction holds it longer,
	// answers false ("someone else is moving it"): a payment is refused
	// for a hold that nobody moved.
	ConfirmGivesUp bool
	// ConfirmDeadline is a deliberate mistake, for the negative control
	// ctl-confirm-deadline-false: Confirm gives its statement a deadline of
	// 2 s of its own (a context, which no setting of the server shows) and,
	// when it passes, answers false ("the payment came too late to wait
	// for"): a payment is refused for a hold that nobody moved.
	ConfirmDeadline bool
	// WhyNotCountsEnded is a deliberate mistake, for the negative control
	// ctl-why-not-counts-ended: the reading that explains a refused
	// insert counts the user's reservations of the SKU whatever their
	// status, so a user whose hold was released or expired, asking again
	// once the SKU is sold out, is answered USER_LIMIT, not SOLD_OUT.
	WhyNotCountsEnded bool
	// InvisibleConflictSoldOut is a deliberate mistake, for the negative
	// control ctl-invisible-conflict-sold-out: an insert refused by a
	// unique index whose conflict is gone when sqlWhyNot looks (the user's
	// reservation released or expired in between) is answered SOLD_OUT
	// ("refused, and nothing holds it: the unit must be gone") instead of
	// run again: a sold-out while units were free.
	InvisibleConflictSoldOut bool
	// CancelIsSoldOut is a deliberate mistake, for the negative control
	// ctl-cancel-is-sold-out: an insert the server cancelled (57014, a
	// statement_timeout; 55P03, a lock_timeout) is taken for "no unit
	// left" ("it waited for the stock row and got nothing"): a request
	// that waited behind another's attempt is answered SOLD_OUT while the
	// SKU has units.
	CancelIsSoldOut bool
	// HintReplaysByUser is a deliberate mistake, for the negative control
	// ctl-hint-replays-by-user: while a node's hint says its SKU is sold
	// out, a known key of the same user is answered REPLAY ("the user's
	// own key: a resend") whatever SKU it was sold for, where it is
	// KEY_REUSED (outsider round 40's m15).
	HintReplaysByUser bool
	// SoldOutOnlyIfStillNone is a deliberate mistake, for the negative
	// control ctl-sold-out-only-if-still-none: after an insert refused for
	// want of a unit, SOLD_OUT only when sqlWhyNot's later reading has no
	// unit either ("make sure before saying so"), and an empty answer when
	// a unit came back in between (outsider round 46's m01).
	SoldOutOnlyIfStillNone bool
	// SessionForgetsRefusal is a deliberate mistake, for the negative
	// control ctl-session-forgets-refusal: an attempt held open explains
	// a refused insert from sqlWhyNot's reading alone, as if nothing had
	// been tried; a unit given back between the refusal and that reading
	// leaves an empty answer with no error (outsider round 55's m09).
	SessionForgetsRefusal bool
	// SessionAtDefaultIsolation is a deliberate mistake, for the negative
	// control ctl-attempt-at-default-isolation: an attempt held open begins
	// at the server's default level, not READ COMMITTED by name; on a
	// database whose default a DBA set to REPEATABLE READ, its UPDATE of a
	// stock row changed after its first statement fails with 40001
	// (outsider round 55's m10).
	SessionAtDefaultIsolation bool
	// WhyNotKeyLike and SessionWhyNotTrimsUser are deliberate mistakes,
	// for the negative controls ctl-why-not-key-like and
	// ctl-session-why-not-trims-user: the reading that explains a refused
	// insert finds the key's owner with LIKE (the key a pattern), or, in an
	// attempt held open only, the user's reservations with the user
	// trimmed of spaces, where the unique indexes compare exactly
	// (outsider round 55's m32 and m22, m35).
	WhyNotKeyLike, SessionWhyNotTrimsUser bool
	// SessionInvisibleConflictSoldOut is InvisibleConflictSoldOut in an
	// attempt held open only, for the negative control
	// ctl-session-invisible-conflict-sold-out (outsider round 55's m33).
	SessionInvisibleConflictSoldOut bool
	// SessionReplaysByUser is a deliberate mistake, for the negative
	// control ctl-session-replays-by-user: an attempt held open answers a
	// refused key of the same user REPLAY, whatever SKU it was sold for,
	// where it is KEY_REUSED (outsider round 55's m38).
	SessionReplaysByUser bool
	// MakeDueAnySKU is a deliberate mistake, for the negative control
	// ctl-make-due-any-sku: MakeDue ages the HELD reservations with the
	// keys it is given whatever their SKU, another deployment's too
	// (outsider round 55's m27).
	MakeDueAnySKU bool
	// WhyNotFoldsUser and WhyNotFoldsKey are deliberate mistakes, for the
	// negative controls ctl-why-not-folds-user and ctl-why-not-folds-key:
	// the reading that explains a refused insert finds the user's
	// reservations, or the key's owner, ignoring case, where the unique
	// indexes compare exactly (outsider round 46's m23 and m24).
	WhyNotFoldsUser, WhyNotFoldsKey bool
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

// Meta is the registered strategy "onetrip".
func Meta() strategy.Meta { return New(Options{}) }

// New returns the strategy with these options; it is not registered.
func New(opts Options) strategy.Meta {
	return strategy.Meta{
		Name:        Name,
		Description: "one stock row per SKU; decrement and reservation row in one autocommit statement (one round trip), no foreign key to the stock row",
		Correctness: "available > 0 is re-evaluated on the newest row version under the row lock (READ COMMITTED, docs 13.2.1); the insert commits or fails with its decrement",
		Isolation:   string(pgx.ReadCommitted),
		Retry:       "none on the HELD path; a conflict gone by the time it is looked up (released in between) reruns the request, at most 20 times",
		Claims:      Claims,
		Open:        pgstrategy.Bind(Open, opts),
		Attach:      pgstrategy.Bind(attach, opts),
		Setup:       schema.Setup,
	}
}

//go:embed schema.sql
var schemaSQL string

// schema is onetrip's tables for pgstrategy: the advisory lock key that
// serialises their creation ("onetrip" in ASCII) and the last object
// schema.sql creates.
var schema = pgstrategy.Schema{
	DDL:     schemaSQL,
	Last:    "onetrip_reservation_one_active",
	LockKey: 0x6f6e6574726970,
	Totals:  `SELECT sku, total FROM onetrip_stock WHERE sku = ANY($1)`,
	// Least privilege: rows are never deleted, and no sequence is drawn
	// from (the key is the reservation's primary key).
	Grants: []pgstrategy.Grant{
		{Table: "onetrip_stock", Privileges: "SELECT, INSERT, UPDATE (available)"},
		{Table: "onetrip_reservation", Privileges: "SELECT, INSERT, UPDATE"},
	},
}

// sqlInsertStock loads the stock; a SKU that already has a row is left
// alone and missing from RETURNING, and Open rolls everything back.
const sqlInsertStock = `
INSERT INTO onetrip_stock (sku, total, available)
SELECT sku, total, total FROM unnest($1::text[], $2::int[]) AS s (sku, total)
ON CONFLICT (sku) DO NOTHING
RETURNING sku`

// Open deploys onetrip over cfg.DB: it validates cfg before writing
// anything, then, in one transaction, creates the schema if it is missing
// and loads cfg.Stock (strategy.ErrStockExists if any SKU has stock).
func Open(ctx context.Context, cfg strategy.Config, opts Options) (*Deployment, error) {
	if err := schema.Load(ctx, cfg, func(tx pgx.Tx) error { return insertStock(ctx, tx, cfg.Stock) }); err != nil {
		return nil, fmt.Errorf("onetrip: open: %w", err)
	}
	return newDeployment(cfg, opts), nil
}

// attach is Meta.Attach: it writes nothing and checks that every SKU of
// cfg.Stock has stock with the same total, as a second process of the
// service would. onetrip keeps no state in memory.
func attach(ctx context.Context, cfg strategy.Config, opts Options) (*Deployment, error) {
	if err := schema.Attach(ctx, cfg); err != nil {
		return nil, fmt.Errorf("onetrip: %w", err)
	}
	return newDeployment(cfg, opts), nil
}

func newDeployment(cfg strategy.Config, opts Options) *Deployment {
	d := &Deployment{db: cfg.DB, maxRetries: opts.maxRetries(), soldOutFromMemory: opts.SoldOutFromMemory, whyNotOutsideSession: opts.WhyNotOutsideSession, expiryHealsCount: opts.ExpiryHealsCount, confirmGivesUp: opts.ConfirmGivesUp, confirmDeadline: opts.ConfirmDeadline, whyNotCountsEnded: opts.WhyNotCountsEnded, invisibleConflictSoldOut: opts.InvisibleConflictSoldOut, cancelIsSoldOut: opts.CancelIsSoldOut, hintReplaysByUser: opts.HintReplaysByUser, soldOutOnlyIfStillNone: opts.SoldOutOnlyIfStillNone, sessionForgetsRefusal: opts.SessionForgetsRefusal, sessionAtDefaultIsolation: opts.SessionAtDefaultIsolation, whyNotKeyLike: opts.WhyNotKeyLike, sessionWhyNotTrimsUser: opts.SessionWhyNotTrimsUser, sessionInvisibleConflictSoldOut: opts.SessionInvisibleConflictSoldOut, sessionReplaysByUser: opts.SessionReplaysByUser, makeDueAnySKU: opts.MakeDueAnySKU, whyNotFoldsUser: opts.WhyNotFoldsUser, whyNotFoldsKey: opts.WhyNotFoldsKey, skus: cfg.SKUs(), owns: pgstrategy.NewSKUs(cfg)}
	d.Handles = pgstrategy.NewHandles(Name, cfg.NodeCount(), func(h *pgstrategy.Handle) strategy.Strategy {
		return &node{Handle: h, d: d, soldOut: newSoldOutHints(d.skus)}
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

// Deployment is onetrip deployed over one database. Its nodes are handles
// on the same pool and keep nothing in memory but the deployment's SKU
// list, so a restart loses nothing. It implements strategy.Deployment,
// strategy.Restarter and strategy.Ager, and bench's pgbench scripts.
type Deployment struct {
	*pgstrategy.Handles
	db         *pgxpool.Pool
	maxRetries int
	skus       []string
	owns       pgstrategy.SKUs

	soldOutFromMemory bool // Options.SoldOutFromMemory

	whyNotOutsideSession            bool // Options.WhyNotOutsideSession
	expiryHealsCount                bool // Options.ExpiryHealsCount
	confirmGivesUp                  bool // Options.ConfirmGivesUp
	confirmDeadline                 bool // Options.ConfirmDeadline
	whyNotCountsEnded               bool // Options.WhyNotCountsEnded
	invisibleConflictSoldOut        bool // Options.InvisibleConflictSoldOut
	cancelIsSoldOut                 bool // Options.CancelIsSoldOut
	hintReplaysByUser               bool // Options.HintReplaysByUser
	soldOutOnlyIfStillNone          bool // Options.SoldOutOnlyIfStillNone
	sessionForgetsRefusal           bool // Options.SessionForgetsRefusal
	sessionAtDefaultIsolation       bool // Options.SessionAtDefaultIsolation
	whyNotKeyLike                   bool // Options.WhyNotKeyLike
	sessionWhyNotTrimsUser          bool // Options.SessionWhyNotTrimsUser
	sessionInvisibleConflictSoldOut bool // Options.SessionInvisibleConflictSoldOut
	sessionReplaysByUser            bool // Options.SessionReplaysByUser
	makeDueAnySKU                   bool // Options.MakeDueAnySKU
	whyNotFoldsUser                 bool // Options.WhyNotFoldsUser
	whyNotFoldsKey                  bool // Options.WhyNotFoldsKey

	retries atomic.Int64
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
	_ strategy.ExpirySessionOpener = (*node)(nil)
	_ strategy.Session             = (*session)(nil)
	_ strategy.ExpirySession       = (*session)(nil)
)

// Retries is the number of requests the deployment's nodes ran again after
// errInvisibleConflict since Open.
func (d *Deployment) Retries() int64 { return d.retries.Load() }

// Audit reports total, the available column and the HELD and CONFIRMED rows
// of each of the deployment's SKUs, in Config order (pgstrategy.StockRow).
func (d *Deployment) Audit(ctx context.Context) ([]strategy.StockAudit, error) {
	return moves.Audit(ctx, d.db, d.skus)
}

// MakeDue makes the HELD reservations with these keys (of this deployment's
// SKUs) due, as seed 000 does to simulate expiry, and returns how many it
// moved.
func (d *Deployment) MakeDue(ctx context.Context, keys []string) (int, error) {
	if d.makeDueAnySKU {
		tag, err := d.db.Exec(ctx, sqlMakeDueAnySKU, keys) // the mistake
		if err != nil {
			return 0, fmt.Errorf("onetrip: make due: %w", err)
		}
		return int(tag.RowsAffected()), nil
	}
	return moves.MakeDue(ctx, d.db, keys, d.skus)
}

// sqlMakeDueAnySKU is Options.MakeDueAnySKU's mistake: MakeDue without its
// SKU filter.
const sqlMakeDueAnySKU = `
UPDATE onetrip_reservation SET expires_at = now() - interval '400 days', updated_at = now()
WHERE request_key = ANY($1) AND status = 'HELD'`

// node is one handle on the deployment; its Handle says whether it was
// restarted or closed.
type node struct {
	*pgstrategy.Handle
	d       *Deployment
	soldOut soldOutHints
}
