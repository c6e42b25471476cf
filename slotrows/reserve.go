package slotrows

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/jackc/pgx/v5"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// The SQL of Reserve, in the order it runs.
// Each strategy keeps its own SQL over its own tables; where the contract's
// steps are alike, so are the statements.
const (
	// sqlSavepoint marks where a session's attempt starts, so that SOLD_OUT
	// can undo its insert without ending the caller's transaction.
	sqlSavepoint           = `SAVEPOINT slotrows_reserve`
	sqlRollbackToSavepoint = `ROLLBACK TO SAVEPOINT slotrows_reserve`

	// sqlInsertReservation inserts the reservation, HELD, or nothing. ON
	// CONFLICT DO NOTHING without a conflict target makes every unique index
	// an arbiter: the key (requirement 2) and the active (sku, user) index
	// (requirement 3). A conflict with a row still being inserted by another
	// transaction waits for it; if it commits, this inserts nothing, and if
	// it rolls back, this inserts. So the statement never fails with 23505,
	// and no row back means "key known, or user at the limit", which
	// lookupKey tells apart.
	sqlInsertReservation = `
INSERT INTO slotrows_reservation (request_key, user_id, sku, status, expires_at)
VALUES ($1, $2, $3, 'HELD', now() + $4::bigint * interval '1 microsecond')
ON CONFLICT DO NOTHING
RETURNING id, expires_at`

	// sqlClaimSlot makes reservation $3 the holder of one free slot of sku
	// $1, trying slots from $2 upwards, then below $2. Each uncorrelated
	// subquery is an InitPlan, evaluated when first needed: coalesce runs the
	// second only when the first found nothing, so a claim locks at most one
	// free slot. FOR UPDATE SKIP LOCKED skips slots other claims have locked
	// (never waits for them) and, in READ COMMITTED, re-checks holder IS NULL
	// on the newest version of a slot that changed since the snapshot. No row
	// back: no free slot that is not locked by a claim in flight.
	sqlClaimSlot = `
UPDATE slotrows_slot SET holder = $3
WHERE sku = $1 AND holder IS NULL AND slot_no = coalesce(
    (SELECT slot_no FROM slotrows_slot
     WHERE sku = $1 AND holder IS NULL AND slot_no >= $2
     ORDER BY slot_no LIMIT 1 FOR UPDATE SKIP LOCKED),
    (SELECT slot_no FROM slotrows_slot
     WHERE sku = $1 AND holder IS NULL AND slot_no < $2
     ORDER BY slot_no LIMIT 1 FOR UPDATE SKIP LOCKED))
RETURNING slot_no`

	// sqlLookup reads the reservation that owns a key.
	sqlLookup = `SELECT user_id, sku, status, expires_at FROM slotrows_reservation WHERE request_key = $1`
)

// Reserve runs one attempt in its own transaction and commits it only when it
// answered HELD; every other answer wrote nothing, and rolling back undoes
// the reservation row that SOLD_OUT inserted.
func (n *node) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if res, err := n.Admit(n.d.totals, req); err != nil {
		return res, err
	}
	tx, err := n.d.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: readCommitted})
	if err != nil {
		return strategy.Result{}, fmt.Errorf("slotrows: reserve %q: begin: %w", req.Key, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	res, err := n.d.reserveIn(ctx, tx, req, false)
	if err != nil {
		return strategy.Result{}, err
	}
	if res.Outcome == strategy.OutcomeHeld {
		if err := tx.Commit(ctx); err != nil {
			return strategy.Result{}, fmt.Errorf("slotrows: reserve %q: commit (outcome unknown): %w", req.Key, err)
		}
	}
	return res, nil
}

// reserveIn is the one reservation logic, for Reserve and Session.Reserve:
//
//  1. Insert the reservation (sqlInsertReservation). Nothing inserted: the
//     key is known (REPLAY, or KEY_REUSED for another user or SKU) or the
//     user holds an active reservation for the SKU (USER_LIMIT). The key is
//     looked up first, so a request that lost a race against its own twin is
//     answered REPLAY, never USER_LIMIT (the seed's intermittent
//     {HELD=1, REPLAY=14, USER_LIMIT=1}).
//  2. Claim a free slot for it (sqlClaimSlot). None: SOLD_OUT, and the
//     inserted row must go. The insert comes first so that a repeated key
//     never locks a slot it will not take (a locked slot is a phantom
//     sold-out for everyone else), and so that REPLAY is answered even when
//     the stock is gone.
//
// The caller owns tx. With nested false the caller rolls tx back on any
// answer but HELD, which undoes the insert of step 1. With nested true (a
// session, whose transaction must survive its answers) reserveIn marks a
// savepoint first and rolls back to it on SOLD_OUT.
func (d *Deployment) reserveIn(ctx context.Context, tx pgx.Tx, req strategy.Request, nested bool) (strategy.Result, error) {
	if nested {
		if _, err := tx.Exec(ctx, sqlSavepoint); err != nil {
			return strategy.Result{}, fmt.Errorf("slotrows: reserve %q: savepoint: %w", req.Key, err)
		}
	}
	held := strategy.Reservation{Key: req.Key, User: req.User, SKU: req.SKU, Status: strategy.StatusHeld}
	var id int64
	ttl := req.TTL.Microseconds()
	if d.opts.TTLInMillis {
		ttl = req.TTL.Milliseconds() * 1000 // the mistake: whole milliseconds
	}
	err := tx.QueryRow(ctx, sqlInsertReservation, req.Key, req.User, req.SKU, ttl).Scan(&id, &held.ExpiresAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return answerKnown(ctx, tx, req)
	case err != nil:
		return strategy.Result{}, fmt.Errorf("slotrows: reserve %q: insert reservation: %w", req.Key, err)
	}

	var slot int
	err = tx.QueryRow(ctx, sqlClaimSlot, req.SKU, d.firstSlot(req), id).Scan(&slot)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if nested {
			if _, err := tx.Exec(ctx, sqlRollbackToSavepoint); err != nil {
				return strategy.Result{}, fmt.Errorf("slotrows: reserve %q: undo after sold out: %w", req.Key, err)
			}
		}
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil
	case err != nil:
		return strategy.Result{}, fmt.Errorf("slotrows: reserve %q: claim a slot of %q: %w", req.Key, req.SKU, err)
	}
	return strategy.Result{Outcome: strategy.OutcomeHeld, Reservation: held}, nil
}

// answerKnown answers a request whose insert found a conflict: REPLAY or
// KEY_REUSED when its key is known, USER_LIMIT otherwise. The insert waited
// for any conflicting transaction to finish, and READ COMMITTED gives this
// statement a new snapshot, so the row that conflicted is visible here.
func answerKnown(ctx context.Context, tx pgx.Tx, req strategy.Request) (strategy.Result, error) {
	r, found, err := lookupKey(ctx, tx, req.Key)
	if err != nil {
		return strategy.Result{}, fmt.Errorf("slotrows: reserve %q: %w", req.Key, err)
	}
	if !found {
		return strategy.Result{Outcome: strategy.OutcomeUserLimit}, nil
	}
	return pgstrategy.KnownKey(req, r), nil
}

// lookupKey reads the reservation that owns key; q is the pool or a
// transaction.
func lookupKey(ctx context.Context, q pgstrategy.Querier, key string) (strategy.Reservation, bool, error) {
	r, found, err := pgstrategy.ScanReservation(q.QueryRow(ctx, sqlLookup, key), key)
	if err != nil {
		return strategy.Reservation{}, false, fmt.Errorf("look up key: %w", err)
	}
	return r, found, nil
}

// firstSlot is the slot number a claim for req starts at (see SlotChoice).
func (d *Deployment) firstSlot(req strategy.Request) int {
	total := d.totals[req.SKU]
	if d.opts.SlotChoice != KeyHashFirst || total <= 1 {
		return 1
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(req.Key))
	return 1 + int(h.Sum64()%uint64(total))
}

// session is one attempt, or one run of the expiry job, held open: a
// pgstrategy.Tx (a connection of its own from the pool, with a READ
// COMMITTED transaction begun on it) plus the deployment.
type session struct {
	*pgstrategy.Tx
	d      *Deployment
	marked bool // Options.OneSavepoint: the attempt's savepoint is set
}

// OpenSession holds an attempt open.
// (OpenSession, OpenExpirySession and openSession have the same shape in
// every strategy package on purpose: the plumbing is pgstrategy's, what
// stays is the package's own session type.)
func (n *node) OpenSession(ctx context.Context) (strategy.Session, error) {
	return pgstrategy.AsSession(n.openSession(ctx))
}

// OpenExpirySession holds the expiry job open, in the same kind of session.
func (n *node) OpenExpirySession(ctx context.Context) (strategy.ExpirySession, error) {
	return pgstrategy.AsExpirySession(n.openSession(ctx))
}

func (n *node) openSession(ctx context.Context) (*session, error) {
	tx, err := n.BeginTx(ctx, n.d.db, Name, readCommitted, pgstrategy.TxHooks{})
	if err != nil {
		return nil, err
	}
	return &session{Tx: tx, d: n.d}, nil
}

// Reserve runs reserveIn in the session's transaction and commits nothing.
func (s *session) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if err := s.d.totals.Check(req); err != nil {
		return strategy.BadRequest(err)
	}
	return pgstrategy.InTx(s.Tx, func(tx pgx.Tx) (strategy.Result, error) {
		if s.d.opts.OneSavepoint && s.marked {
			// The mistake: no savepoint of its own; SOLD_OUT goes back to
			// the attempt's first.
			res, err := s.d.reserveIn(ctx, tx, req, false)
			if err == nil && res.Outcome == strategy.OutcomeSoldOut {
				if _, err := tx.Exec(ctx, sqlRollbackToSavepoint); err != nil {
					return strategy.Result{}, fmt.Errorf("slotrows: reserve %q: undo after sold out: %w", req.Key, err)
				}
			}
			return res, err
		}
		res, err := s.d.reserveIn(ctx, tx, req, true)
		if err == nil {
			s.marked = true
		}
		return res, err
	})
}

// ExpireDue runs the expiry job inside the session's transaction: its slots
// come free only if the session commits (the kill-release scenario kills the
// process first).
func (s *session) ExpireDue(ctx context.Context) (int, error) {
	return pgstrategy.InTx(s.Tx, func(tx pgx.Tx) (int, error) {
		return s.d.expireIn(ctx, tx)
	})
}
