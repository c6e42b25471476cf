package memquota

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// counter is one node's in-memory count of the units of one SKU it may still
// hand out. It is lock-free: a CAS loop that never goes below zero.
type counter struct {
	n             atomic.Int64
	checkThenTake bool // Options.CheckThenTake's mistake
}

// take removes one unit and reports whether there was one.
func (c *counter) take() bool {
	if c.checkThenTake {
		if c.n.Load() <= 0 {
			return false
		}
		c.n.Add(-1)
		return true
	}
	for {
		v := c.n.Load()
		if v <= 0 {
			return false
		}
		if c.n.CompareAndSwap(v, v-1) {
			return true
		}
	}
}

// put gives one unit back.
func (c *counter) put() { c.n.Add(1) }

// node is one node of a Deployment: a process with its own counters.
type node struct {
	d                 *Deployment
	id                int
	counters          map[string]*counter // one per SKU; the map is never written after start
	pgstrategy.Handle                     // Check: ErrNodeClosed once restarted or closed

	fmu     sync.Mutex
	flights map[string]*flight // requests in flight on this node, by key, user and sku

	dmu    sync.Mutex
	doubts []doubt      // units taken for inserts whose fate is unknown
	ndoubt atomic.Int32 // len(doubts), read without the lock
}

// doubt is a unit taken from a node's counter for a sales-log row whose
// insert (or commit) failed in a way that does not tell whether it committed:
// the connection broke, or the deadline passed, after the statement was
// sent. The unit stays out of the counter until Settle learns the outcome.
type doubt struct {
	key     string
	sku     string
	pid     uint32 // the backend that ran the insert
	attempt int64  // the row's attempt column, if it committed
}

// doubtPIDs returns the backends of the node's units in doubt.
func (n *node) doubtPIDs() []int32 {
	n.dmu.Lock()
	defer n.dmu.Unlock()
	pids := make([]int32, 0, len(n.doubts))
	for _, d := range n.doubts {
		pids = append(pids, int32(d.pid))
	}
	return pids
}

func (n *node) addDoubt(d doubt) {
	n.dmu.Lock()
	n.doubts = append(n.doubts, d)
	n.ndoubt.Store(int32(len(n.doubts)))
	n.dmu.Unlock()
}

// flight is one request in flight on a node; identical requests that arrive
// meanwhile wait for its answer instead of taking units of their own.
type flight struct {
	done chan struct{}
	res  strategy.Result
	err  error
}

// querier is what the reserve path needs: a connection of the pool for a
// plain request, the session's transaction for an attempt held open.
type querier interface {
	pgstrategy.Querier
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Reserve asks this node for one unit: the counter first, then the log.
//
// Concurrent identical requests (same key, user and sku) on this node are
// coalesced: one of them runs, the others wait for its answer and turn a
// HELD into a REPLAY of the same reservation. Without it, 16 copies of one
// request on a node with 5 units would take all 5 and answer SOLD_OUT to the
// rest although their key is held. Copies on other nodes meet in the log's
// unique index instead.
func (n *node) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if err := n.d.known.Check(req); err != nil {
		return strategy.BadRequest(err)
	}
	id := req.Key + "\x1f" + req.User + "\x1f" + req.SKU // Validate rejects control characters
	if n.d.opts.FlightByJoinedText {
		id = req.Key + ":" + req.User + ":" + req.SKU
	}
	for {
		n.fmu.Lock()
		if f, ok := n.flights[id]; ok {
			n.fmu.Unlock()
			select {
			case <-f.done:
			case <-ctx.Done():
				return strategy.Result{}, ctx.Err()
			}
			if f.err != nil {
				continue // the leader's outcome is unknown: run (or join) another attempt
			}
			res := f.res
			if res.Outcome == strategy.OutcomeHeld {
				res.Outcome = strategy.OutcomeReplay
			}
			return res, nil
		}
		f := &flight{done: make(chan struct{})}
		n.flights[id] = f
		n.fmu.Unlock()

		f.res, f.err = n.reservePlain(ctx, req)

		n.fmu.Lock()
		delete(n.flights, id)
		n.fmu.Unlock()
		close(f.done)
		return f.res, f.err
	}
}

// reservePlain runs the reserve path on a connection of the pool. It first
// settles the deployment's units in doubt, if there are any (Settle). It
// takes the connection before the unit, so a request queued for a connection
// holds no unit, and a request that never got one surely wrote nothing; an
// insert of unknown fate leaves its unit in doubt.
func (n *node) reservePlain(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	n.d.life.RLock()
	defer n.d.life.RUnlock()
	if err := n.Check(); err != nil {
		return strategy.Result{}, err
	}
	n.d.settleSome(ctx)
	conn, err := n.d.db.Acquire(ctx)
	if err != nil {
		return strategy.Result{}, fmt.Errorf("memquota: node %d: %w", n.id, err)
	}
	defer conn.Release()
	a := &pass{q: conn, pid: conn.Conn().PgConn().PID()}
	res, err := n.reserve(ctx, a, req)
	if a.inDoubt {
		n.addDoubt(doubt{key: req.Key, sku: req.SKU, pid: a.pid, attempt: a.attempt})
	}
	return res, err
}

// pass is one pass through the reserve path.
type pass struct {
	q    querier
	held bool   // inside a session: nothing commits before Session.Commit
	pid  uint32 // the backend q runs on

	attempt int64 // set by reserve: the attempt column of the row it inserts
	inDoubt bool  // set by reserve: the insert failed and may have committed
}

// insertSQL writes the sales-log row. ON CONFLICT DO NOTHING without a
// target covers both unique indexes (the key, and one active reservation
// per user and sku); which one refused the row is then read from the log. A
// conflicting row still in flight makes PostgreSQL wait for its transaction
// before deciding, so a refused insert always finds a committed row, and a
// row rolled back refuses nothing. That is the only kind of wait in this
// package: for an attempt with the same key, or the same user and sku, whose
// commit decides the answer; never for stock.
//
// Before the insert it tries the key's advisory lock shared, without
// waiting, and keeps it while its row is in flight (to the end of the
// statement, or of an attempt held open): a hint that lets a node with no
// unit left see that the key may be on its way into the log (soldOut).
const insertSQL = `
WITH hint AS MATERIALIZED (SELECT pg_try_advisory_xact_lock_shared($6))
INSERT INTO memquota_sale (request_key, user_id, sku, node, status, expires_at, attempt)
SELECT $1, $2, $3, $4, 'HELD', now() + $5::bigint * interval '1 microsecond', $7 FROM hint
ON CONFLICT DO NOTHING
RETURNING expires_at`

// reserve is the one reserve path, for plain requests (a.q is a connection
// of the pool) and attempts held open (a.q is the session's transaction).
// The caller holds d.life shared.
//
//  1. Take a unit from the node's counter. None left: answer from the log
//     (REPLAY or KEY_REUSED when the key is known, else SOLD_OUT), waiting
//     for a row with the key in flight (soldOut); nothing is written.
//  2. Insert the sales-log row. Refused: the unit goes back to the counter
//     and the log says why (REPLAY, KEY_REUSED, else USER_LIMIT).
//  3. Failed: a failure that surely wrote nothing gives the unit back; one
//     whose fate is unknown (the connection broke, or the deadline passed,
//     after the statement was sent) keeps it in doubt until Settle learns
//     from the log whether the row committed: a unit counted twice would be
//     sold twice.
//
// Steps 2 and 3 are logSale; Deployment.CrashMidReserve runs step 1 alone.
func (n *node) reserve(ctx context.Context, a *pass, req strategy.Request) (strategy.Result, error) {
	c := n.counters[req.SKU]
	if !c.take() {
		return n.soldOut(ctx, a.q, req, a.held)
	}
	return n.logSale(ctx, a, c, req)
}

// logSale writes the sales-log row for the unit just taken from c.
func (n *node) logSale(ctx context.Context, a *pass, c *counter, req strategy.Request) (strategy.Result, error) {
	q, held := a.q, a.held
	a.attempt = n.d.newAttempt()
	var expires time.Time
	hint := keyLock(req.Key)
	if n.d.opts.KeyHintFolded { // the mistake
		hint = keyLock(strings.ToLower(req.Key))
	}
	err := q.QueryRow(ctx, insertSQL, req.Key, req.User, req.SKU, n.id, req.TTL.Microseconds(), hint, a.attempt).Scan(&expires)
	switch {
	case errors.Is(err, pgx.ErrNoRows): // refused: the key or the user has a committed row
		if !n.d.opts.PutBackAfterLookup {
			c.put()
		}
		r, err := lookup(ctx, q, req.Key)
		if err != nil {
			return strategy.Result{}, fmt.Errorf("memquota: node %d: %w", n.id, err)
		}
		if n.d.opts.PutBackAfterLookup {
			c.put()
		}
		return answer(req, r, strategy.OutcomeUserLimit), nil
	case err != nil:
		if (held && !n.d.opts.SessionFailKeepsDoubt) || wroteNothing(err) {
			c.put()
		} else {
			a.inDoubt = true
		}
		return strategy.Result{}, fmt.Errorf("memquota: node %d: insert sale: %w", n.id, err)
	}
	return strategy.Result{Outcome: strategy.OutcomeHeld, Reservation: strategy.Reservation{
		Key: req.Key, User: req.User, SKU: req.SKU, Status: strategy.StatusHeld, ExpiresAt: expires,
	}}, nil
}

// answer turns the log's reservation under the request's key into the
// answer: REPLAY when it has the same user and sku, KEY_REUSED when others,
// and otherwise the given outcome when there is none.
func answer(req strategy.Request, r strategy.Reservation, otherwise strategy.Outcome) strategy.Result {
	if r.Status == strategy.StatusNotFound {
		return strategy.Result{Outcome: otherwise}
	}
	return pgstrategy.KnownKey(req, r)
}

// soldOut answers a request that found no unit: from the log, so that a
// repeated key is REPLAY (or KEY_REUSED), never SOLD_OUT.
//
// A row with the key may be in flight: another node inserting it, or an
// attempt held open. Its commit decides the answer, so the node waits for it,
// but only then: a plain request tries the key's advisory lock exclusively
// in the same statement as the lookup (one round trip) and finds it free
// unless an insert of the key holds it (insertSQL); only then does it wait
// for that insert's transaction to end (awaitHintSQL: the insert may still
// be waiting for its user, with no row to wait for) and probe (probeSQL),
// which waits for exactly the rows in flight. An attempt held open skips
// lookupTry, whose exclusive lock its transaction would keep, and waits for
// the hint in awaitHint's slices, each in a savepoint rolled back with its
// lock; until 2026-12-06 it only probed, and a resend inside an attempt
// held open, on a node with no unit, was told SOLD_OUT while its first
// copy waited on the per-user index with no row yet (the kit's
// checkResendBehindUser; Options.SessionSkipsHint).
func (n *node) soldOut(ctx context.Context, q querier, req strategy.Request, held bool) (strategy.Result, error) {
	if held && !n.d.opts.SessionSkipsHint && !n.d.opts.SoldOutProbesKeyOnly {
		r, err := awaitHint(ctx, q, req.Key, n.d.opts.HintWaitBounded)
		if err != nil {
			return strategy.Result{}, fmt.Errorf("memquota: node %d: %w", n.id, err)
		}
		if r.Status != strategy.StatusNotFound {
			return answer(req, r, strategy.OutcomeSoldOut), nil
		}
	}
	if !held {
		r, free, err := lookupTry(ctx, q, req.Key)
		if err != nil {
			return strategy.Result{}, fmt.Errorf("memquota: node %d: %w", n.id, err)
		}
		if r.Status != strategy.StatusNotFound || free {
			return answer(req, r, strategy.OutcomeSoldOut), nil
		}
		if !n.d.opts.SoldOutProbesKeyOnly {
			r, err := awaitHint(ctx, q, req.Key, n.d.opts.HintWaitBounded)
			if err != nil {
				return strategy.Result{}, fmt.Errorf("memquota: node %d: %w", n.id, err)
			}
			if r.Status != strategy.StatusNotFound {
				return answer(req, r, strategy.OutcomeSoldOut), nil
			}
		}
	}
	// A row with the key may be in flight: wait for it, then read the log.
	if err := probe(ctx, q, req.Key); err != nil {
		return strategy.Result{}, fmt.Errorf("memquota: node %d: %w", n.id, err)
	}
	r, err := lookup(ctx, q, req.Key)
	if err != nil {
		return strategy.Result{}, fmt.Errorf("memquota: node %d: %w", n.id, err)
	}
	return answer(req, r, strategy.OutcomeSoldOut), nil
}

// awaitHintSQL waits until no insert of the key holds its hint (insertSQL's
// shared lock), and lets go at the end of its transaction. The insert that
// holds it may have no row yet: it waits before its insert on the per-user
// index, behind an attempt of the same user and SKU, and the probe, which
// waits on the key's index alone, would pass it by; its commit still
// decides this request's answer when it is a resend. An attempt held open
// whose insert met the key's row and wrote nothing keeps the hint to its
// end, so the wait is cut into hintWait slices with a lookup between
// them: the key's row, once committed, answers at once.
const awaitHintSQL = `SELECT pg_advisory_xact_lock($1)::text`

// hintWait is one slice of awaitHint's wait (lock_timeout).
const hintWait = "100ms"

// hintWaitBound is how many slices of hintWait awaitHint waits with
// Options.HintWaitBounded (2 s).
const hintWaitBound = 20

// awaitHint waits for the key's hint to be free, and returns NOT_FOUND
// then, or for the key's row, and returns it. bounded is the mistake
// Options.HintWaitBounded.
func awaitHint(ctx context.Context, q querier, key string, bounded bool) (strategy.Reservation, error) {
	for slice := 1; ; slice++ {
		free, err := tryHintFor(ctx, q, key)
		if err != nil {
			return strategy.Reservation{}, fmt.Errorf("wait for the insert of %q: %w", key, err)
		}
		if free || (bounded && slice >= hintWaitBound) {
			return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, nil
		}
		r, err := lookup(ctx, q, key)
		if err != nil || r.Status != strategy.StatusNotFound {
			return r, err
		}
	}
}

// tryHintFor waits hintWait at most for the key's hint, in a transaction of
// its own, and reports whether it got it.
func tryHintFor(ctx context.Context, q querier, key string) (bool, error) {
	tx, err := q.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+hintWait+"'"); err != nil {
		return false, err
	}
	var void string
	err = tx.QueryRow(ctx, awaitHintSQL, keyLock(key)).Scan(&void)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.LockNotAvailable {
		return false, nil
	}
	return err == nil, err
}

// lookupTrySQL looks a key up and tries its advisory lock exclusively, for
// the length of the statement (a plain request runs it in autocommit).
const lookupTrySQL = `
SELECT pg_try_advisory_xact_lock($2), s.user_id, s.sku, s.status, s.expires_at
FROM (SELECT 1) AS one LEFT JOIN memquota_sale s ON s.request_key = $1`

func lookupTry(ctx context.Context, q querier, key string) (strategy.Reservation, bool, error) {
	var free bool
	var user, sku, status *string
	var expires *time.Time
	if err := q.QueryRow(ctx, lookupTrySQL, key, keyLock(key)).Scan(&free, &user, &sku, &status, &expires); err != nil {
		return strategy.Reservation{}, false, fmt.Errorf("lookup %q: %w", key, err)
	}
	if status == nil {
		return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, free, nil
	}
	return strategy.Reservation{Key: key, User: *user, SKU: *sku, Status: strategy.Status(*status), ExpiresAt: *expires}, free, nil
}

// probeSQL inserts a placeholder under the key, inside a transaction (or
// savepoint) that is always rolled back, only to make PostgreSQL wait for
// any row with the key still in flight. Its status keeps it out of the
// per-user index, so it waits for the key alone.
const probeSQL = `
INSERT INTO memquota_sale (request_key, user_id, sku, node, status, expires_at)
VALUES ($1, '', '', 0, 'RELEASED', now())
ON CONFLICT (request_key) DO NOTHING`

func probe(ctx context.Context, q querier, key string) error {
	tx, err := q.Begin(ctx)
	if err != nil {
		return fmt.Errorf("probe %q: %w", key, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, probeSQL, key); err != nil {
		return fmt.Errorf("probe %q: %w", key, err)
	}
	return tx.Rollback(ctx)
}

// wroteNothing reports whether a failed autocommit statement certainly left
// no row: the server refused it (it was rolled back), or it never left the
// client.
func wroteNothing(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) || pgconn.SafeToRetry(err)
}

// newAttempt numbers an insert or a move, for Settle to find its row: at
// random, so that no other process, now or before, marks a row with it
// (the kit's deployment contract settles a release in doubt in a process
// that attached after another made the same moves).
func (d *Deployment) newAttempt() int64 {
	if d.opts.AttemptsCounted {
		return d.counted.Add(1)
	}
	return rand.Int64()
}

// keyLock maps a request key to the 64-bit id of its advisory lock.
func keyLock(key string) int64 {
	h := fnv.New64a()
	h.Write([]byte("memquota\x1fkey\x1f" + key))
	return int64(h.Sum64())
}

const lookupSQL = `SELECT user_id, sku, status, expires_at FROM memquota_sale WHERE request_key = $1`

func lookup(ctx context.Context, q pgstrategy.Querier, key string) (strategy.Reservation, error) {
	r, _, err := pgstrategy.ScanReservation(q.QueryRow(ctx, lookupSQL, key), key)
	if err != nil {
		return strategy.Reservation{}, fmt.Errorf("lookup %q: %w", key, err)
	}
	return r, nil
}

// Lookup returns the reservation with this key from the sales log.
func (n *node) Lookup(ctx context.Context, key string) (strategy.Reservation, error) {
	if ok, err := n.CheckKey(key); !ok {
		return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, err
	}
	r, err := lookup(ctx, n.d.db, key)
	if err != nil {
		return r, fmt.Errorf("memquota: %w", err)
	}
	return r, nil
}

const (
	confirmSQL = `
UPDATE memquota_sale SET status = 'CONFIRMED', updated_at = now()
WHERE request_key = $1 AND status = 'HELD' AND sku = ANY($2)`
	confirmBeforeExpirySQL = confirmSQL + ` AND expires_at >= now()`

	releaseSQL = `
UPDATE memquota_sale SET status = 'RELEASED', updated_at = now(), moved_attempt = $3
WHERE request_key = $1 AND status = 'HELD' AND sku = ANY($2)
RETURNING node, sku`

	expireSQL = `
UPDATE memquota_sale SET status = 'EXPIRED', updated_at = now(), moved_attempt = $2
WHERE sku = ANY($1) AND status = 'HELD' AND expires_at < now()
RETURNING node, sku`
)

// Confirm moves a HELD reservation of the deployment to CONFIRMED. The unit
// stays sold, so no counter changes.
func (n *node) Confirm(ctx context.Context, key string, mode strategy.ConfirmMode) (bool, error) {
	if ok, err := n.CheckKey(key); !ok {
		return false, err
	}
	stmt := confirmBeforeExpirySQL
	if mode == strategy.ConfirmUntilExpired {
		stmt = confirmSQL
	}
	tag, err := n.d.db.Exec(ctx, stmt, key, n.d.skus)
	if err != nil {
		return false, fmt.Errorf("memquota: confirm %q: %w", key, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Release moves a HELD reservation to RELEASED and gives its unit back to
// the node that sold it.
func (n *node) Release(ctx context.Context, key string) (int, error) {
	if ok, err := n.CheckKey(key); !ok {
		return 0, err
	}
	units, err := n.transition(ctx, true, releaseSQL, key, n.d.skus)
	if err != nil {
		return units, fmt.Errorf("memquota: release %q: %w", key, err)
	}
	return units, nil
}

// ExpireDue moves every due HELD reservation of the deployment to EXPIRED in
// one statement and gives a unit back to the owning node for each row that
// statement moved, as its RETURNING clause lists them.
func (n *node) ExpireDue(ctx context.Context) (int, error) {
	units, err := n.transition(ctx, true, expireSQL, n.d.skus)
	if err != nil {
		return units, fmt.Errorf("memquota: expire: %w", err)
	}
	return units, nil
}

// owned is a row a transition moved out of HELD: the node that sold it and
// its SKU, where its unit goes back to.
type owned struct {
	Node int32
	SKU  string
}

// moveRows runs a transition statement and returns the rows it moved.
func moveRows(ctx context.Context, q pgstrategy.Querier, stmt string, args ...any) ([]owned, error) {
	rows, err := q.Query(ctx, stmt, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[owned])
}

// transition runs a statement that moves rows out of HELD and returns their
// (node, sku), and gives one unit back per returned row. The statement takes
// one more argument, last: a random attempt number it writes to the rows it
// moves. Between the commit and the give-back the unit is in neither place:
// a process dying there loses it (undersell) until a FromLog restart counts
// the log again. A statement that fails without telling whether it
// committed (the connection broke after it was sent) leaves its rows in
// doubt: once its backend is gone, Settle reads from the log which rows
// carry the attempt and gives their units back. giveBack is always true but
// in this package's tests, which make a transition die after its commit
// (export_test.go).
func (n *node) transition(ctx context.Context, giveBack bool, stmt string, args ...any) (int, error) {
	n.d.life.RLock()
	if n.d.opts.TransitionLetsRestart {
		unlocked := false
		unlock := func() {
			if !unlocked {
				unlocked = true
				n.d.life.RUnlock()
			}
		}
		defer unlock()
		if err := n.Check(); err != nil {
			return 0, err
		}
		n.d.settleSome(ctx)
		unlock()
	} else {
		defer n.d.life.RUnlock()
		if err := n.Check(); err != nil {
			return 0, err
		}
		n.d.settleSome(ctx)
	}
	conn, err := n.d.db.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	attempt := n.d.newAttempt()
	moved, err := moveRows(ctx, conn, stmt, append(args, attempt)...)
	if err != nil {
		if !wroteNothing(err) {
			n.d.addMove(attempt, conn.Conn().PgConn().PID())
		}
		return 0, err
	}
	if !giveBack {
		return 0, errCrashed
	}
	for _, m := range moved {
		to := int(m.Node)
		if n.d.opts.GivesBackToMover {
			to = n.id // the mistake
		}
		n.d.giveBack(to, m.SKU)
	}
	return len(moved), nil
}
