package hotrow

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// The reservation, step by step (seed 000, Inventory.reserveInTx). Every
// statement runs inside the caller's transaction.
// Each strategy keeps its own SQL over its own tables; where the contract's
// steps are alike, so are the statements.
const (
	sqlSavepoint           = `SAVEPOINT hotrow_reserve`
	sqlRollbackToSavepoint = `ROLLBACK TO SAVEPOINT hotrow_reserve`

	// sqlInsertHeld registers the key. ON CONFLICT names only request_key as
	// the arbiter: a known key is DO NOTHING (no row returned), while a
	// conflict on reservation_one_active still raises 23505 (INSERT docs:
	// only the arbiter index takes the alternative action). Under READ
	// COMMITTED a key inserted by a transaction still in flight makes this
	// wait for it (docs 13.2.1). expires_at uses now(), the transaction's
	// start (docs 9.9.5).
	sqlInsertHeld = `
INSERT INTO reservation (request_key, user_id, sku, status, expires_at)
VALUES ($1, $2, $3, 'HELD', now() + $4::bigint * interval '1 microsecond')
ON CONFLICT (request_key) DO NOTHING
RETURNING request_key, user_id, sku, status, expires_at`

	// sqlTakeUnit is the hot row. Under READ COMMITTED an UPDATE that finds
	// the row locked by a concurrent decrement waits for that transaction and
	// then evaluates available > 0 again on the newest row version (docs
	// 13.2.1), so every decrement sees the one committed before it.
	sqlTakeUnit = `UPDATE sku_stock SET available = available - 1 WHERE sku = $1 AND available > 0`

	sqlLookup = `
SELECT user_id, sku, status, expires_at FROM reservation WHERE request_key = $1`

	// sqlUserHoldsActive tells a real USER_LIMIT from a conflict this
	// transaction cannot see (see reserveInTx).
	sqlUserHoldsActive = `
SELECT EXISTS (SELECT 1 FROM reservation
               WHERE sku = $1 AND user_id = $2 AND status IN ('HELD', 'CONFIRMED'))`
)

// Constraint names from schema.sql, to tell unique violations apart.
const (
	constraintRequestKey = "reservation_request_key"
	constraintOneActive  = "reservation_one_active"
	constraintSKU        = "reservation_sku_fkey"
)

// SQLSTATEs hotrow acts on.
const (
	codeUniqueViolation      = "23505"
	codeForeignKeyViolation  = "23503"
	codeSerializationFailure = "40001"
	codeDeadlockDetected     = "40P01"
)

// errInvisibleConflict: an index said a conflicting row exists, but this
// transaction's snapshot cannot see it (under REPEATABLE READ and
// SERIALIZABLE it committed after the snapshot; under READ COMMITTED it left
// the active states in between). Like 40001, the whole transaction is rerun.
var errInvisibleConflict = errors.New("hotrow: a conflicting reservation is not visible to this transaction")

// reserveInTx is the one reservation routine, shared by Reserve (begin,
// reserveInTx, commit, retried as a whole) and Session.Reserve (inside the
// session's transaction, never retried). req is valid and names one of the
// deployment's SKUs.
//
// On SOLD_OUT, USER_LIMIT, KEY_REUSED, REPLAY and BAD_REQUEST it leaves the
// transaction as it found it: everything after the savepoint is rolled back,
// so committing writes nothing. On HELD the reservation row and the
// decrement are pending in tx. On an error tx may be aborted.
func reserveInTx(ctx context.Context, tx pgx.Tx, req strategy.Request, lostLast bool) (strategy.Result, error) {
	if _, err := tx.Exec(ctx, sqlSavepoint); err != nil {
		return strategy.Result{}, fmt.Errorf("savepoint: %w", err)
	}
	held, err := scanReservation(tx.QueryRow(ctx, sqlInsertHeld, req.Key, req.User, req.SKU, req.TTL.Microseconds()))
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		// A new row; now the unit.
	case errors.Is(err, pgx.ErrNoRows):
		// The key is known. Its owner has committed (we waited for it if it
		// was in flight), so this new statement sees the row.
		return answerKnownKey(ctx, tx, req)
	case errors.As(err, &pgErr) && pgErr.Code == codeUniqueViolation:
		if err := rollbackToSavepoint(ctx, tx); err != nil {
			return strategy.Result{}, err
		}
		if pgErr.ConstraintName != constraintOneActive {
			// request_key itself: the arbiter normally absorbs this.
			return answerKnownKey(ctx, tx, req)
		}
		// The per-user index. A concurrent request with the SAME key can
		// reach this index before request_key: it waited for the other
		// insert to commit and then failed here. Look the key up first,
		// or a replay is answered USER_LIMIT (the seed's intermittent
		// {HELD=1, REPLAY=14, USER_LIMIT=1}).
		if r, found, err := lookupIn(ctx, tx, req.Key); err != nil || found {
			if err != nil {
				return strategy.Result{}, err
			}
			return pgstrategy.KnownKey(req, r), nil
		}
		var holds bool
		if err := tx.QueryRow(ctx, sqlUserHoldsActive, req.SKU, req.User).Scan(&holds); err != nil {
			return strategy.Result{}, fmt.Errorf("look up active reservation of user: %w", err)
		}
		if !holds {
			return strategy.Result{}, errInvisibleConflict
		}
		return strategy.Result{Outcome: strategy.OutcomeUserLimit}, nil
	case errors.As(err, &pgErr) && pgErr.Code == codeForeignKeyViolation && pgErr.ConstraintName == constraintSKU:
		// A backstop: Reserve checks the deployment's SKUs before this.
		if err := rollbackToSavepoint(ctx, tx); err != nil {
			return strategy.Result{}, err
		}
		return strategy.BadRequest(strategy.UnknownSKU(req.SKU))
	default:
		return strategy.Result{}, fmt.Errorf("insert reservation: %w", err)
	}

	if lostLast {
		return takeUnlessLostLast(ctx, tx, req, held)
	}
	tag, err := tx.Exec(ctx, sqlTakeUnit, req.SKU)
	if err != nil {
		return strategy.Result{}, fmt.Errorf("take unit: %w", err)
	}
	if tag.RowsAffected() == 0 {
		// available was 0 on the newest committed version: undo the insert.
		if err := rollbackToSavepoint(ctx, tx); err != nil {
			return strategy.Result{}, err
		}
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil
	}
	return strategy.Result{Outcome: strategy.OutcomeHeld, Reservation: held}, nil
}

// takeUnlessLostLast is the decrement with Options.LostLastUnitSoldOut's
// mistake: SOLD_OUT when the row read before it had one unit and the
// decrement then found it changed.
func takeUnlessLostLast(ctx context.Context, tx pgx.Tx, req strategy.Request, held strategy.Reservation) (strategy.Result, error) {
	var seen int
	if err := tx.QueryRow(ctx, `SELECT available FROM sku_stock WHERE sku = $1`, req.SKU).Scan(&seen); err != nil {
		return strategy.Result{}, fmt.Errorf("read stock: %w", err)
	}
	var left int
	err := tx.QueryRow(ctx, sqlTakeUnit+` RETURNING available`, req.SKU).Scan(&left)
	switch {
	case errors.Is(err, pgx.ErrNoRows), err == nil && seen == 1 && left != 0: // the mistake: a change is not a sale
		if err := rollbackToSavepoint(ctx, tx); err != nil {
			return strategy.Result{}, err
		}
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil
	case err != nil:
		return strategy.Result{}, fmt.Errorf("take unit: %w", err)
	}
	return strategy.Result{Outcome: strategy.OutcomeHeld, Reservation: held}, nil
}

func rollbackToSavepoint(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, sqlRollbackToSavepoint); err != nil {
		return fmt.Errorf("rollback to savepoint: %w", err)
	}
	return nil
}

// answerKnownKey answers a request whose key is already registered.
func answerKnownKey(ctx context.Context, tx pgx.Tx, req strategy.Request) (strategy.Result, error) {
	r, found, err := lookupIn(ctx, tx, req.Key)
	if err != nil {
		return strategy.Result{}, err
	}
	if !found {
		// Rows are never deleted, so only a snapshot older than the
		// owner's commit can miss it (PostgreSQL raises 40001 for that
		// case itself under REPEATABLE READ; this is the safety net).
		return strategy.Result{}, errInvisibleConflict
	}
	return pgstrategy.KnownKey(req, r), nil
}

func lookupIn(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, key string) (strategy.Reservation, bool, error) {
	r, found, err := pgstrategy.ScanReservation(q.QueryRow(ctx, sqlLookup, key), key)
	if err != nil {
		return strategy.Reservation{}, false, fmt.Errorf("look up key: %w", err)
	}
	return r, found, nil
}

// scanReservation reads the RETURNING row of sqlInsertHeld.
func scanReservation(row pgx.Row) (strategy.Reservation, error) {
	var r strategy.Reservation
	var status string
	err := row.Scan(&r.Key, &r.User, &r.SKU, &status, &r.ExpiresAt)
	r.Status = strategy.Status(status)
	return r, err
}

// Reserve runs reserveInTx in its own transaction at the deployment's
// isolation level and commits it, rerunning the whole transaction after
// 40001 or 40P01 (Options.MaxRetries). When every attempt was rolled back
// the answer is BUSY: nothing was written and the request may be sent again.
func (n *node) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if res, err := n.Admit(n.d.owns, req); err != nil {
		return res, err
	}
	if n.d.remember {
		if r, ok := n.d.answered.Load(req.Key); ok {
			return pgstrategy.KnownKey(req, r.(strategy.Reservation)), nil
		}
	}
	var res strategy.Result
	err := n.d.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		res, err = reserveInTx(ctx, tx, req, n.d.lostLast)
		return err
	})
	switch {
	case errors.Is(err, strategy.ErrBadRequest):
		return strategy.BadRequest(err)
	case errors.Is(err, errRetriesSpent) && n.d.spentSold:
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil
	case errors.Is(err, errRetriesSpent):
		return strategy.Result{Outcome: strategy.OutcomeBusy}, nil
	case err != nil:
		return strategy.Result{}, fmt.Errorf("hotrow: reserve %q: %w", req.Key, err)
	}
	if n.d.remember && (res.Outcome == strategy.OutcomeHeld || res.Outcome == strategy.OutcomeReplay) {
		n.d.answered.Store(req.Key, res.Reservation)
	}
	return res, nil
}

// Lookup reads the committed reservation with this key, whatever its SKU:
// request keys are unique across the whole table.
func (n *node) Lookup(ctx context.Context, key string) (strategy.Reservation, error) {
	if ok, err := n.CheckKey(key); !ok {
		return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, err
	}
	r, _, err := lookupIn(ctx, n.d.db, key)
	if err != nil {
		return strategy.Reservation{}, fmt.Errorf("hotrow: lookup %q: %w", key, err)
	}
	return r, nil
}
