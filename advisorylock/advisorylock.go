// Package advisorylock is a reservebench strategy with no stock counter: a
// reservation takes a per-SKU transaction-level advisory lock
// (pg_advisory_xact_lock), counts the SKU's active reservations, and inserts
// one only if the count is below the stock. It is the worked example of
// docs/adding-a-strategy.md: one package, one import line in package all.
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
// WHERE status = 'HELD'; a unit comes back simply because the row is no
// longer active, so there is nothing to return twice.
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
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

func init() { strategy.Register(Meta()) }

// Meta describes the strategy for the registry.
func Meta() strategy.Meta {
	return strategy.Meta{
		Name:        "advisorylock",
		Description: "no counter: per-SKU advisory lock, count active rows, insert",
		Correctness: "the count and the insert happen under one per-SKU lock held until commit",
		Claims: strategy.NoOversell | strategy.IdempotentKey | strategy.OneActivePerUser | strategy.ReturnOnce |
			strategy.Conserves | strategy.NoPhantomSoldOut | strategy.SurvivesRestart,
		Open: Open,
	}
}

//go:embed schema.sql
var schemaSQL string

const (
	// schemaLockKey serialises concurrent schema creation.
	schemaLockKey = 7283001

	countStockSQL = `SELECT count(*) FROM advisorylock_stock WHERE sku = ANY($1)`

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
		WHERE request_key = $1 AND status = 'HELD' AND ($2 OR expires_at >= now())`

	releaseSQL = `UPDATE advisorylock_reservation SET status = 'RELEASED' WHERE request_key = $1 AND status = 'HELD'`

	expireSQL = `
		UPDATE advisorylock_reservation SET status = 'EXPIRED'
		WHERE sku = ANY($1) AND status = 'HELD' AND expires_at < now()`

	makeDueSQL = `
		UPDATE advisorylock_reservation SET expires_at = now() - interval '1 second'
		WHERE request_key = ANY($1) AND status = 'HELD'`

	auditSQL = `
		SELECT s.sku, s.total,
		       (SELECT count(*) FROM advisorylock_reservation r
		         WHERE r.sku = s.sku AND r.status IN ('HELD','CONFIRMED'))
		FROM advisorylock_stock s WHERE s.sku = ANY($1) ORDER BY s.sku`
)

// Open creates the schema if needed and loads the stock of cfg.
func Open(ctx context.Context, cfg strategy.Config) (strategy.Deployment, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Attach {
		var n int
		if err := cfg.DB.QueryRow(ctx, countStockSQL, cfg.SKUs()).Scan(&n); err != nil {
			return nil, fmt.Errorf("advisorylock: attach: %w", err)
		}
		if n != len(cfg.Stock) {
			return nil, fmt.Errorf("advisorylock: attach: %w: %d of %d SKUs have stock", strategy.ErrConfig, n, len(cfg.Stock))
		}
		return &deployment{db: cfg.DB, skus: cfg.SKUs(), nodes: cfg.NodeCount()}, nil
	}
	err := pgx.BeginFunc(ctx, cfg.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, schemaLockKey); err != nil {
			return fmt.Errorf("lock schema: %w", err)
		}
		if _, err := tx.Exec(ctx, schemaSQL); err != nil {
			return fmt.Errorf("create schema: %w", err)
		}
		for _, s := range cfg.Stock {
			tag, err := tx.Exec(ctx, insertStockSQL, s.SKU, s.Total)
			if err != nil {
				return fmt.Errorf("insert stock %s: %w", s.SKU, err)
			}
			if tag.RowsAffected() == 0 {
				return fmt.Errorf("advisorylock: %w: %s", strategy.ErrStockExists, s.SKU)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("advisorylock: open: %w", err)
	}
	return &deployment{db: cfg.DB, skus: cfg.SKUs(), nodes: cfg.NodeCount()}, nil
}

// deployment keeps nothing in memory: every node is the same handle on the
// pool, and a restart loses nothing.
type deployment struct {
	db    *pgxpool.Pool
	skus  []string
	nodes int
}

var (
	_ strategy.Deployment    = (*deployment)(nil)
	_ strategy.Ager          = (*deployment)(nil)
	_ strategy.Strategy      = (*node)(nil)
	_ strategy.Confirmer     = (*node)(nil)
	_ strategy.Releaser      = (*node)(nil)
	_ strategy.Expirer       = (*node)(nil)
	_ strategy.SessionOpener = (*node)(nil)
)

func (d *deployment) Node(int) strategy.Strategy         { return &node{d: d} }
func (d *deployment) Restart(context.Context, int) error { return nil }
func (d *deployment) Close() error                       { return nil }

func (d *deployment) Audit(ctx context.Context) ([]strategy.StockAudit, error) {
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

func (d *deployment) MakeDue(ctx context.Context, keys []string) (int, error) {
	tag, err := d.db.Exec(ctx, makeDueSQL, keys)
	if err != nil {
		return 0, fmt.Errorf("advisorylock: make due: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

type node struct{ d *deployment }

func (n *node) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if err := req.Validate(); err != nil {
		return strategy.BadRequest(err)
	}
	var res strategy.Result
	var badReq error
	err := pgx.BeginFunc(ctx, n.d.db, func(tx pgx.Tx) error {
		var err error
		res, err = reserveIn(ctx, tx, req)
		if errors.Is(err, strategy.ErrBadRequest) {
			badReq = err
			return err // roll back
		}
		return err
	})
	if badReq != nil {
		return res, badReq
	}
	if err != nil {
		return strategy.Result{}, fmt.Errorf("advisorylock: reserve %s: %w", req.Key, err)
	}
	return res, nil
}

// reserveIn is the whole decision, inside tx; the plain path and sessions
// share it.
func reserveIn(ctx context.Context, tx pgx.Tx, req strategy.Request) (strategy.Result, error) {
	if _, err := tx.Exec(ctx, lockSKUSQL, req.SKU); err != nil {
		return strategy.Result{}, err
	}
	// Under the lock every statement sees what committed before it was granted.
	if existing, err := lookup(ctx, tx, req.Key); err != nil {
		return strategy.Result{}, err
	} else if existing.Status != strategy.StatusNotFound {
		return answerKnownKey(existing, req), nil
	}
	var total, active int
	if err := tx.QueryRow(ctx, countSQL, req.SKU).Scan(&total, &active); errors.Is(err, pgx.ErrNoRows) {
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
		existing, lerr := lookup(ctx, tx, req.Key)
		if lerr != nil {
			return strategy.Result{}, lerr
		}
		return answerKnownKey(existing, req), nil
	}
	if err != nil {
		return strategy.Result{}, err
	}
	if err := sp.Commit(ctx); err != nil {
		return strategy.Result{}, err
	}
	return strategy.Result{Outcome: strategy.OutcomeHeld, Reservation: strategy.Reservation{
		Key: req.Key, User: req.User, SKU: req.SKU, Status: strategy.StatusHeld, ExpiresAt: expires,
	}}, nil
}

func answerKnownKey(existing strategy.Reservation, req strategy.Request) strategy.Result {
	if existing.User != req.User || existing.SKU != req.SKU {
		return strategy.Result{Outcome: strategy.OutcomeKeyReused, Reservation: existing}
	}
	return strategy.Result{Outcome: strategy.OutcomeReplay, Reservation: existing}
}

type queryRower interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func lookup(ctx context.Context, q queryRower, key string) (strategy.Reservation, error) {
	r := strategy.Reservation{Key: key}
	err := q.QueryRow(ctx, lookupSQL, key).Scan(&r.User, &r.SKU, &r.Status, &r.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, nil
	}
	return r, err
}

func (n *node) Lookup(ctx context.Context, key string) (strategy.Reservation, error) {
	r, err := lookup(ctx, n.d.db, key)
	if err != nil {
		return r, fmt.Errorf("advisorylock: lookup %s: %w", key, err)
	}
	return r, nil
}

func (n *node) Confirm(ctx context.Context, key string, mode strategy.ConfirmMode) (bool, error) {
	tag, err := n.d.db.Exec(ctx, confirmSQL, key, mode == strategy.ConfirmUntilExpired)
	if err != nil {
		return false, fmt.Errorf("advisorylock: confirm %s: %w", key, err)
	}
	return tag.RowsAffected() == 1, nil
}

func (n *node) Release(ctx context.Context, key string) (int, error) {
	tag, err := n.d.db.Exec(ctx, releaseSQL, key)
	if err != nil {
		return 0, fmt.Errorf("advisorylock: release %s: %w", key, err)
	}
	return int(tag.RowsAffected()), nil
}

func (n *node) ExpireDue(ctx context.Context) (int, error) { return expireIn(ctx, n.d.db, n.d.skus) }

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

func (n *node) OpenSession(ctx context.Context) (strategy.Session, error) {
	conn, err := n.d.db.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("advisorylock: session: %w", err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		conn.Release()
		return nil, fmt.Errorf("advisorylock: session: %w", err)
	}
	return &session{conn: conn, tx: tx, skus: n.d.skus}, nil
}

type session struct {
	conn *pgxpool.Conn
	tx   pgx.Tx
	skus []string
	done bool
}

var _ strategy.SessionExpirer = (*session)(nil)

// ExpireDue runs the expiry job inside the session (kill-release scenario).
func (s *session) ExpireDue(ctx context.Context) (int, error) { return expireIn(ctx, s.tx, s.skus) }

func (s *session) Backends() []uint32 { return []uint32{s.conn.Conn().PgConn().PID()} }

func (s *session) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if err := req.Validate(); err != nil {
		return strategy.BadRequest(err)
	}
	return reserveIn(ctx, s.tx, req)
}

func (s *session) finish(ctx context.Context, commit bool) error {
	if s.done {
		return nil
	}
	s.done = true
	defer s.conn.Release()
	if commit {
		return s.tx.Commit(ctx)
	}
	return s.tx.Rollback(ctx)
}

func (s *session) Commit(ctx context.Context) error   { return s.finish(ctx, true) }
func (s *session) Rollback(ctx context.Context) error { return s.finish(ctx, false) }
