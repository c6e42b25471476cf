package onetrip

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// The reservation. Node.Reserve sends sqlTakeAndInsert alone, in
// autocommit: one round trip, and the row lock it takes is held only from
// its UPDATE to the implicit COMMIT at the end of that same statement, never
// across a trip to the client. Only when it did not answer HELD does a
// second statement (sqlWhyNot) find the answer.
const (
	// sqlTakeAndInsert inserts the reservation, then decrements the hot
	// row for it, in one statement. The insert comes first so that the
	// work of writing the row and its three index entries is done before
	// the row lock is taken: the lock covers only the decrement and the
	// commit, as in the bare UPDATE. The stock row is read twice, no more:
	// every other reader and writer of the SKU queues on that one page.
	//
	//   - seen reads the SKU's row in the statement's snapshot, without a
	//     lock: does it have a unit? (A SKU already sold out writes and
	//     locks nothing.) It is read once and used twice.
	//   - ins inserts the reservation when seen found a unit. ON CONFLICT
	//     DO NOTHING without a target makes both unique indexes arbiters: a
	//     known key, or a user who already holds an active reservation of
	//     the SKU, inserts nothing (and locks nothing), and a key or (sku,
	//     user) inserted by a transaction in flight is waited for first.
	//   - take decrements the row when ins inserted (an uncorrelated
	//     EXISTS: the planner's one-time filter, evaluated before the scan,
	//     which runs the insert first). Under READ COMMITTED an UPDATE that
	//     finds the row locked by a decrement in flight waits for it and
	//     evaluates available > 0 again on the newest version (docs
	//     13.2.1), exactly as hotrow's does.
	//   - undo: when the row had no unit left by the time take had it (the
	//     last units went while this one waited), the reservation just
	//     inserted must not commit. Plain SQL cannot roll a statement back,
	//     but a failing constraint can: the insert into onetrip_no_unit
	//     violates its CHECK (false), and the whole statement, insert
	//     included, is undone with SQLSTATE 23514 and that constraint's
	//     name. Only requests racing for the last units meet it.
	//
	// unit_seen false: the snapshot had no unit (SOLD_OUT unless sqlWhyNot
	// finds another answer). expires_at NULL with unit_seen: a unique index
	// said no, and sqlWhyNot says which. expires_at uses now(), the
	// statement's transaction start.
	sqlTakeAndInsert = `
WITH seen AS (
    SELECT sku FROM onetrip_stock WHERE sku = $3 AND available > 0
), ins AS (
    INSERT INTO onetrip_reservation (request_key, user_id, sku, status, expires_at)
    SELECT $1, $2, seen.sku, 'HELD', now() + $4::bigint * interval '1 microsecond' FROM seen
    ON CONFLICT DO NOTHING
    RETURNING sku, expires_at
), take AS (
    UPDATE onetrip_stock SET available = available - 1
    WHERE sku = $3 AND available > 0 AND EXISTS (SELECT 1 FROM ins)
    RETURNING 1
), undo AS (
    INSERT INTO onetrip_no_unit (sku) SELECT sku FROM ins WHERE NOT EXISTS (SELECT 1 FROM take)
)
SELECT EXISTS (SELECT 1 FROM seen) AS unit_seen, (SELECT expires_at FROM ins) AS expires_at`

	// sqlWhyNot answers a request that sqlTakeAndInsert did not hold, in a
	// new statement, so a new snapshot: the reservation that owns the key
	// (all NULL when none) and whether the user holds an active
	// reservation of the SKU. The order of the answers is hotrow's: a known
	// key first (REPLAY or KEY_REUSED), then the user's limit, then the
	// stock.
	sqlWhyNot = `
SELECT k.user_id, k.sku, k.status, k.expires_at,
       EXISTS (SELECT 1 FROM onetrip_reservation a
               WHERE a.sku = $2 AND a.user_id = $3 AND a.status IN ('HELD', 'CONFIRMED'))
FROM (SELECT 1) AS one
LEFT JOIN onetrip_reservation k ON k.request_key = $1`

	sqlLookup = `SELECT user_id, sku, status, expires_at FROM onetrip_reservation WHERE request_key = $1`
)

// constraintNoUnit is the CHECK that undoes sqlTakeAndInsert when the last
// units went while it waited for the row (schema.sql).
const constraintNoUnit = "onetrip_no_unit_abort"

// errInvisibleConflict: a unique index refused sqlTakeAndInsert's insert,
// but the row it conflicted with is no longer there when sqlWhyNot looks (a
// user's reservation released or expired in between). Nothing was written;
// the request runs again.
var errInvisibleConflict = errors.New("onetrip: the conflicting reservation was gone when looked up")

// querier is a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// take runs sqlTakeAndInsert on q: held when it inserted a reservation
// and took its unit; otherwise unitSeen says whether the snapshot had a
// unit (a unique index said no) or not. A statement undone because the
// last units went while it waited comes back as the error errNoUnitLeft;
// pgx then drops the statement from its cache (it does after any error),
// and the connection's next request prepares it again.
func take(ctx context.Context, q querier, req strategy.Request) (r strategy.Reservation, held, unitSeen bool, err error) {
	r = strategy.Reservation{Key: req.Key, User: req.User, SKU: req.SKU, Status: strategy.StatusHeld}
	var expires *time.Time
	if err := q.QueryRow(ctx, sqlTakeAndInsert, req.Key, req.User, req.SKU, req.TTL.Microseconds()).Scan(&unitSeen, &expires); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.ConstraintName == constraintNoUnit {
			return r, false, false, errNoUnitLeft
		}
		return r, false, false, fmt.Errorf("take and insert: %w", err)
	}
	if expires == nil {
		return r, false, unitSeen, nil
	}
	r.ExpiresAt = *expires
	return r, true, true, nil
}

// errNoUnitLeft: sqlTakeAndInsert was undone (nothing written) because the
// row had no unit left once it had the lock.
var errNoUnitLeft = errors.New("onetrip: the last unit went while this request waited for it")

// whyNot answers a request that take did not hold: soldOut says take found
// no unit; otherwise a unique index refused its insert.
func whyNot(ctx context.Context, q querier, req strategy.Request, soldOut bool) (strategy.Result, error) {
	var (
		user, sku, status *string
		expires           *time.Time
		holds             bool
	)
	if err := q.QueryRow(ctx, sqlWhyNot, req.Key, req.SKU, req.User).Scan(&user, &sku, &status, &expires, &holds); err != nil {
		return strategy.Result{}, fmt.Errorf("look up why not held: %w", err)
	}
	switch {
	case user != nil:
		r := strategy.Reservation{Key: req.Key, User: *user, SKU: *sku, Status: strategy.Status(*status), ExpiresAt: *expires}
		return pgstrategy.KnownKey(req, r), nil
	case holds:
		return strategy.Result{Outcome: strategy.OutcomeUserLimit}, nil
	case soldOut:
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil
	}
	return strategy.Result{}, errInvisibleConflict
}

// Reserve sends sqlTakeAndInsert in autocommit: HELD in one round trip.
// Otherwise sqlWhyNot, a second round trip, finds the answer.
func (n *node) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if res, err := n.Admit(n.d.owns, req); err != nil {
		return res, err
	}
	for attempt := 0; ; attempt++ {
		res, err := n.d.reserveOnce(ctx, req)
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

func (d *Deployment) reserveOnce(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	r, held, unitSeen, err := take(ctx, d.db, req)
	switch {
	case held:
		return strategy.Result{Outcome: strategy.OutcomeHeld, Reservation: r}, nil
	case errors.Is(err, errNoUnitLeft):
		return whyNot(ctx, d.db, req, true)
	case err != nil:
		return strategy.Result{}, err
	}
	return whyNot(ctx, d.db, req, !unitSeen)
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
