package combine

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// session is one reservation attempt, or one run of the expiry job, held
// open: a pgstrategy.Tx at READ COMMITTED plus the deployment. A session's
// requests are not combined: each runs as a batch of one inside the
// session's transaction, which the caller ends.
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
	tx, err := n.BeginTx(ctx, n.d.db, Name, pgx.ReadCommitted, pgstrategy.TxHooks{})
	if err != nil {
		return nil, err
	}
	return &session{Tx: tx, d: n.d}, nil
}

// errInvisibleConflict is a session request's requeue: a unique index
// refused it and the conflicting reservation was gone when looked up. A
// session is never retried (its caller owns the transaction).
var errInvisibleConflict = errors.New("combine: the conflicting reservation was gone when looked up")

// Reserve serves the request as a batch of one inside the session's
// transaction and does not commit. No statement of it fails on a conflict,
// so the caller's transaction survives every answer.
func (s *session) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if err := s.d.owns.Check(req); err != nil {
		return strategy.BadRequest(err)
	}
	res, err := pgstrategy.InTx(s.Tx, func(tx pgx.Tx) (strategy.Result, error) {
		replies, err := serve(ctx, tx, req.SKU, []strategy.Request{req}, s.d.opts.Mistake)
		switch {
		case err != nil:
			return strategy.Result{}, err
		case replies[0].err != nil:
			return strategy.Result{}, replies[0].err
		case replies[0].requeue && s.d.opts.Mistake == SessionRequeueSoldOut:
			return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil // the mistake
		case replies[0].requeue:
			return strategy.Result{}, errInvisibleConflict
		}
		return replies[0].res, nil
	})
	if err != nil {
		return strategy.Result{}, fmt.Errorf("combine: session reserve %q: %w", req.Key, err)
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
		return 0, fmt.Errorf("combine: session expire due: %w", err)
	}
	return units, nil
}
