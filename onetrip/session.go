package onetrip

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// session is one reservation attempt, or one run of the expiry job, held
// open: a pgstrategy.Tx at READ COMMITTED plus the deployment.
type session struct {
	*pgstrategy.Tx
	d *Deployment
}

// OpenSession takes a connection from the pool for the session's whole life
// and begins its transaction.
func (n *node) OpenSession(ctx context.Context) (strategy.Session, error) {
	return pgstrategy.AsSession(n.openSession(ctx))
}

// OpenExpirySession opens the same kind of session, for the expiry job.
func (n *node) OpenExpirySession(ctx context.Context) (strategy.ExpirySession, error) {
	return pgstrategy.AsExpirySession(n.openSession(ctx))
}

func (n *node) openSession(ctx context.Context) (*session, error) {
	level := pgx.ReadCommitted
	if n.d.sessionAtDefaultIsolation {
		level = "" // the mistake: the server's default
	}
	tx, err := n.BeginTx(ctx, n.d.db, Name, level, pgstrategy.TxHooks{})
	if err != nil {
		return nil, err
	}
	return &session{Tx: tx, d: n.d}, nil
}

// A session runs the same statements inside a transaction the caller
// ends. sqlInsertAndTake refuses by failing (errConflict, errNoUnit), which
// would abort the caller's whole transaction, so the attempt is wrapped in
// a savepoint and rolled back to it then. The extra round trips are the
// session's, never Node.Reserve's.
const (
	sqlSavepoint           = `SAVEPOINT onetrip_reserve`
	sqlRollbackToSavepoint = `ROLLBACK TO SAVEPOINT onetrip_reserve`
)

// Reserve runs sqlInsertAndTake (and sqlWhyNot when it did not hold)
// inside the session's transaction and does not commit. It is never
// retried: the caller owns the transaction.
func (s *session) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if err := s.d.owns.Check(req); err != nil {
		return strategy.BadRequest(err)
	}
	res, err := pgstrategy.InTx(s.Tx, func(tx pgx.Tx) (strategy.Result, error) {
		if _, err := tx.Exec(ctx, sqlSavepoint); err != nil {
			return strategy.Result{}, fmt.Errorf("savepoint: %w", err)
		}
		r, err := insertAndTake(ctx, tx, req)
		switch {
		case err == nil:
			return strategy.Result{Outcome: strategy.OutcomeHeld, Reservation: r}, nil
		case !errors.Is(err, errConflict) && !errors.Is(err, errNoUnit):
			return strategy.Result{}, err
		}
		if _, err := tx.Exec(ctx, sqlRollbackToSavepoint); err != nil {
			return strategy.Result{}, fmt.Errorf("rollback to savepoint: %w", err)
		}
		var q pgstrategy.Querier = tx
		if s.d.whyNotOutsideSession {
			q = s.d.db
		}
		read := s.d.readWhyNot
		if s.d.sessionWhyNotTrimsUser {
			read = func(ctx context.Context, q querier, req strategy.Request) (whyNot, error) {
				return readWhyNotWith(ctx, q, sqlWhyNotTrimsUser, req) // the mistake
			}
		}
		w, werr := read(ctx, q, req)
		if werr != nil {
			return strategy.Result{}, werr
		}
		if s.d.sessionReplaysByUser && w.ownerSet && w.owner.User == req.User {
			return strategy.Result{Outcome: strategy.OutcomeReplay, Reservation: w.owner}, nil // the mistake
		}
		refusal := err
		if s.d.sessionForgetsRefusal {
			refusal = nil // the mistake
		}
		res, _, err := w.answer(req, refusal)
		if s.d.sessionInvisibleConflictSoldOut && errors.Is(err, errInvisibleConflict) {
			return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil // the mistake
		}
		return res, err
	})
	if err != nil {
		return strategy.Result{}, fmt.Errorf("onetrip: session reserve %q: %w", req.Key, err)
	}
	return res, nil
}

// ExpireDue runs the expiry (moves) inside the session's transaction: the units
// it reports come back only if the session commits (seed C28-09).
func (s *session) ExpireDue(ctx context.Context) (int, error) {
	units, err := pgstrategy.InTx(s.Tx, func(tx pgx.Tx) (int, error) {
		return moves.ExpireDue(ctx, tx, s.d.skus)
	})
	if err != nil {
		return 0, fmt.Errorf("onetrip: session expire due: %w", err)
	}
	return units, nil
}
