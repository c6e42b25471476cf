package onetrip

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// The reservation. Node.Reserve sends sqlInsertAndTake alone, in
// autocommit: one round trip, and the row lock it takes is held only from
// its UPDATE to the implicit COMMIT at the end of that same statement, never
// across a trip to the client. Only when it did not answer HELD does a
// second statement (sqlWhyNot) find the answer.
const (
	// sqlInsertAndTake inserts the reservation, then decrements the hot
	// row for it, in one statement, and nothing else: the least a
	// one-statement reservation that writes its row can do (the
	// insert-update control of pgbench.go is the same statement, with
	// available > 0 in its WHERE instead of the CHECK refusing, and without
	// RETURNING). The insert comes first so that the row and its two
	// index entries are written before the row lock is taken: the lock
	// covers only the decrement and the commit, as in the bare UPDATE.
	//
	// Every answer but HELD is the statement failing, which undoes it
	// whole, insert included: the checks cost nothing on the HELD path (a
	// statement that read the stock row first and inserted with an ON
	// CONFLICT arbiter cost the server more than writing the row: the
	// package doc).
	//
	//   - A known key, or a user who already holds an active reservation
	//     of the SKU: the insert fails on one of the two unique indexes
	//     (23505). A key or (sku, user) inserted by a transaction in flight
	//     is waited for first, and fails only if that one commits.
	//   - No unit: the decrement would take available below 0 and fails the
	//     stock row's CHECK (23514, onetrip_stock_available_range). Under
	//     READ COMMITTED an UPDATE that finds the row locked by a decrement
	//     in flight waits for it and evaluates the new version (docs
	//     13.2.1), so the CHECK sees the newest committed count.
	//
	// The UPDATE always finds the row: Reserve checks the SKU against the
	// deployment's config first, Open inserted a row for each of its SKUs,
	// and a trigger refuses to delete one (schema.sql). expires_at uses
	// now(), the statement's transaction start.
	sqlInsertAndTake = `
WITH ins AS (
    INSERT INTO onetrip_reservation (request_key, user_id, sku, status, expires_at)
    VALUES ($1, $2, $3, 'HELD', now() + $4::bigint * interval '1 microsecond')
    RETURNING sku, expires_at
)
UPDATE onetrip_stock SET available = available - 1
WHERE sku = (SELECT sku FROM ins)
RETURNING (SELECT expires_at FROM ins)`

	// sqlWhyNot answers a request that sqlInsertAndTake did not hold, or
	// one for a SKU the node last found without a unit, in one snapshot:
	// the reservation that owns the key (all NULL when none), whether the
	// user holds an active reservation of the SKU, and whether the SKU has
	// a unit. The order of the answers is hotrow's: a known key first
	// (REPLAY or KEY_REUSED), then the user's limit, then the stock.
	sqlWhyNot = `
SELECT k.user_id, k.sku, k.status, k.expires_at,
       EXISTS (SELECT 1 FROM onetrip_reservation a
               WHERE a.sku = $2 AND a.user_id = $3 AND a.status IN ('HELD', 'CONFIRMED')),
       EXISTS (SELECT 1 FROM onetrip_stock s WHERE s.sku = $2 AND s.available > 0)
FROM (SELECT 1) AS one
LEFT JOIN onetrip_reservation k ON k.request_key = $1`

	// sqlWhyNotCountsEnded is sqlWhyNot with Options.WhyNotCountsEnded's
	// mistake: the user's reservations of the SKU count whatever their
	// status.
	sqlWhyNotCountsEnded = `
SELECT k.user_id, k.sku, k.status, k.expires_at,
       EXISTS (SELECT 1 FROM onetrip_reservation a
               WHERE a.sku = $2 AND a.user_id = $3),
       EXISTS (SELECT 1 FROM onetrip_stock s WHERE s.sku = $2 AND s.available > 0)
FROM (SELECT 1) AS one
LEFT JOIN onetrip_reservation k ON k.request_key = $1`

	sqlLookup = `SELECT user_id, sku, status, expires_at FROM onetrip_reservation WHERE request_key = $1`
)

var (
	// sqlWhyNotFoldsUser is sqlWhyNot with Options.WhyNotFoldsUser's
	// mistake: the user's reservations are found ignoring case.
	sqlWhyNotFoldsUser = mustReplace(sqlWhyNot, "a.user_id = $3", "lower(a.user_id) = lower($3)")
	// sqlWhyNotFoldsKey is sqlWhyNot with Options.WhyNotFoldsKey's
	// mistake: the key's owner is found ignoring case.
	sqlWhyNotFoldsKey = mustReplace(sqlWhyNot, "k.request_key = $1", "lower(k.request_key) = lower($1)")
	// sqlWhyNotKeyLike is sqlWhyNot with Options.WhyNotKeyLike's mistake:
	// the key's owner is found with LIKE, the key a pattern.
	sqlWhyNotKeyLike = mustReplace(sqlWhyNot, "k.request_key = $1", "k.request_key LIKE $1")
	// sqlWhyNotTrimsUser is sqlWhyNot with Options.SessionWhyNotTrimsUser's
	// mistake: the user's reservations are found with the user trimmed.
	sqlWhyNotTrimsUser = mustReplace(sqlWhyNot, "a.user_id = $3", "a.user_id = btrim($3)")
)

// mustReplace is s with old replaced by new, which must be in it once.
func mustReplace(s, old, new string) string {
	if strings.Count(s, old) != 1 {
		panic(fmt.Sprintf("onetrip: %q is not in the statement once", old))
	}
	return strings.Replace(s, old, new, 1)
}

// constraintAvailable is the stock row's CHECK that refuses a decrement
// past zero (schema.sql): sqlInsertAndTake's "no unit".
const constraintAvailable = "onetrip_stock_available_range"

var (
	// errConflict: sqlInsertAndTake met a known key or an active
	// reservation of the user (a unique index) and wrote nothing.
	errConflict = errors.New("onetrip: the key or the user's active reservation is taken")
	// errNoUnit: sqlInsertAndTake found no unit once it had the row (its
	// CHECK), and wrote nothing.
	errNoUnit = errors.New("onetrip: no unit left")
	// errInvisibleConflict: a unique index refused the insert, but the row
	// it conflicted with is no longer there when sqlWhyNot looks (a user's
	// reservation released or expired in between). Nothing was written;
	// the request runs again.
	errInvisibleConflict = errors.New("onetrip: the conflicting reservation was gone when looked up")
)

// querier is a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// insertAndTake runs sqlInsertAndTake on q: the reservation when it held,
// errConflict or errNoUnit when it was refused (nothing written).
// pgx drops a statement from its cache after any error, so the next use of
// sqlInsertAndTake on that connection prepares it again; a node sends
// sqlWhyNot first while its SKU has no unit (node.soldOut), so a sold-out
// SKU does not pay that on every request.
func insertAndTake(ctx context.Context, q querier, req strategy.Request) (strategy.Reservation, error) {
	r := strategy.Reservation{Key: req.Key, User: req.User, SKU: req.SKU, Status: strategy.StatusHeld}
	err := q.QueryRow(ctx, sqlInsertAndTake, req.Key, req.User, req.SKU, req.TTL.Microseconds()).Scan(&r.ExpiresAt)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return r, nil
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UniqueViolation:
		return r, errConflict
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.CheckViolation && pgErr.ConstraintName == constraintAvailable:
		return r, errNoUnit
	case errors.Is(err, pgx.ErrNoRows):
		// The insert committed without its unit: impossible while the SKU's
		// row exists, which the trigger of schema.sql guarantees.
		return r, fmt.Errorf("insert and take: the stock row of %q is missing", req.SKU)
	}
	return r, fmt.Errorf("insert and take: %w", err)
}

// whyNot is one reading of sqlWhyNot: the reservation that owns the key
// (its User empty when none), whether the user holds an active
// reservation of the SKU, and whether the SKU has a unit.
type whyNot struct {
	owner    strategy.Reservation
	holds    bool
	hasUnit  bool
	ownerSet bool
}

func (d *Deployment) readWhyNot(ctx context.Context, q querier, req strategy.Request) (whyNot, error) {
	sql := sqlWhyNot
	switch {
	case d.whyNotCountsEnded:
		sql = sqlWhyNotCountsEnded
	case d.whyNotFoldsUser:
		sql = sqlWhyNotFoldsUser
	case d.whyNotFoldsKey:
		sql = sqlWhyNotFoldsKey
	case d.whyNotKeyLike:
		sql = sqlWhyNotKeyLike
	}
	return readWhyNotWith(ctx, q, sql, req)
}

// readWhyNotWith reads sql, sqlWhyNot or one of its mistaken forms.
func readWhyNotWith(ctx context.Context, q querier, sql string, req strategy.Request) (whyNot, error) {
	var (
		w                 whyNot
		user, sku, status *string
		expires           *time.Time
	)
	if err := q.QueryRow(ctx, sql, req.Key, req.SKU, req.User).Scan(&user, &sku, &status, &expires, &w.holds, &w.hasUnit); err != nil {
		return w, fmt.Errorf("look up why not held: %w", err)
	}
	if user != nil {
		w.ownerSet = true
		w.owner = strategy.Reservation{Key: req.Key, User: *user, SKU: *sku, Status: strategy.Status(*status), ExpiresAt: *expires}
	}
	return w, nil
}

// answer is the answer sqlWhyNot gives, in hotrow's order, when the request
// was refused for refusal (errConflict or errNoUnit), or before any
// attempt (nil): ok false then means the SKU has a unit, and the request
// should try to take it.
func (w whyNot) answer(req strategy.Request, refusal error) (res strategy.Result, ok bool, err error) {
	switch {
	case w.ownerSet:
		return pgstrategy.KnownKey(req, w.owner), true, nil
	case w.holds:
		return strategy.Result{Outcome: strategy.OutcomeUserLimit}, true, nil
	case errors.Is(refusal, errNoUnit), !w.hasUnit && refusal == nil:
		// After errNoUnit the newest committed version had no unit when
		// the statement had the row, whatever this later snapshot says.
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, true, nil
	case errors.Is(refusal, errConflict):
		return strategy.Result{}, true, errInvisibleConflict
	}
	return strategy.Result{}, false, nil
}

// Reserve sends sqlInsertAndTake in autocommit: HELD in one round trip.
// Otherwise sqlWhyNot, a second round trip, finds the answer. While the
// node last found the SKU without a unit it sends sqlWhyNot first: SOLD_OUT
// in one round trip, and nothing written.
func (n *node) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if res, err := n.Admit(n.d.owns, req); err != nil {
		return res, err
	}
	for attempt := 0; ; attempt++ {
		res, err := n.reserveOnce(ctx, req)
		if err == nil {
			return res, nil
		}
		if !errors.Is(err, errInvisibleConflict) || attempt >= n.d.maxRetries {
			return strategy.Result{}, fmt.Errorf("onetrip: reserve %q: %w", req.Key, err)
		}
		n.d.retries.Add(1)
		if err := pause(ctx, attempt); err != nil {
			return strategy.Result{}, fmt.Errorf("onetrip: reserve %q: waiting to retry: %w", req.Key, err)
		}
	}
}

func (n *node) reserveOnce(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	soldOut := n.soldOut[req.SKU]
	if soldOut.Load() {
		w, err := n.d.readWhyNot(ctx, n.d.db, req)
		if err != nil {
			return strategy.Result{}, err
		}
		if n.d.soldOutFromMemory {
			w.hasUnit = false // the mistake: the hint, not the stock, answers
		}
		if n.d.hintReplaysByUser && w.ownerSet && w.owner.User == req.User {
			return strategy.Result{Outcome: strategy.OutcomeReplay, Reservation: w.owner}, nil // the mistake
		}
		if res, ok, err := w.answer(req, nil); ok {
			return res, err
		}
		soldOut.Store(false) // a unit came back
	}
	r, err := insertAndTake(ctx, n.d.db, req)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return strategy.Result{Outcome: strategy.OutcomeHeld, Reservation: r}, nil
	case n.d.cancelIsSoldOut && errors.As(err, &pgErr) && (pgErr.Code == pgerrcode.QueryCanceled || pgErr.Code == pgerrcode.LockNotAvailable):
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil // the mistake
	case errors.Is(err, errNoUnit):
		soldOut.Store(true)
	case !errors.Is(err, errConflict):
		return strategy.Result{}, err
	}
	w, werr := n.d.readWhyNot(ctx, n.d.db, req)
	if werr != nil {
		return strategy.Result{}, werr
	}
	if n.d.soldOutOnlyIfStillNone && errors.Is(err, errNoUnit) && w.hasUnit {
		return strategy.Result{}, nil // the mistake
	}
	res, _, err := w.answer(req, err)
	if n.d.invisibleConflictSoldOut && errors.Is(err, errInvisibleConflict) {
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil // the mistake
	}
	return res, err
}

// soldOutHints is a node's memory of which SKUs it last found without a
// unit (sqlInsertAndTake refused for errNoUnit, or sqlWhyNot read none),
// one flag per SKU of the deployment. It only chooses which statement goes
// first; every answer still comes from the database.
type soldOutHints map[string]*atomic.Bool

func newSoldOutHints(skus []string) soldOutHints {
	h := make(soldOutHints, len(skus))
	for _, s := range skus {
		h[s] = new(atomic.Bool)
	}
	return h
}

// pause waits a random time in [0, min(20ms, 200µs<<attempt)) before a
// rerun, so requests that met the same conflict do not meet again in
// lockstep.
func pause(ctx context.Context, attempt int) error {
	limit := 20 * time.Millisecond
	if step := 200 * time.Microsecond << min(attempt, 16); step < limit {
		limit = step
	}
	t := time.NewTimer(rand.N(limit) + time.Microsecond)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Lookup reads the committed reservation with this key, whatever its SKU.
func (n *node) Lookup(ctx context.Context, key string) (strategy.Reservation, error) {
	if ok, err := n.CheckKey(key); !ok {
		return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, err
	}
	r, _, err := pgstrategy.ScanReservation(n.d.db.QueryRow(ctx, sqlLookup, key), key)
	if err != nil {
		return strategy.Reservation{}, fmt.Errorf("onetrip: lookup %q: %w", key, err)
	}
	return r, nil
}
