package redislock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// A reservation, as seed 002 runs it:
//
//	lookup the key                      REPLAY / KEY_REUSED, no lock
//	check available (pool)              0: the key again, else SOLD_OUT, no lock
//	take the SKU's lock                 not within Wait, or Redis down: BUSY
//	BEGIN
//	  check available again             the double check, under the lock;
//	                                      0: the key again (REPLAY / KEY_REUSED), else SOLD_OUT
//	  SAVEPOINT; INSERT ... 'HELD' ON CONFLICT (request_key) DO NOTHING
//	  UPDATE stock SET available = available - 1 WHERE sku = $1 AND available > 0
//	      0 rows: ROLLBACK TO SAVEPOINT, SOLD_OUT   (the last line: the database decides)
//	COMMIT
//	release the lock                    compare-and-delete, after the commit
const (
	sqlLookup    = `SELECT user_id, sku, status, expires_at FROM {p}_reservation WHERE request_key = $1`
	sqlAvailable = `SELECT available FROM {p}_stock WHERE sku = $1`
	sqlInsert    = `
INSERT INTO {p}_reservation (request_key, user_id, sku, status, expires_at)
VALUES ($1, $2, $3, 'HELD', now() + $4 * interval '1 microsecond')
ON CONFLICT (request_key) DO NOTHING
RETURNING expires_at`
	sqlTakeUnit = `UPDATE {p}_stock SET available = available - 1 WHERE sku = $1 AND available > 0`
	// sqlTakeUnitFromCheck is Options.Mistake SetFromCheck's decrement:
	// the double check's read ($2) less one.
	sqlTakeUnitFromCheck = `UPDATE {p}_stock SET available = $2::int - 1 WHERE sku = $1 AND available > 0`
	// sqlUserHolds is the negative control PreCheckUser's.
	sqlUserHolds = `SELECT EXISTS (SELECT 1 FROM {p}_reservation WHERE sku = $1 AND user_id = $2 AND status IN ('HELD', 'CONFIRMED'))`
	// sqlTakeUnitLockOnly is the negative control's: no condition.
	sqlTakeUnitLockOnly = `UPDATE {p}_stock SET available = available - 1 WHERE sku = $1`

	codeUniqueViolation = "23505"
	constraintOneActive = "_one_active"
)

var (
	busy    = strategy.Result{Outcome: strategy.OutcomeBusy}
	soldOut = strategy.Result{Outcome: strategy.OutcomeSoldOut}
)

// Reserve is the seed's flow above, in a transaction of its own.
func (n *node) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if res, err := n.Admit(n.d.owns, req); err != nil {
		return res, err
	}
	d := n.d
	if res, done, err := d.beforeLock(ctx, d.db, req); done || err != nil {
		return res, wrap("reserve", req.Key, err)
	}
	left := 0
	if d.lastUnitWaitSoldOut {
		if err := d.db.QueryRow(ctx, d.tb.q(sqlAvailable), req.SKU).Scan(&left); err != nil {
			return strategy.Result{}, wrap("reserve", req.Key, err)
		}
	}
	h, err := d.locks.take(ctx, req.SKU, nil)
	if err != nil {
		return d.lockRefused(ctx, req, err)
	}
	if d.lastUnitWaitSoldOut && h.waited && left <= 1 { // the mistake
		_ = h.release(context.WithoutCancel(ctx))
		if r, found, err := d.lookup(ctx, d.db, req.Key); err != nil || found {
			if err != nil {
				return strategy.Result{}, wrap("reserve", req.Key, err)
			}
			return pgstrategy.KnownKey(req, r), nil
		}
		return soldOut, nil
	}
	released := false
	defer func() { // a panic under the lock must not leave its watchdog renewing it
		if !released {
			_ = h.release(context.WithoutCancel(ctx))
		}
	}()
	var res strategy.Result
	err = pgx.BeginTxFunc(ctx, d.db, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		var err error
		res, err = d.underLock(ctx, tx, req)
		return err
	})
	// The lock's release cannot change the answer: the transaction has
	// ended, and a lock left behind expires with its lease.
	unlockErr := h.release(context.WithoutCancel(ctx))
	released = true
	if err != nil {
		return strategy.Result{}, wrap("reserve", req.Key, err)
	}
	if d.goneIsBusy && ctx.Err() != nil {
		return strategy.Result{Outcome: strategy.OutcomeBusy}, nil // the mistake
	}
	if unlockErr != nil && d.unlockErrorIsBusy {
		return strategy.Result{Outcome: strategy.OutcomeBusy}, nil // the mistake
	}
	if h.lost.Load() && d.busyWhenLost {
		return strategy.Result{Outcome: strategy.OutcomeBusy}, nil // the mistake
	}
	return res, nil
}

// lockRefused answers a request whose lock was not granted: BUSY (nothing
// was written), or the caller's own context error.
func (d *Deployment) lockRefused(ctx context.Context, req strategy.Request, err error) (strategy.Result, error) {
	if ctx.Err() != nil {
		return strategy.Result{}, wrap("reserve", req.Key, err)
	}
	if d.waitIsSoldOut && errors.Is(err, errLockWait) { // the wait ran out: the lock was not granted
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil // the mistake
	}
	return busy, nil
}

// beforeLock answers what needs no lock: a known key, and a SKU whose
// stock is gone. done is false when the request must go on to the lock.
func (d *Deployment) beforeLock(ctx context.Context, q pgstrategy.Querier, req strategy.Request) (res strategy.Result, done bool, err error) {
	if r, found, err := d.lookup(ctx, q, req.Key); err != nil || found {
		if err != nil {
			return strategy.Result{}, true, err
		}
		return pgstrategy.KnownKey(req, r), true, nil
	}
	if d.preCheckUser { // the mistake
		var active bool
		if err := q.QueryRow(ctx, d.tb.q(sqlUserHolds), req.SKU, req.User).Scan(&active); err != nil {
			return strategy.Result{}, true, fmt.Errorf("check user: %w", err)
		}
		if active {
			return strategy.Result{Outcome: strategy.OutcomeUserLimit}, true, nil
		}
	}
	var available int
	if err := q.QueryRow(ctx, d.tb.q(sqlAvailable), req.SKU).Scan(&available); err != nil {
		return strategy.Result{}, true, fmt.Errorf("check available: %w", err)
	}
	if available <= 0 {
		if d.preCheckStockOnly {
			return soldOut, true, nil // the mistake
		}
		// The key again: its owner may have committed between the two
		// reads, taking the last unit for this very request.
		if r, found, err := d.lookup(ctx, q, req.Key); err != nil || found {
			if err != nil {
				return strategy.Result{}, true, err
			}
			return pgstrategy.KnownKey(req, r), true, nil
		}
		return soldOut, true, nil
	}
	return strategy.Result{}, false, nil
}

// underLock is the work done while the SKU's lock is held, inside tx.
func (d *Deployment) underLock(ctx context.Context, tx pgx.Tx, req strategy.Request) (strategy.Result, error) {
	var available int
	if err := tx.QueryRow(ctx, d.tb.q(sqlAvailable), req.SKU).Scan(&available); err != nil {
		return strategy.Result{}, fmt.Errorf("double check: %w", err)
	}
	if available <= 0 {
		// A known key comes first, also one committed while this request
		// waited for the lock: its twin, held open by another attempt, took
		// the last unit for this very request (REPLAY, not SOLD_OUT).
		if d.doubleCheckStockOnly {
			return soldOut, nil
		}
		if r, found, err := d.lookup(ctx, tx, req.Key); err != nil || found {
			if err != nil {
				return strategy.Result{}, err
			}
			return pgstrategy.KnownKey(req, r), nil
		}
		return soldOut, nil
	}
	sp, err := tx.Begin(ctx) // a savepoint: a refused insert or decrement leaves tx usable
	if err != nil {
		return strategy.Result{}, err
	}
	var expires time.Time
	err = sp.QueryRow(ctx, d.tb.q(sqlInsert), req.Key, req.User, req.SKU, req.TTL.Microseconds()).Scan(&expires)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
	case errors.Is(err, pgx.ErrNoRows):
		// The key is known (its owner committed; ON CONFLICT waited for it).
		_ = sp.Rollback(ctx)
		return d.knownKey(ctx, tx, req)
	case errors.As(err, &pgErr) && pgErr.Code == codeUniqueViolation:
		_ = sp.Rollback(ctx)
		if pgErr.ConstraintName != d.tb.prefix+constraintOneActive {
			return d.knownKey(ctx, tx, req)
		}
		// A same-key request can reach the per-user index first: look the
		// key up before answering USER_LIMIT.
		if r, found, err := d.lookup(ctx, tx, req.Key); err != nil || found {
			if err != nil {
				return strategy.Result{}, err
			}
			return pgstrategy.KnownKey(req, r), nil
		}
		return strategy.Result{Outcome: strategy.OutcomeUserLimit}, nil
	default:
		return strategy.Result{}, fmt.Errorf("insert reservation: %w", err)
	}
	take, args := sqlTakeUnit, []any{req.SKU}
	if d.lockOnly {
		take = sqlTakeUnitLockOnly
	}
	if d.setFromCheck {
		take, args = sqlTakeUnitFromCheck, []any{req.SKU, available} // the mistake
	}
	tag, err := sp.Exec(ctx, d.tb.q(take), args...)
	if err != nil {
		return strategy.Result{}, fmt.Errorf("take unit: %w", err)
	}
	if tag.RowsAffected() == 0 {
		// The double check read a unit that a holder had already taken
		// without committing; its commit left available = 0. The database
		// refuses what the lock let through.
		if err := sp.Rollback(ctx); err != nil {
			return strategy.Result{}, err
		}
		return soldOut, nil
	}
	if err := sp.Commit(ctx); err != nil {
		return strategy.Result{}, err
	}
	return strategy.Result{Outcome: strategy.OutcomeHeld, Reservation: strategy.Reservation{
		Key: req.Key, User: req.User, SKU: req.SKU, Status: strategy.StatusHeld, ExpiresAt: expires,
	}}, nil
}

func (d *Deployment) knownKey(ctx context.Context, q pgstrategy.Querier, req strategy.Request) (strategy.Result, error) {
	r, found, err := d.lookup(ctx, q, req.Key)
	if err != nil {
		return strategy.Result{}, err
	}
	if !found {
		return strategy.Result{}, fmt.Errorf("key %q conflicts with a reservation this transaction cannot see", req.Key)
	}
	return pgstrategy.KnownKey(req, r), nil
}

func (d *Deployment) lookup(ctx context.Context, q pgstrategy.Querier, key string) (strategy.Reservation, bool, error) {
	r, found, err := pgstrategy.ScanReservation(q.QueryRow(ctx, d.tb.q(sqlLookup), key), key)
	if err != nil {
		return r, false, fmt.Errorf("look up key: %w", err)
	}
	return r, found, nil
}

// Lookup reads the committed reservation with this key.
func (n *node) Lookup(ctx context.Context, key string) (strategy.Reservation, error) {
	if ok, err := n.CheckKey(key); !ok {
		return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, err
	}
	r, _, err := n.d.lookup(ctx, n.d.db, key)
	return r, wrap("lookup", key, err)
}

func wrap(op, key string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %s %q: %w", Name, op, key, err)
}
