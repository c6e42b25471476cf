package redislock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// session is a reservation attempt, or the expiry job, held open: a
// pgstrategy.Tx, and the SKU locks its Reserve took, held until the
// transaction ends and released after its commit (or its rollback). A
// second Reserve of the same SKU in the session reuses the lock it holds
// (re-entrant, like Redisson's).
type session struct {
	*pgstrategy.Tx
	d       *Deployment
	waiting atomic.Bool

	mu    sync.Mutex
	locks map[string]*held
}

// OpenSession holds an attempt open.
func (n *node) OpenSession(ctx context.Context) (strategy.Session, error) {
	return pgstrategy.AsSession(n.openSession(ctx))
}

// OpenExpirySession holds the expiry job open (it takes no lock).
func (n *node) OpenExpirySession(ctx context.Context) (strategy.ExpirySession, error) {
	return pgstrategy.AsExpirySession(n.openSession(ctx))
}

func (n *node) openSession(ctx context.Context) (*session, error) {
	s := &session{d: n.d, locks: map[string]*held{}}
	tx, err := n.BeginTx(ctx, n.d.db, Name, pgx.ReadCommitted, pgstrategy.TxHooks{
		AroundCommit: func(ctx context.Context, commit func(context.Context) error) error {
			err := commit(ctx)
			s.releaseAll(context.WithoutCancel(ctx)) // after the commit, never before
			return err
		},
		AfterRollback: func() { s.releaseAll(context.Background()) },
	})
	if err != nil {
		return nil, err
	}
	s.Tx = tx
	return s, nil
}

// Reserve runs the seed's flow inside the session's transaction and does
// not commit; the lock stays held until the session ends.
func (s *session) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if err := s.d.owns.Check(req); err != nil {
		return strategy.BadRequest(err)
	}
	var res strategy.Result
	done := false
	_, err := pgstrategy.InTx(s.Tx, func(tx pgx.Tx) (struct{}, error) {
		var err error
		res, done, err = s.d.beforeLock(ctx, tx, req)
		return struct{}{}, err
	})
	if done || err != nil {
		return res, wrap("session reserve", req.Key, err)
	}
	s.mu.Lock()
	h := s.locks[req.SKU]
	s.mu.Unlock()
	if h == nil || s.d.sessionRelocks {
		h, err = s.d.locks.take(ctx, req.SKU, &s.waiting)
		if err != nil {
			return s.d.lockRefused(ctx, req, err)
		}
		s.mu.Lock()
		s.locks[req.SKU] = h
		s.mu.Unlock()
	}
	res, err = pgstrategy.InTx(s.Tx, func(tx pgx.Tx) (strategy.Result, error) { return s.d.underLock(ctx, tx, req) })
	if errors.Is(err, strategy.ErrSessionEnded) {
		return res, err
	}
	return res, wrap("session reserve", req.Key, err)
}

// ExpireDue runs the expiry job inside the session (kill-release).
func (s *session) ExpireDue(ctx context.Context) (int, error) {
	units, err := pgstrategy.InTx(s.Tx, func(tx pgx.Tx) (units int, err error) {
		units, err = s.d.tb.moves.ExpireDue(ctx, tx, s.d.skus)
		return units, err
	})
	if err != nil {
		return 0, fmt.Errorf("%s: session expire due: %w", Name, err)
	}
	return units, nil
}

// LockWaiting reports whether a Reserve of this session waits for a lock.
func (s *session) LockWaiting() bool { return s.waiting.Load() }

// DropLock releases the session's locks now, before its transaction ends.
func (s *session) DropLock(ctx context.Context) error {
	s.mu.Lock()
	locks := s.locks
	s.locks = map[string]*held{}
	s.mu.Unlock()
	var errs []error
	for _, h := range locks {
		errs = append(errs, h.release(ctx))
	}
	return errors.Join(errs...)
}

// StallLock stops renewing the session's locks and leaves each ttl to live.
func (s *session) StallLock(ctx context.Context, ttl time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, h := range s.locks {
		errs = append(errs, h.stall(ctx, ttl))
	}
	return errors.Join(errs...)
}

// releaseAll releases every lock still held: the end of the session.
func (s *session) releaseAll(ctx context.Context) {
	s.mu.Lock()
	locks := s.locks
	s.locks = map[string]*held{}
	s.mu.Unlock()
	for _, h := range locks {
		_ = h.release(ctx) // a lock already gone has nothing to release
	}
}
