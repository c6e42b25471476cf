package controls

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// session is an attempt (or the expiry job) held open on one connection.
// It is written out here rather than taken from a strategy package: a
// control must not change when a real strategy does.
type session struct {
	c    *control
	conn *pgxpool.Conn
	tx   pgx.Tx

	mu   sync.Mutex
	done bool
}

func (n *node) OpenExpirySession(ctx context.Context) (strategy.ExpirySession, error) {
	return n.openSession(ctx)
}

func (n *node) OpenSession(ctx context.Context) (strategy.Session, error) {
	return n.openSession(ctx)
}

func (n *node) openSession(ctx context.Context) (*session, error) {
	if err := n.check(); err != nil {
		return nil, err
	}
	conn, err := n.c.db.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		conn.Release()
		return nil, err
	}
	return &session{c: n.c, conn: conn, tx: tx}, nil
}

func (s *session) Backends() []uint32 { return []uint32{s.conn.Conn().PgConn().PID()} }

// inSession marks the context of a call made in an attempt or an expiry
// job held open, for the mistakes that are made there alone.
type inSession struct{}

func (s *session) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if err := s.c.validate(req); err != nil {
		return strategy.BadRequest(err)
	}
	ctx = context.WithValue(ctx, inSession{}, true)
	if !s.c.owns(req.SKU) && s.c.breaks != sessionAnySKU {
		return strategy.BadRequest(strategy.UnknownSKU(req.SKU))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return strategy.Result{}, strategy.ErrSessionEnded
	}
	return s.c.reserveIn(ctx, s.tx, req)
}

// ExpireDue runs the job inside the session: the helper process of the
// kill-release scenario dies before Commit.
func (s *session) ExpireDue(ctx context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return 0, strategy.ErrSessionEnded
	}
	return s.c.expireIn(context.WithValue(ctx, inSession{}, true), s.tx, false)
}

func (s *session) Commit(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return strategy.ErrSessionEnded
	}
	s.done = true
	defer s.conn.Release()
	return s.tx.Commit(ctx)
}

func (s *session) Rollback(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return nil
	}
	s.done = true
	defer s.conn.Release()
	return s.tx.Rollback(ctx)
}
