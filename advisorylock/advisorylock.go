// Package advisorylock is a reservebench strategy with no stock counter: a
// reservation takes a per-SKU transaction-level advisory lock
// (pg_advisory_xact_lock), counts the SKU's active reservations, and inserts
// one only if the count is below the stock. It is the worked example of
// docs/adding-a-strategy.md: one package, one import line in package all.
//
// Its constructors are those of every strategy package: [Name], [Options]
// (nothing to tune; one deliberate mistake for the negative controls), [Meta] (the registered strategy), [New] (a variant)
// and [Open], which returns the concrete [*Deployment]
// (strategy.Deployment, strategy.Restarter, strategy.Ager and the pgbench
// script of package bench). Meta.Attach opens a second process over stock
// already loaded: it writes nothing and refuses a SKU without stock or with
// another total. The plumbing every strategy over PostgreSQL needs (the
// session held open, the node table, the schema, the attach check) comes
// from package pgstrategy.
//
// # Guarantees
//
// Every transaction that can add an active reservation for a SKU holds that
// SKU's advisory lock from before it counts until it commits or rolls back,
// so the count it reads (a fresh READ COMMITTED snapshot taken after the
// lock was granted) includes every reservation committed before it, and no
// other reservation for the SKU can commit between its count and its
// commit. Hence active <= total (no oversell). Available is derived (total
// minus active), so the conservation audit balances by construction: drift
// can only come from a reservation the history does not explain, which the
// harness checks separately.
//
// Keys and the one-per-user rule are enforced by a primary key and a partial
// unique index, not by the reads alone: the lock is per SKU, and the same
// key may arrive for another SKU.
//
// Transitions (confirm, release, expire) only change status with
// WHERE status = 'HELD', and only on the deployment's SKUs; a unit comes
// back simply because the row is no longer active, so there is nothing to
// return twice.
//
// Nodes keep nothing in memory: a restart loses nothing, and the old node
// answers strategy.ErrNodeClosed. A session used after its end answers
// strategy.ErrSessionEnded.
//
// # Boundary
//
// All reservations of one SKU are serialised, including those that end
// SOLD_OUT or USER_LIMIT: a held-open attempt makes every later request for
// the SKU wait (the phantom scenario shows t2 and t3 waiting for t1), and
// throughput of a hot SKU is one transaction at a time. Releases and expiry
// do not take the lock; they only ever make units free.
package advisorylock

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// Name is the name the strategy registers under.
const Name = "advisorylock"

func init() { strategy.Register(Meta()) }

// Options configure the strategy. There is nothing to tune yet: the zero
// value is the registered strategy.
type Options struct {
	// SessionLockApart is a deliberate mistake, for the negative controls
	// of table 28-1 only: an attempt held open takes the SKU's lock under
	// another key than a plain request does, so the two never exclude
	// each other and both count the last unit as free.
	SessionLockApart bool
	// ServerDefaultIsolation is a deliberate mistake, for the negative
	// controls of table 28-1 only: transactions begin at the server's
	// default level, which a DBA may have set to REPEATABLE READ; a request
	// that waited for the lock then counts from before the wait.
	ServerDefaultIsolation bool
	// LockByPosition is a deliberate mistake, for the negative controls of
	// table 28-1 only: the SKU's lock id is its position in the
	// deployment's configuration, so a second process whose configuration
	// lists the SKUs in another order locks another SKU's id.
	LockByPosition bool
	// LockFirstAttemptOnly is a deliberate mistake, for the negative
	// controls of table 28-1 only: a session takes its advisory lock in its
	// first attempt only ("a transaction-level lock is held until the
	// session ends": a round trip saved per item of a cart), so the second
	// SKU of a cart is reserved under the first SKU's lock, and a plain
	// request for it sells its last unit too.
	LockFirstAttemptOnly bool
	// UserFoldedOnReplay is a deliberate mistake, for the negative controls
	// of table 28-1 only: a known key's user is compared ignoring case
	// ("usernames are case-insensitive"), so another user's resend of it
	// is answered REPLAY with the owner's reservation, not KEY_REUSED.
	UserFoldedOnReplay bool
	// SoldOutBeforeKey is a deliberate mistake, for the negative controls
	// of table 28-1 only: under the lock the count comes first, and a SKU
	// with no unit left is SOLD_OUT before the key is looked up ("no need
	// to read anything else"), so a request whose key took the last unit,
	// or another user's request for that key, is told SOLD_OUT.
	SoldOutBeforeKey bool
	// BigSKUNoLock is a deliberate mistake, for the negative controls of
	// table 28-1 only: a plain request for a SKU of 1,000 units or more
	// takes no lock ("nobody races for the last of a thousand"), so it
	// counts the last unit as free while an attempt held open has it.
	BigSKUNoLock bool
	// RestartLockApart is a deliberate mistake, for the negative controls
	// of table 28-1 only: a node started by Restart takes its SKU locks in
	// a namespace of its own ("nothing its dead predecessor may still hold
	// can block it"), so it never waits for the other nodes.
	RestartLockApart bool
	// DeadlockSoldOut is a deliberate mistake, for the negative controls of
	// table 28-1 only: an attempt held open that PostgreSQL ends as a
	// deadlock's victim (40P01) answers SOLD_OUT ("it lost the race").
	DeadlockSoldOut bool
	// PlainDeadlockSoldOut is DeadlockSoldOut on the plain path: a Reserve
	// that PostgreSQL ends as a deadlock's victim answers SOLD_OUT.
	PlainDeadlockSoldOut bool
	// SessionServerDefaultIsolation is a deliberate mistake, for the
	// negative controls of table 28-1 only: attempts held open begin at
	// the server's default level (the plain path names READ COMMITTED), so
	// under a default of REPEATABLE READ an attempt counts a SKU from its
	// first statement's snapshot, before a unit of it was sold elsewhere.
	SessionServerDefaultIsolation bool
	// LockSaltPerProcess is a deliberate mistake, for the negative
	// controls of table 28-1 only: the SKU's lock id hashes the SKU with a
	// salt drawn once per process ("a seeded hash resists collisions"), so
	// the nodes of one process exclude each other and two processes never
	// do.
	LockSaltPerProcess bool
	// SessionCountsOnce is a deliberate mistake, for the negative controls
	// of table 28-1 only: an attempt held open counts a SKU's active
	// reservations once and keeps the count, adding its own ("it holds the
	// SKU's lock"), so a unit released outside it since is not seen.
	SessionCountsOnce bool
}

// processSalt is Options.LockSaltPerProcess's salt: this process's own.
var processSalt = fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano())

// isolation is the level the transactions begin at.
func (o Options) isolation() pgx.TxIsoLevel {
	if o.ServerDefaultIsolation {
		return ""
	}
	return pgx.ReadCommitted
}

// Meta describes the strategy for the registry.
func Meta() strategy.Meta { return New(Options{}) }

// New describes the strategy with these options; it is not registered.
func New(opts Options) strategy.Meta {
	return strategy.Meta{
		Name:        Name,
		Description: "no counter: per-SKU advisory lock, count active rows, insert",
		Correctness: "the count and the insert happen under one per-SKU lock held until commit",
		// The transactions begin at READ COMMITTED by name: the count relies
		// on a snapshot taken after the lock was granted, which the server's
		// default, if a DBA set it to REPEATABLE READ, would not give.
		Isolation: "read committed",
		Retry:     "none: the lock serialises the SKU's reservations, nothing can fail for another's sake",
		Claims: strategy.NoOversell | strategy.IdempotentKey | strategy.OneActivePerUser | strategy.ReturnOnce |
			strategy.Conserves | strategy.NoPhantomSoldOut | strategy.SurvivesRestart | strategy.LeastPrivilege,
		Open:   pgstrategy.Bind(Open, opts),
		Attach: pgstrategy.Bind(attach, opts),
		Setup:  schema.Setup,
	}
}

//go:embed schema.sql
var schemaSQL string

// schema is the strategy's tables for pgstrategy: the advisory lock key that
// serialises their creation, and the last object schema.sql creates.
// Every strategy declares its pgstrategy.Schema like this, with its own values.
var schema = pgstrategy.Schema{
	DDL:     schemaSQL,
	Last:    "advisorylock_active_by_sku",
	LockKey: 7283001,
	Totals:  `SELECT sku, total FROM advisorylock_stock WHERE sku = ANY($1)`,
	// Least privilege: the stock row is written once; reservations are
	// inserted and moved, never deleted.
	Grants: []pgstrategy.Grant{
		{Table: "advisorylock_stock", Privileges: "SELECT, INSERT"},
		{Table: "advisorylock_reservation", Privileges: "SELECT, INSERT, UPDATE"},
	},
}

const (
	insertStockSQL = `INSERT INTO advisorylock_stock (sku, total) VALUES ($1, $2) ON CONFLICT (sku) DO NOTHING`

	// lockSKUSQL takes the SKU's lock until the transaction ends. The
	// two-argument form keeps our keys apart from other users of advisory
	// locks in the same database.
	lockSKUSQL = `SELECT pg_advisory_xact_lock(7283, hashtext($1))`

	countSQL = `
		SELECT s.total,
		       (SELECT count(*) FROM advisorylock_reservation r
		         WHERE r.sku = s.sku AND r.status IN ('HELD','CONFIRMED'))
		FROM advisorylock_stock s WHERE s.sku = $1`

	insertSQL = `
		INSERT INTO advisorylock_reservation (request_key, user_id, sku, status, expires_at)
		VALUES ($1, $2, $3, 'HELD', now() + $4::interval)
		RETURNING expires_at`

	lookupSQL = `SELECT user_id, sku, status, expires_at FROM advisorylock_reservation WHERE request_key = $1`

	activeOfUserSQL = `
		SELECT EXISTS (SELECT 1 FROM advisorylock_reservation
		               WHERE sku = $1 AND user_id = $2 AND status IN ('HELD','CONFIRMED'))`

	confirmSQL = `
		UPDATE advisorylock_reservation SET status = 'CONFIRMED'
		WHERE request_key = $1 AND sku = ANY($3) AND status = 'HELD' AND ($2 OR expires_at >= now())`

	releaseSQL = `
		UPDATE advisorylock_reservation SET status = 'RELEASED'
		WHERE request_key = $1 AND sku = ANY($2) AND status = 'HELD'`

	expireSQL = `
		UPDATE advisorylock_reservation SET status = 'EXPIRED'
		WHERE sku = ANY($1) AND status = 'HELD' AND expires_at < now()`

	makeDueSQL = `
		UPDATE advisorylock_reservation SET expires_at = now() - interval '400 days'
		WHERE request_key = ANY($1) AND sku = ANY($2) AND status = 'HELD'`

	auditSQL = `
		SELECT s.sku, s.total,
		       (SELECT count(*) FROM advisorylock_reservation r
		         WHERE r.sku = s.sku AND r.status IN ('HELD','CONFIRMED'))
		FROM advisorylock_stock s WHERE s.sku = ANY($1) ORDER BY s.sku`
)

// Open creates the schema if needed and loads the stock of cfg, in one
// transaction; a SKU that already has stock fails the whole Open with an
// error matching strategy.ErrStockExists.
func Open(ctx context.Context, cfg strategy.Config, opts Options) (*Deployment, error) {
	err := schema.Load(ctx, cfg, func(tx pgx.Tx) error {
		for _, s := range cfg.Stock {
			tag, err := tx.Exec(ctx, insertStockSQL, s.SKU, s.Total)
			if err != nil {
				return fmt.Errorf("insert stock %s: %w", s.SKU, err)
			}
			if tag.RowsAffected() == 0 {
				return fmt.Errorf("%w: %s", strategy.ErrStockExists, s.SKU)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("advisorylock: open: %w", err)
	}
	return newDeployment(cfg, opts), nil
}

// attach is Meta.Attach: it checks the stock another process loaded and
// writes nothing.
// Every strategy's attach has this shape (its options, then
// pgstrategy.Schema.Attach, then its deployment) on purpose.
func attach(ctx context.Context, cfg strategy.Config, opts Options) (*Deployment, error) {
	if err := schema.Attach(ctx, cfg); err != nil {
		return nil, fmt.Errorf("advisorylock: %w", err)
	}
	return newDeployment(cfg, opts), nil
}

func newDeployment(cfg strategy.Config, opts Options) *Deployment {
	d := &Deployment{db: cfg.DB, skus: cfg.SKUs(), owns: pgstrategy.NewSKUs(cfg), opts: opts, lockSQL: lockSKUSQL}
	if opts.LockSaltPerProcess {
		d.lockSQL = "SELECT pg_advisory_xact_lock(7283, hashtext($1 || '" + processSalt + "'))"
	}
	if opts.LockByPosition {
		quoted := make([]string, len(d.skus))
		for i, sku := range d.skus {
			quoted[i] = "'" + strings.ReplaceAll(sku, "'", "''") + "'"
		}
		d.lockSQL = "SELECT pg_advisory_xact_lock(7283, array_position(ARRAY[" + strings.Join(quoted, ",") + "]::text[], $1))"
	}
	var started atomic.Int32
	d.Handles = pgstrategy.NewHandles(Name, cfg.NodeCount(), func(h *pgstrategy.Handle) strategy.Strategy {
		return &node{Handle: h, d: d, restarted: int(started.Add(1)) > cfg.NodeCount()}
	})
	return d
}

// Deployment keeps nothing in memory but its SKUs: every node is a handle
// on the pool, a restart loses nothing, and Node, Restart and Close are
// pgstrategy.Handles'.
type Deployment struct {
	*pgstrategy.Handles
	db   *pgxpool.Pool
	skus []string
	owns pgstrategy.SKUs
	opts Options
	// lockSQL takes the SKU's lock: lockSKUSQL but for Options.LockByPosition.
	lockSQL string
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

// Audit reports total, active and the derived available (total - active)
// of each SKU of the deployment.
func (d *Deployment) Audit(ctx context.Context) ([]strategy.StockAudit, error) {
	rows, err := d.db.Query(ctx, auditSQL, d.skus)
	if err != nil {
		return nil, fmt.Errorf("advisorylock: audit: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (strategy.StockAudit, error) {
		var a strategy.StockAudit
		err := r.Scan(&a.SKU, &a.Total, &a.Active)
		a.Available = a.Total - a.Active
		return a, err
	})
}

// MakeDue moves expires_at of the deployment's HELD reservations with these
// keys into the past.
func (d *Deployment) MakeDue(ctx context.Context, keys []string) (int, error) {
	tag, err := d.db.Exec(ctx, makeDueSQL, keys, d.skus)
	if err != nil {
		return 0, fmt.Errorf("advisorylock: make due: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

type node struct {
	*pgstrategy.Handle
	d         *Deployment
	restarted bool // started by Restart (Options.RestartLockApart)
}

// lockSQL is the deployment's lock statement, or the one a mistake of
// Options gives this node for sku.
func (n *node) lockSQL(sku string) string {
	switch {
	case n.d.opts.RestartLockApart && n.restarted:
		return `SELECT pg_advisory_xact_lock(7284, hashtext($1))`
	case n.d.opts.BigSKUNoLock && n.d.owns[sku] >= 1000:
		return `SELECT 1 WHERE $1::text IS NOT NULL`
	}
	return n.d.lockSQL
}

func (n *node) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if res, err := n.Admit(n.d.owns, req); err != nil {
		return res, err
	}
	var res strategy.Result
	var badReq error
	// READ COMMITTED by name, never the server's default: reserveIn counts
	// with statements that each take a snapshot after the lock was granted,
	// and a default of REPEATABLE READ would count from before the wait.
	err := pgx.BeginTxFunc(ctx, n.d.db, pgx.TxOptions{IsoLevel: n.d.opts.isolation()}, func(tx pgx.Tx) error {
		var err error
		res, err = reserveIn(ctx, tx, req, n.lockSQL(req.SKU), n.d.opts)
		if errors.Is(err, strategy.ErrBadRequest) {
			badReq = err
			return err // roll back
		}
		return err
	})
	if badReq != nil {
		return res, badReq
	}
	if pgErr := (*pgconn.PgError)(nil); n.d.opts.PlainDeadlockSoldOut && errors.As(err, &pgErr) && pgErr.Code == pgerrcode.DeadlockDetected {
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil // the mistake: "it lost the race"
	}
	if err != nil {
		return strategy.Result{}, fmt.Errorf("advisorylock: reserve %s: %w", req.Key, err)
	}
	return res, nil
}

// reserveIn is the whole decision, inside tx; the plain path and sessions
// share it.
func reserveIn(ctx context.Context, tx pgx.Tx, req strategy.Request, lockSQL string, opts Options) (strategy.Result, error) {
	return reserveCounted(ctx, tx, req, lockSQL, opts, nil)
}

// reserveCounted is reserveIn with Options.SessionCountsOnce's counts (nil:
// count every time).
func reserveCounted(ctx context.Context, tx pgx.Tx, req strategy.Request, lockSQL string, opts Options, counts map[string][2]int) (strategy.Result, error) {
	if _, err := tx.Exec(ctx, lockSQL, req.SKU); err != nil {
		return strategy.Result{}, err
	}
	// Under the lock every statement sees what committed before it was granted.
	if opts.SoldOutBeforeKey {
		var total, active int
		if err := tx.QueryRow(ctx, countSQL, req.SKU).Scan(&total, &active); err == nil && active >= total {
			return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil
		}
	}
	if existing, found, err := lookup(ctx, tx, req.Key); err != nil {
		return strategy.Result{}, err
	} else if found {
		if opts.UserFoldedOnReplay && strings.EqualFold(existing.User, req.User) && existing.SKU == req.SKU {
			return strategy.Result{Outcome: strategy.OutcomeReplay, Reservation: existing}, nil
		}
		return pgstrategy.KnownKey(req, existing), nil
	}
	var total, active int
	if c, ok := counts[req.SKU]; ok {
		total, active = c[0], c[1]
	} else if err := tx.QueryRow(ctx, countSQL, req.SKU).Scan(&total, &active); errors.Is(err, pgx.ErrNoRows) {
		return strategy.BadRequest(strategy.UnknownSKU(req.SKU))
	} else if err != nil {
		return strategy.Result{}, err
	}
	var has bool
	if err := tx.QueryRow(ctx, activeOfUserSQL, req.SKU, req.User).Scan(&has); err != nil {
		return strategy.Result{}, err
	}
	if has {
		return strategy.Result{Outcome: strategy.OutcomeUserLimit}, nil
	}
	if active >= total {
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil
	}
	sp, err := tx.Begin(ctx) // a savepoint, so a key conflict leaves tx usable
	if err != nil {
		return strategy.Result{}, err
	}
	var expires time.Time
	err = sp.QueryRow(ctx, insertSQL, req.Key, req.User, req.SKU, req.TTL).Scan(&expires)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		// The same key, committed meanwhile for another SKU (whose lock we
		// do not hold): answer from the row that won.
		_ = sp.Rollback(ctx)
		existing, _, lerr := lookup(ctx, tx, req.Key)
		if lerr != nil {
			return strategy.Result{}, lerr
		}
		return pgstrategy.KnownKey(req, existing), nil
	}
	if err != nil {
		return strategy.Result{}, err
	}
	if err := sp.Commit(ctx); err != nil {
		return strategy.Result{}, err
	}
	if counts != nil {
		counts[req.SKU] = [2]int{total, active + 1}
	}
	return strategy.Result{Outcome: strategy.OutcomeHeld, Reservation: strategy.Reservation{
		Key: req.Key, User: req.User, SKU: req.SKU, Status: strategy.StatusHeld, ExpiresAt: expires,
	}}, nil
}

func lookup(ctx context.Context, q pgstrategy.Querier, key string) (strategy.Reservation, bool, error) {
	return pgstrategy.ScanReservation(q.QueryRow(ctx, lookupSQL, key), key)
}

func (n *node) Lookup(ctx context.Context, key string) (strategy.Reservation, error) {
	if ok, err := n.CheckKey(key); !ok {
		return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, err
	}
	r, _, err := lookup(ctx, n.d.db, key)
	if err != nil {
		return r, fmt.Errorf("advisorylock: lookup %s: %w", key, err)
	}
	return r, nil
}

func (n *node) Confirm(ctx context.Context, key string, mode strategy.ConfirmMode) (bool, error) {
	if ok, err := n.CheckKey(key); !ok {
		return false, err
	}
	tag, err := n.d.db.Exec(ctx, confirmSQL, key, mode == strategy.ConfirmUntilExpired, n.d.skus)
	if err != nil {
		return false, fmt.Errorf("advisorylock: confirm %s: %w", key, err)
	}
	return tag.RowsAffected() == 1, nil
}

func (n *node) Release(ctx context.Context, key string) (int, error) {
	if ok, err := n.CheckKey(key); !ok {
		return 0, err
	}
	tag, err := n.d.db.Exec(ctx, releaseSQL, key, n.d.skus)
	if err != nil {
		return 0, fmt.Errorf("advisorylock: release %s: %w", key, err)
	}
	return int(tag.RowsAffected()), nil
}

func (n *node) ExpireDue(ctx context.Context) (int, error) {
	if err := n.Check(); err != nil {
		return 0, err
	}
	return expireIn(ctx, n.d.db, n.d.skus)
}

type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func expireIn(ctx context.Context, db execer, skus []string) (int, error) {
	tag, err := db.Exec(ctx, expireSQL, skus)
	if err != nil {
		return 0, fmt.Errorf("advisorylock: expire: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// session is an attempt, or the expiry job, held open (pgstrategy.Tx).
type session struct {
	*pgstrategy.Tx
	d      *Deployment
	node   *node
	locked bool              // an attempt took its lock (Options.LockFirstAttemptOnly)
	counts map[string][2]int // total and active per SKU (Options.SessionCountsOnce)
}

// OpenSession holds an attempt open.
// (OpenSession, OpenExpirySession and openSession have the same shape in
// every strategy package on purpose: the plumbing is pgstrategy's, what
// stays is the package's own session type.)
func (n *node) OpenSession(ctx context.Context) (strategy.Session, error) {
	return pgstrategy.AsSession(n.openSession(ctx))
}

func (n *node) OpenExpirySession(ctx context.Context) (strategy.ExpirySession, error) {
	return pgstrategy.AsExpirySession(n.openSession(ctx))
}

func (n *node) openSession(ctx context.Context) (*session, error) {
	iso := n.d.opts.isolation()
	if n.d.opts.SessionServerDefaultIsolation {
		iso = ""
	}
	tx, err := n.BeginTx(ctx, n.d.db, Name, iso, pgstrategy.TxHooks{})
	if err != nil {
		return nil, err
	}
	return &session{Tx: tx, d: n.d, node: n}, nil
}

func (s *session) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if err := s.d.owns.Check(req); err != nil {
		return strategy.BadRequest(err)
	}
	lockSQL := s.d.lockSQL
	if s.d.opts.RestartLockApart && s.node.restarted {
		lockSQL = s.node.lockSQL(req.SKU)
	}
	if s.d.opts.SessionLockApart {
		lockSQL = `SELECT pg_advisory_xact_lock(hashtext($1))`
	}
	if s.d.opts.LockFirstAttemptOnly && s.locked {
		lockSQL = `SELECT 1 WHERE $1::text IS NOT NULL`
	}
	var counts map[string][2]int
	if s.d.opts.SessionCountsOnce {
		if s.counts == nil {
			s.counts = map[string][2]int{}
		}
		counts = s.counts
	}
	res, err := pgstrategy.InTx(s.Tx, func(tx pgx.Tx) (strategy.Result, error) {
		return reserveCounted(ctx, tx, req, lockSQL, s.d.opts, counts)
	})
	if pgErr := (*pgconn.PgError)(nil); s.d.opts.DeadlockSoldOut && errors.As(err, &pgErr) && pgErr.Code == pgerrcode.DeadlockDetected {
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil // "it lost the race"
	}
	s.locked = s.locked || err == nil
	return res, err
}

// ExpireDue runs the expiry job inside the session (kill-release scenario).
func (s *session) ExpireDue(ctx context.Context) (int, error) {
	return pgstrategy.InTx(s.Tx, func(tx pgx.Tx) (int, error) { return expireIn(ctx, tx, s.d.skus) })
}
