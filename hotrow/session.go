package hotrow

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// session is one reservation attempt, or one run of the expiry job, held
// open: a pgstrategy.Tx (a dedicated pool connection with a transaction at
// the deployment's isolation level) plus the deployment. Its methods
// serialise on the Tx's mutex; it is meant for one caller at a time.
type session struct {
	*pgstrategy.Tx
	d *Deployment
}

// OpenSession takes a connection from the pool for the session's whole life
// and begins its transaction. The connection goes back to the pool at Commit
// or Rollback.
// (OpenSession, OpenExpirySession and openSession have the same shape in
// every strategy package on purpose: the plumbing is pgstrategy's, what
// stays is the package's own session type.)
func (n *node) OpenSession(ctx context.Context) (strategy.Session, error) {
	return pgstrategy.AsSession(n.openSession(ctx))
}

// OpenExpirySession opens the same kind of session, for the expiry job.
func (n *node) OpenExpirySession(ctx context.Context) (strategy.ExpirySession, error) {
	return pgstrategy.AsExpirySession(n.openSession(ctx))
}

func (n *node) openSession(ctx context.Context) (*session, error) {
	tx, err := n.BeginTx(ctx, n.d.db, Name, n.d.iso, pgstrategy.TxHooks{})
	if err != nil {
		return nil, err
	}
	return &session{Tx: tx, d: n.d}, nil
}

// Reserve runs the same reserveInTx as Node.Reserve inside the session's
// transaction and does not commit. It is never retried: after an error
// (40001 under REPEATABLE READ, for one) the transaction is aborted and the
// caller rolls back.
func (s *session) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if err := s.d.owns.Check(req); err != nil {
		return strategy.BadRequest(err)
	}
	res, err := pgstrategy.InTx(s.Tx, func(tx pgx.Tx) (strategy.Result, error) {
		return reserveInTx(ctx, tx, req, s.d.lostLast)
	})
	switch {
	case errors.Is(err, strategy.ErrBadRequest):
		return res, err
	case err != nil:
		return strategy.Result{}, fmt.Errorf("hotrow: session reserve %q: %w", req.Key, err)
	}
	return res, nil
}

// ExpireDue runs the expiry job (sqlExpireDue, the same statement as
// Node.ExpireDue) inside the session's transaction: the units it reports
// come back only if the session commits. A process killed before that
// commit returns nothing, and a rerun returns every unit once (seed C28-09;
// TestSessionExpireKilled). Like Reserve, it is never retried.
func (s *session) ExpireDue(ctx context.Context) (int, error) {
	units, err := pgstrategy.InTx(s.Tx, func(tx pgx.Tx) (units int, err error) {
		err = tx.QueryRow(ctx, sqlExpireDue, s.d.skus).Scan(&units)
		return units, err
	})
	if err != nil {
		return 0, fmt.Errorf("hotrow: session expire due: %w", err)
	}
	return units, nil
}
