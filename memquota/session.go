package memquota

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// session is an attempt, or a run of the expiry job, held open on one node:
// a pgstrategy.Tx (a dedicated connection with an open transaction) whose
// hooks keep the node's counters in step with it. Its Reserve takes the
// unit from the node's counter at once and inserts the sales-log row inside
// the transaction; Commit makes the row durable and keeps the unit sold,
// Rollback undoes the row and gives the unit back to the counter.
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
	*pgstrategy.Tx
	n *node

	// Written inside pgstrategy.InTx and read by the Tx's hooks, all under
	// the Tx's mutex.
	taken    []doubt // the units this attempt took from n's counters, with their rows
	returned []owned // units its expiry job moved out of HELD, given back on commit
	moved    int64   // the attempt number its expiry job writes to the rows it moves
}

// OpenSession starts an attempt held open on a dedicated connection from the
// deployment's pool.
// (OpenSession, OpenExpirySession and openSession have the same shape in
// every strategy package on purpose: the plumbing is pgstrategy's, what
// stays is the package's own session type.)
func (n *node) OpenSession(ctx context.Context) (strategy.Session, error) {
	return pgstrategy.AsSession(n.openSession(ctx))
}

// OpenExpirySession starts the expiry job held open, in the same kind of
// session.
func (n *node) OpenExpirySession(ctx context.Context) (strategy.ExpirySession, error) {
	return pgstrategy.AsExpirySession(n.openSession(ctx))
}

func (n *node) openSession(ctx context.Context) (*session, error) {
	s := &session{n: n}
	tx, err := n.BeginTx(ctx, n.d.db, Name, pgx.ReadCommitted, pgstrategy.TxHooks{
		AroundCommit:  s.aroundCommit,
		AfterRollback: s.giveBack,
	})
	if err != nil {
		return nil, err
	}
	s.Tx = tx
	return s, nil
}

// Reserve runs the node's reserve path inside the session's transaction.
func (s *session) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if err := s.n.d.known.Check(req); err != nil {
		return strategy.BadRequest(err)
	}
	return pgstrategy.InTx(s.Tx, func(tx pgx.Tx) (strategy.Result, error) {
		s.n.d.life.RLock()
		defer s.n.d.life.RUnlock()
		if err := s.n.Check(); err != nil {
			return strategy.Result{}, err
		}
		a := &pass{q: tx, held: true, pid: s.Backends()[0]}
		res, err := s.n.reserve(ctx, a, req)
		if err == nil && (res.Outcome == strategy.OutcomeHeld || res.Outcome == strategy.OutcomeReplay && s.n.d.opts.ReplayInCart || res.Outcome == strategy.OutcomeKeyReused && s.n.d.opts.KeyReusedInCart) { // ReplayInCart, KeyReusedInCart: the mistakes
			line := doubt{key: req.Key, sku: req.SKU, pid: a.pid, attempt: a.attempt}
			if i := slices.IndexFunc(s.taken, func(d doubt) bool { return d.sku == req.SKU }); i >= 0 && s.n.d.opts.CartBySKU {
				s.taken[i] = line // the mistake: one line a SKU
			} else {
				s.taken = append(s.taken, line)
			}
		}
		return res, err
	})
}

// ExpireDue runs the expiry job inside the session's transaction. The units
// it reports go back to their nodes' counters when the session commits, and
// not at all if it rolls back (or its process is killed before the commit:
// the rows then stay HELD, and a rerun expires them once).
func (s *session) ExpireDue(ctx context.Context) (int, error) {
	return pgstrategy.InTx(s.Tx, func(tx pgx.Tx) (int, error) {
		if err := s.n.Check(); err != nil {
			return 0, err
		}
		if s.moved == 0 {
			s.moved = rand.Int64()
		}
		moved, err := moveRows(ctx, tx, expireSQL, s.n.d.skus, s.moved)
		if err != nil {
			return 0, fmt.Errorf("memquota: expire: %w", err)
		}
		if s.n.d.opts.ExpirySessionKeepsLast {
			s.returned = moved // the mistake: the last run's rows only
		} else {
			s.returned = append(s.returned, moved...)
		}
		return len(moved), nil
	})
}

// aroundCommit is the session's Commit (TxHooks.AroundCommit): its units
// stay sold, and the units its expiry job moved go back to the nodes that
// sold them. If the node was restarted meanwhile, the attempt died with the
// old process: it is rolled back and Commit returns strategy.ErrNodeClosed.
// A commit the server turned into a rollback gives the units back; a commit
// whose fate is unknown keeps them in doubt until Settle reads the outcome
// from the log.
func (s *session) aroundCommit(ctx context.Context, commit func(context.Context) error) error {
	s.n.d.life.RLock()
	defer s.n.d.life.RUnlock()
	if err := s.n.Check(); err != nil {
		return err // the Tx rolls back
	}
	err := commit(ctx)
	switch {
	case errors.Is(err, pgx.ErrTxCommitRollback) && !s.n.d.opts.CommitRollbackIsDoubt, err != nil && ctx.Err() != nil && s.n.d.opts.GiveUpIsRollback: // the second, and CommitRollbackIsDoubt: the mistakes
		s.giveBack()
		return err
	case err != nil && s.n.d.opts.CommitErrorKeeps: // the mistake
		s.returned = nil
		return err
	case err != nil: // the commit may have happened: Settle will tell
		for _, t := range s.taken {
			s.n.addDoubt(t)
		}
		if len(s.returned) > 0 {
			s.n.d.addMove(s.moved, s.Backends()[0])
			s.returned = nil
		}
		return err
	}
	for _, m := range s.returned {
		s.n.d.giveBack(int(m.Node), m.SKU)
	}
	s.returned = nil
	return nil
}

// giveBack returns the units the attempt took to the node's counters: the
// attempt did not commit (TxHooks.AfterRollback, or a COMMIT the server
// rolled back). If the node was restarted meanwhile these counters are the
// dead process's.
func (s *session) giveBack() {
	counters := s.n.counters
	if s.n.d.opts.CartGivesToLive {
		counters = s.n.d.nodes[s.n.id].Load().counters
	}
	for _, t := range s.taken {
		if s.n.d.opts.CartGivesToFirstSKU { // the mistake
			t = s.taken[0]
		}
		counters[t.sku].put()
	}
	s.taken = nil
	if s.n.d.opts.RollbackGivesBack {
		for _, m := range s.returned {
			s.n.d.giveBack(int(m.Node), m.SKU)
		}
		s.returned = nil
	}
}
