package hotrow

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// ErrSessionEnded is returned by Session.Reserve and Session.Commit after the
// session was committed or rolled back.
var ErrSessionEnded = errors.New("hotrow: session already ended")

// session is one reservation attempt held open: a dedicated pool connection
// with a transaction at the deployment's isolation level. Its methods
// serialise on a mutex; it is meant for one caller at a time.
type session struct {
	conn *pgxpool.Conn
	tx   pgx.Tx
	pid  uint32
	d    *Deployment

	mu    sync.Mutex
	ended bool
}

var (
	_ strategy.Session        = (*session)(nil)
	_ strategy.SessionExpirer = (*session)(nil)
)

// OpenSession takes a connection from the pool for the session's whole life
// and begins its transaction. The connection goes back to the pool at Commit
// or Rollback.
func (n *node) OpenSession(ctx context.Context) (strategy.Session, error) {
	if err := n.check(); err != nil {
		return nil, err
	}
	conn, err := n.d.db.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("hotrow: open session: acquire: %w", err)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: n.d.iso})
	if err != nil {
		conn.Release()
		return nil, fmt.Errorf("hotrow: open session: begin: %w", err)
	}
	return &session{conn: conn, tx: tx, pid: conn.Conn().PgConn().PID(), d: n.d}, nil
}

// Backends is the session's one backend PID.
func (s *session) Backends() []uint32 { return []uint32{s.pid} }

// Reserve runs the same reserveInTx as Node.Reserve inside the session's
// transaction and does not commit. It is never retried: after an error
// (40001 under REPEATABLE READ, for one) the transaction is aborted and the
// caller rolls back.
func (s *session) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if err := s.d.checkRequest(req); err != nil {
		return strategy.BadRequest(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return strategy.Result{}, ErrSessionEnded
	}
	res, err := reserveInTx(ctx, s.tx, req)
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
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return 0, ErrSessionEnded
	}
	var units int
	if err := s.tx.QueryRow(ctx, sqlExpireDue, s.d.skus).Scan(&units); err != nil {
		return 0, fmt.Errorf("hotrow: session expire due: %w", err)
	}
	return units, nil
}

// Commit commits the session's transaction and returns its connection.
func (s *session) Commit(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return ErrSessionEnded
	}
	s.ended = true
	defer s.conn.Release()
	if err := s.tx.Commit(ctx); err != nil {
		return fmt.Errorf("hotrow: session commit: %w", err)
	}
	return nil
}

// Rollback undoes the session's work and returns its connection. After
// Commit or Rollback it does nothing and returns nil.
func (s *session) Rollback(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return nil
	}
	s.ended = true
	defer s.conn.Release()
	if err := s.tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("hotrow: session rollback: %w", err)
	}
	return nil
}
