package combine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// One batch: the requests for one SKU that a node gathered, served by one
// statement in autocommit (sqlBatch), and a second statement (sqlWhyNot)
// only for requests it did not settle.
const (
	// sqlBatch serves n requests for SKU $1; $2, $3, $4 are their keys,
	// users and TTLs (µs), in arrival order. A batch never holds two
	// requests with one key or one user (combiner.next keeps them for the
	// next batch), so within it nothing conflicts with anything else.
	//
	//   - known: keys committed before the statement's snapshot: their
	//     answer is REPLAY or KEY_REUSED, whatever the stock.
	//   - cand: the others, except users whose active reservation of the
	//     SKU the snapshot shows (USER_LIMIT), ranked in arrival order.
	//   - stock locks the SKU's row FOR NO KEY UPDATE (the lock an UPDATE
	//     takes), only when it has a unit and there is a candidate. Under
	//     READ COMMITTED a row locked by another batch in flight is waited
	//     for and available > 0 evaluated again on its newest version (docs
	//     13.2.1, SELECT FOR UPDATE); the value it returns is that version's,
	//     and no one else can change it until this statement commits.
	//   - ins inserts the candidates ranked within what is available: a
	//     partial fill when fewer units remain than candidates. ON CONFLICT
	//     DO NOTHING without a target makes both unique indexes arbiters: a
	//     key or user that a transaction committed after the snapshot (or
	//     still in flight: waited for) inserts nothing, and the request is
	//     asked about again. No error on any path: pgx drops a statement
	//     from its cache after any error. Inserting in key order keeps two
	//     batches that share keys (a key reused for another SKU) from
	//     waiting on each other in opposite orders.
	//   - take decrements the row by exactly the rows inserted: it is
	//     locked by this statement, so available - inserted >= 0.
	//
	// One row per request: the key's owner (known), whether the user was at
	// the limit, the new reservation's expires_at (held), whether it was
	// tried (ranked within the units), and the units left after the batch.
	sqlBatch = `
WITH req AS (
    SELECT r.ord, r.request_key, r.user_id, r.ttl_us
    FROM unnest($2::text[], $3::text[], $4::bigint[]) WITH ORDINALITY AS r (request_key, user_id, ttl_us, ord)
), known AS (
    SELECT req.ord, k.user_id, k.sku, k.status, k.expires_at
    FROM req JOIN combine_reservation k ON k.request_key = req.request_key
), cand AS (
    SELECT req.ord, req.request_key, req.user_id, req.ttl_us, row_number() OVER (ORDER BY req.ord) AS rank
    FROM req
    WHERE NOT EXISTS (SELECT 1 FROM known WHERE known.ord = req.ord)
      AND NOT EXISTS (SELECT 1 FROM combine_reservation a
                      WHERE a.sku = $1 AND a.user_id = req.user_id AND a.status IN ('HELD', 'CONFIRMED'))
), stock AS (
    SELECT sku, available FROM combine_stock
    WHERE sku = $1 AND available > 0 AND EXISTS (SELECT 1 FROM cand)
    FOR NO KEY UPDATE
), ins AS (
    INSERT INTO combine_reservation (request_key, user_id, sku, status, expires_at)
    SELECT cand.request_key, cand.user_id, stock.sku, 'HELD', now() + cand.ttl_us * interval '1 microsecond'
    FROM cand, stock WHERE cand.rank <= stock.available
    ORDER BY cand.request_key
    ON CONFLICT DO NOTHING
    RETURNING request_key, expires_at
), take AS (
    UPDATE combine_stock s SET available = s.available - (SELECT count(*) FROM ins)
    WHERE s.sku = $1 AND EXISTS (SELECT 1 FROM ins)
    RETURNING 1
)
SELECT req.ord::int, known.user_id, known.sku, known.status, known.expires_at,
       known.ord IS NULL AND cand.ord IS NULL AS limited,
       ins.expires_at AS held_until,
       coalesce(cand.rank <= (SELECT available FROM stock), false) AS tried,
       (coalesce((SELECT available FROM stock), 0) - (SELECT count(*) FROM ins))::int AS left_after
FROM req
LEFT JOIN known ON known.ord = req.ord
LEFT JOIN cand ON cand.ord = req.ord
LEFT JOIN ins ON ins.request_key = req.request_key
ORDER BY req.ord`

	// sqlWhyNot asks, in a new statement (a new snapshot), about the
	// requests sqlBatch did not settle: the reservation that owns each key
	// (all NULL when none) and whether its user holds an active
	// reservation of SKU $1. The answer's order is hotrow's: a known key,
	// then the user's limit, then the stock.
	sqlWhyNot = `
SELECT r.ord::int, k.user_id, k.sku, k.status, k.expires_at,
       EXISTS (SELECT 1 FROM combine_reservation a
               WHERE a.sku = $1 AND a.user_id = r.user_id AND a.status IN ('HELD', 'CONFIRMED'))
FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS r (request_key, user_id, ord)
LEFT JOIN combine_reservation k ON k.request_key = r.request_key`

	sqlLookup = `SELECT user_id, sku, status, expires_at FROM combine_reservation WHERE request_key = $1`
)

// question is a request sqlBatch did not settle: asked about again with
// sqlWhyNot. soldOut: it was not tried because no unit was left.
type question struct {
	i       int
	soldOut bool
}

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// reply is what a batch decided for one request: an answer, requeue (run
// it again in a later batch: it was never tried while units were left, or
// the conflict it met was gone when asked about), or err (sqlWhyNot failed
// after sqlBatch had committed: this request wrote nothing, but its answer
// was not found; the caller reports an unknown outcome, as for any error).
type reply struct {
	res     strategy.Result
	requeue bool
	err     error
}

// owner is a reservation read by key; User is nil when none was found.
type owner struct {
	User, SKU, Status *string
	ExpiresAt         *time.Time
}

func (o owner) result(req strategy.Request) (strategy.Result, bool) {
	if o.User == nil {
		return strategy.Result{}, false
	}
	r := strategy.Reservation{Key: req.Key, User: *o.User, SKU: *o.SKU, Status: strategy.Status(*o.Status), ExpiresAt: *o.ExpiresAt}
	return pgstrategy.KnownKey(req, r), true
}

// serve runs one batch for sku on q: sqlBatch, then sqlWhyNot for the
// requests it did not settle. reqs must have distinct keys and users. An
// error means nothing is known about any request of the batch (whether
// sqlBatch committed is unknown when the error came at its commit); once
// sqlBatch has answered, its answers stand, and an error of sqlWhyNot is
// only the asked requests' (reply.err).
func serve(ctx context.Context, q querier, sku string, reqs []strategy.Request, m Mistake) ([]reply, error) {
	keys, users, ttls := make([]string, len(reqs)), make([]string, len(reqs)), make([]int64, len(reqs))
	for i, r := range reqs {
		keys[i], users[i], ttls[i] = r.Key, r.User, r.TTL.Microseconds()
	}
	out := make([]reply, len(reqs))
	var ask []question
	batchSQL := sqlBatch
	if m == TakeByCandidates {
		batchSQL = strings.Replace(sqlBatch, "s.available - (SELECT count(*) FROM ins)", "s.available - (SELECT count(*) FROM cand, stock WHERE cand.rank <= stock.available)", 1)
	}
	if m == AnswersByPosition {
		batchSQL = strings.Replace(sqlBatch, "\nORDER BY req.ord", "", 1)
	}
	position := 0
	rows, err := q.Query(ctx, batchSQL, sku, keys, users, ttls)
	if err != nil {
		return nil, fmt.Errorf("batch: %w", err)
	}
	var (
		ord          int
		known        owner
		limited      bool
		heldUntil    *time.Time
		tried        bool
		left         int
		leftAfterAll int
	)
	_, err = pgx.ForEachRow(rows, []any{&ord, &known.User, &known.SKU, &known.Status, &known.ExpiresAt, &limited, &heldUntil, &tried, &left}, func() error {
		i := ord - 1
		if m == AnswersByPosition {
			i = position // the mistake: the row's place, not its ord
		}
		position++
		if i < 0 || i >= len(reqs) {
			return fmt.Errorf("batch: answer for request %d of %d", ord, len(reqs))
		}
		req := reqs[i]
		leftAfterAll = left
		switch res, ok := known.result(req); {
		case ok:
			out[i].res = res
		case limited:
			out[i].res = strategy.Result{Outcome: strategy.OutcomeUserLimit}
		case heldUntil != nil:
			out[i].res = strategy.Result{Outcome: strategy.OutcomeHeld, Reservation: strategy.Reservation{
				Key: req.Key, User: req.User, SKU: req.SKU, Status: strategy.StatusHeld, ExpiresAt: *heldUntil}}
		case tried:
			ask = append(ask, question{i: i})
		default:
			ask = append(ask, question{i: i, soldOut: true})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("batch: %w", err)
	}
	// A request that was not tried while units were left (an earlier one
	// met a conflict the snapshot did not show, so fewer rows went in than
	// units were there) was never refused: it goes to the next batch.
	var askKeys, askUsers []string
	var asked []question
	for _, a := range ask {
		if a.soldOut && leftAfterAll > 0 && m != SoldOutUntried {
			out[a.i].requeue = true
			continue
		}
		asked = append(asked, a)
		askKeys, askUsers = append(askKeys, keys[a.i]), append(askUsers, users[a.i])
	}
	if len(asked) == 0 {
		return out, nil
	}
	if err := whyNot(ctx, q, sku, reqs, askKeys, askUsers, asked, out, m); err != nil {
		for _, a := range asked {
			out[a.i] = reply{err: err}
		}
	}
	return out, nil
}

// whyNot runs sqlWhyNot for the asked requests and fills their replies.
func whyNot(ctx context.Context, q querier, sku string, reqs []strategy.Request, keys, users []string, asked []question, out []reply, m Mistake) error {
	rows, err := q.Query(ctx, sqlWhyNot, sku, keys, users)
	if err != nil {
		return fmt.Errorf("why not: %w", err)
	}
	var (
		ord   int
		known owner
		holds bool
	)
	position := 0
	_, err = pgx.ForEachRow(rows, []any{&ord, &known.User, &known.SKU, &known.Status, &known.ExpiresAt, &holds}, func() error {
		position++
		if m == WhyNotByPosition {
			ord = position // the mistake: the row's place, not its ord
		}
		if ord < 1 || ord > len(asked) {
			return fmt.Errorf("why not: answer for question %d of %d", ord, len(asked))
		}
		a := asked[ord-1]
		switch res, ok := known.result(reqs[a.i]); {
		case ok:
			out[a.i].res = res
		case holds:
			out[a.i].res = strategy.Result{Outcome: strategy.OutcomeUserLimit}
		case a.soldOut:
			out[a.i].res = strategy.Result{Outcome: strategy.OutcomeSoldOut}
		default:
			// The unique index refused it, and the row it conflicted with
			// is not active any more (released or expired in between).
			out[a.i].requeue = true
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("why not: %w", err)
	}
	return nil
}

// errGaveUp is the error of a request that went back to the queue
// Options.MaxRequeues times.
var errGaveUp = errors.New("combine: gave up after the request went back to the queue too often")
