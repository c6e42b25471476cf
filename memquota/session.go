package memquota

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

var errSessionEnded = errors.New("memquota: session already ended")

// session is an attempt held open on one node: a dedicated connection with
// an open transaction. Its Reserve takes the unit from the node's counter at
// once and inserts the sales-log row inside the transaction; Commit makes
// the row durable and keeps the unit sold, Rollback undoes the row and gives
// the unit back to the counter.
//
// While the attempt is open, the unit is gone from memory but no row says
// who has it. A third request on the same node that needs that unit is told
// SOLD_OUT at once, without waiting: a phantom sold-out if the attempt then
// rolls back (seed C28-14; TestSessionPhantomSoldOut). Only a request with
// the attempt's key, or from its user for the same SKU, waits for the attempt
// to end, because its answer (REPLAY or HELD, USER_LIMIT or HELD) depends on
// that commit; it waits also on a node with no unit left
// (TestRepeatedKeyWaitsForOpenAttempt).
type session struct {
	n    *node
	conn *pgxpool.Conn
	tx   pgx.Tx
	pid  uint32

	mu       sync.Mutex
	taken    []doubt // the units this attempt took from n's counters, with their rows
	returned []owned // units its expiry job moved out of HELD, given back on commit
	ended    bool
}

var (
	_ strategy.Session        = (*session)(nil)
	_ strategy.SessionExpirer = (*session)(nil)
)

// OpenSession starts an attempt held open on a dedicated connection from the
// deployment's pool.
func (n *node) OpenSession(ctx context.Context) (strategy.Session, error) {
	if n.dead.Load() {
		return nil, ErrNodeClosed
	}
	conn, err := n.d.db.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("memquota: open session: %w", err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		conn.Release()
		return nil, fmt.Errorf("memquota: open session: %w", err)
	}
	return &session{n: n, conn: conn, tx: tx, pid: conn.Conn().PgConn().PID()}, nil
}

// Backends is the backend of the session's connection.
func (s *session) Backends() []uint32 { return []uint32{s.pid} }

// Reserve runs the node's reserve path inside the session's transaction.
func (s *session) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if err := s.n.check(req); err != nil {
		return strategy.BadRequest(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return strategy.Result{}, errSessionEnded
	}
	s.n.d.life.RLock()
	defer s.n.d.life.RUnlock()
	if s.n.dead.Load() {
		return strategy.Result{}, ErrNodeClosed
	}
	a := &pass{q: s.tx, held: true, pid: s.pid}
	res, err := s.n.reserve(ctx, a, req)
	if err == nil && res.Outcome == strategy.OutcomeHeld {
		s.taken = append(s.taken, doubt{key: req.Key, sku: req.SKU, pid: s.pid, attempt: a.attempt})
	}
	return res, err
}

// ExpireDue runs the expiry job inside the session's transaction. The units
// it reports go back to their nodes' counters when the session commits, and
// not at all if it rolls back (or its process is killed before the commit:
// the rows then stay HELD, and a rerun expires them once).
func (s *session) ExpireDue(ctx context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return 0, errSessionEnded
	}
	if s.n.dead.Load() {
		return 0, ErrNodeClosed
	}
	moved, err := moveRows(ctx, s.tx, expireSQL, s.n.d.skus)
	if err != nil {
		return 0, fmt.Errorf("memquota: expire: %w", err)
	}
	s.returned = append(s.returned, moved...)
	return len(moved), nil
}

// Commit commits the attempt; its units stay sold, and the units its expiry
// job moved go back to the nodes that sold them. If the node was restarted
// meanwhile, the attempt died with the old process: it is rolled back and
// Commit returns ErrNodeClosed. A commit the server turned into a rollback
// gives the units back; a commit whose fate is unknown keeps them in doubt
// until Settle reads the outcome from the log.
func (s *session) Commit(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return errSessionEnded
	}
	s.ended = true
	defer s.conn.Release()
	s.n.d.life.RLock()
	defer s.n.d.life.RUnlock()
	if s.n.dead.Load() {
		_ = s.tx.Rollback(ctx)
		return ErrNodeClosed
	}
	err := s.tx.Commit(ctx)
	switch {
	case errors.Is(err, pgx.ErrTxCommitRollback):
		s.giveBack()
	case err != nil: // the commit may have happened: Settle will tell
		for _, t := range s.taken {
			s.n.addDoubt(t)
		}
	}
	if err != nil {
		return fmt.Errorf("memquota: commit: %w", err)
	}
	for _, m := range s.returned {
		s.n.d.giveBack(int(m.Node), m.SKU)
	}
	s.returned = nil
	return nil
}

// Rollback undoes the attempt and gives its units back to the node's
// counters. After Commit or Rollback it does nothing and returns nil.
func (s *session) Rollback(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return nil
	}
	s.ended = true
	defer s.conn.Release()
	err := s.tx.Rollback(ctx)
	// Whatever the rollback returned, the transaction did not commit. If the
	// node was restarted meanwhile these counters are the dead process's.
	s.giveBack()
	if err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("memquota: rollback: %w", err)
	}
	return nil
}

func (s *session) giveBack() {
	for _, t := range s.taken {
		s.n.counters[t.sku].put()
	}
	s.taken = nil
}
