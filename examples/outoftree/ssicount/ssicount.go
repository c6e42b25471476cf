// Package ssicount is a reservebench strategy that lives in a module of its
// own and uses only the exported API of github.com/reservebench/reservebench:
// the strategy contract, the conformance kit (strategytest) and the table
// harness (compare).
//
// # Mechanism
//
// There is no stock counter and no lock. Each reservation is one
// SERIALIZABLE transaction that looks the key up, counts the SKU's active
// (HELD or CONFIRMED) reservations and whether the user holds one, and
// inserts a HELD row only if the count is below the stock. Two reservations
// that each counted without seeing the other's insert form a read/write
// dependency cycle; PostgreSQL's serializable snapshot isolation (SSI,
// docs 13.2.3) aborts one of them with SQLSTATE 40001, and Reserve runs it
// again on a fresh snapshot, a bounded number of times (see DefaultMaxAttempts).
//
// # Where the correctness comes from
//
//   - No oversell: every transaction that makes a row active is
//     SERIALIZABLE, so the committed inserts behave as if run one at a
//     time, and in any serial order the count-then-insert stops at the
//     stock. The transitions (confirm, release, expire) run at READ
//     COMMITTED, outside SSI: that is safe because they only ever make
//     rows inactive or keep them active, never the reverse, so a count
//     can only be too high, never too low.
//   - Idempotent key and one active reservation per user: the primary key
//     on request_key and a partial unique index on (sku, user_id) for
//     active rows. A unique violation (23505) means the other row has
//     committed, so the retry's snapshot sees it and answers REPLAY,
//     KEY_REUSED or USER_LIMIT.
//   - Return once and conserves: available is derived (total minus active
//     rows), and every transition's WHERE carries status = 'HELD', so a
//     unit comes back when exactly one statement moves its row.
//   - Survives restart: a node keeps nothing in memory.
//
// # Claims about waiting and sold-out
//
// A SOLD_OUT is answered only from a snapshot in which the active rows,
// all committed, already fill the stock, and only when that transaction
// commits (SSI could still abort it): an attempt in flight is invisible to
// the count, so it can never cause a phantom sold-out. Nor does a
// reservation ever wait for another's uncommitted work when they compete
// only for stock: SSI's predicate locks never block, and the only waits
// are on the unique indexes, for the same key or the same user. So it
// claims both no-phantom-sold-out and no-wait, which seed C28-14 says no
// design can have together. The seed's argument assumes that an attempt
// held open has already been told HELD; here HELD is answered only after
// COMMIT succeeded, and the attempt that lost the race is the one that
// fails, with 40001, and is retried. The kit checks no-phantom-sold-out
// after every burst of concurrent requests (sell-out, contention, storm,
// skew, restart, ...); its phantom interleaving, the only check of no-wait,
// is n/a because the strategy opens no sessions, so
// TestPhantomOrderingNeitherWaitsNorSellsOut in this package plays the
// seed's ordering by hand and checks both.
//
// # Boundary
//
// The price of never waiting is work thrown away: under contention on one
// SKU about one attempt per round of concurrent attempts commits, and the
// others abort and run again, so a hot SKU costs several transactions per
// reservation and its latency grows with the number of concurrent
// requests. A request that loses Options.MaxAttempts times in a row gets an error
// (outcome unknown to the contract; in fact nothing was written) instead
// of an answer. Predicate locks are taken on index pages, so reservations
// for different SKUs whose entries share a page can abort each other too.
// A COMMIT that waits (for a synchronous standby) has committed but is not
// yet visible, and every attempt that conflicts with it fails again until
// it ends: in the commit-timeout scenario (4 SKUs, one index page) 2 of
// the 4 requests spend their whole deadline retrying and never reach
// COMMIT, where every other strategy's 4 had committed.
//
// It deliberately implements neither strategy.SessionOpener nor
// strategy.ExpirySessionOpener (the interleavings, kill-reserve and
// kill-release read n/a in table 28-1): a HELD answered inside a
// SERIALIZABLE transaction held open could still fail at COMMIT, which the
// session contract has no word for.
package ssicount

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// Name names the strategy in the registry and its row in table 28-1. A copy
// of this package must change it: strategy.Register panics on a name taken.
const Name = "ssicount"

func init() { strategy.Register(Meta()) }

// Options tune the strategy; the zero value is the registered strategy.
type Options struct {
	// MaxAttempts bounds the SERIALIZABLE attempts of one Reserve; 0 means
	// DefaultMaxAttempts.
	MaxAttempts int
}

// Meta describes the registered strategy.
func Meta() strategy.Meta { return New(Options{}) }

// New describes the strategy with these options; it is not registered.
func New(opts Options) strategy.Meta {
	return strategy.Meta{
		Name:        Name,
		Description: "no counter, no lock: a SERIALIZABLE transaction counts active rows and inserts; 40001 is retried",
		Correctness: "SSI aborts one of two reservations that each counted without the other's insert",
		Isolation:   "serializable",
		Retry:       "40001, and 23505 on a key or user its snapshot did not show: the whole transaction on a fresh snapshot, up to 64 attempts, after a jittered pause",
		Claims: strategy.NoOversell | strategy.IdempotentKey | strategy.OneActivePerUser | strategy.ReturnOnce |
			strategy.Conserves | strategy.NoPhantomSoldOut | strategy.NoWait | strategy.SurvivesRestart,
		// Meta wants funcs returning the interface; returning a nil
		// *Deployment through it would make a non-nil interface.
		Open: func(ctx context.Context, cfg strategy.Config) (strategy.Deployment, error) {
			return asDeployment(Open(ctx, cfg, opts))
		},
		Attach: func(ctx context.Context, cfg strategy.Config) (strategy.Deployment, error) {
			return asDeployment(Attach(ctx, cfg, opts))
		},
	}
}

func asDeployment(d *Deployment, err error) (strategy.Deployment, error) {
	if err != nil {
		return nil, err
	}
	return d, nil
}

//go:embed schema.sql
var schemaSQL string

// DefaultMaxAttempts bounds the SERIALIZABLE attempts of one Reserve.
//
// Why a bound of 64: PostgreSQL aborts a transaction for a dangerous
// structure only once another transaction in it has committed ("safe
// retry", src/backend/storage/lmgr/README-SSI), and the retry's snapshot
// sees that commit, so every lost attempt stands for a reservation of the
// same SKU (or of one whose index entries share a page) that committed
// meanwhile. An attempt loses at most about as often as such reservations
// commit while it runs, and the jittered backoff below spreads the losers
// of one round over the next ones. The kit's hardest race on one SKU (120
// requests for 40 units through 32 connections, and the storms behind its
// gate) needed at most a dozen attempts; 64, at most about a second of
// backoff, leaves room for a slower machine and still turns a livelock
// into an error the caller resolves with Lookup, instead of a request that
// never returns. The one livelock met so far is the commit-timeout
// scenario's: a COMMIT waiting for a synchronous standby has committed but
// is not yet visible, so safe retry does not hold, and every attempt that
// conflicts with it fails until the standby answers.
const DefaultMaxAttempts = 64

// Backoff between attempts: a random wait in [0, min(backoffCap,
// backoffBase·2^(attempt-1))) ("full jitter"), so the losers of one round do
// not all collide again in the next.
const (
	backoffBase = 250 * time.Microsecond
	backoffCap  = 16 * time.Millisecond
)

const (
	// lockSchemaSQL serialises schema creation between deployments that
	// open at once (CREATE TABLE IF NOT EXISTS is not safe concurrently).
	lockSchemaSQL = `SELECT pg_advisory_xact_lock(hashtext('ssicount_schema'))`

	insertStockSQL = `INSERT INTO ssicount_stock (sku, total) VALUES ($1, $2) ON CONFLICT (sku) DO NOTHING`

	loadedStockSQL = `SELECT sku, total FROM ssicount_stock WHERE sku = ANY($1)`

	lookupSQL = `SELECT user_id, sku, status, expires_at FROM ssicount_reservation WHERE request_key = $1`

	// countSQL is the read SSI protects: the SKU's active rows (through
	// ssicount_active_by_sku) and whether the user holds one of them.
	countSQL = `
		SELECT s.total,
		       (SELECT count(*) FROM ssicount_reservation r
		         WHERE r.sku = s.sku AND r.status IN ('HELD', 'CONFIRMED')),
		       EXISTS (SELECT 1 FROM ssicount_reservation r
		         WHERE r.sku = s.sku AND r.user_id = $2 AND r.status IN ('HELD', 'CONFIRMED'))
		FROM ssicount_stock s WHERE s.sku = $1`

	insertSQL = `
		INSERT INTO ssicount_reservation (request_key, user_id, sku, status, expires_at)
		VALUES ($1, $2, $3, 'HELD', now() + $4::interval)
		RETURNING expires_at`

	confirmSQL = `
		UPDATE ssicount_reservation SET status = 'CONFIRMED'
		WHERE request_key = $1 AND sku = ANY($3) AND status = 'HELD' AND ($2 OR expires_at >= now())`

	releaseSQL = `
		UPDATE ssicount_reservation SET status = 'RELEASED'
		WHERE request_key = $1 AND sku = ANY($2) AND status = 'HELD'`

	expireSQL = `
		UPDATE ssicount_reservation SET status = 'EXPIRED'
		WHERE sku = ANY($1) AND status = 'HELD' AND expires_at < now()`

	makeDueSQL = `
		UPDATE ssicount_reservation SET expires_at = now() - interval '400 days'
		WHERE request_key = ANY($1) AND sku = ANY($2) AND status = 'HELD'`

	auditSQL = `
		SELECT s.sku, s.total,
		       (SELECT count(*) FROM ssicount_reservation r
		         WHERE r.sku = s.sku AND r.status IN ('HELD', 'CONFIRMED'))
		FROM ssicount_stock s WHERE s.sku = ANY($1) ORDER BY s.sku`
)

// Open creates the schema if needed and loads the stock of cfg, in one
// transaction: either every SKU is loaded or none is.
func Open(ctx context.Context, cfg strategy.Config, opts Options) (*Deployment, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	err := pgx.BeginFunc(ctx, cfg.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockSchemaSQL); err != nil {
			return fmt.Errorf("lock schema: %w", err)
		}
		if _, err := tx.Exec(ctx, schemaSQL); err != nil {
			return fmt.Errorf("create schema: %w", err)
		}
		for _, s := range cfg.Stock {
			tag, err := tx.Exec(ctx, insertStockSQL, s.SKU, s.Total)
			if err != nil {
				return fmt.Errorf("insert stock %s: %w", s.SKU, err)
			}
			if tag.RowsAffected() == 0 {
				return fmt.Errorf("%w: %s", strategy.ErrStockExists, s.SKU)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ssicount: open: %w", err)
	}
	return newDeployment(cfg, opts), nil
}

// Attach opens a deployment over stock another process loaded with the same
// Config (Meta.Attach). It writes nothing.
func Attach(ctx context.Context, cfg strategy.Config, opts Options) (*Deployment, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	loaded := map[string]int{}
	rows, err := cfg.DB.Query(ctx, loadedStockSQL, cfg.SKUs())
	if err == nil {
		var sku string
		var total int
		_, err = pgx.ForEachRow(rows, []any{&sku, &total}, func() error { loaded[sku] = total; return nil })
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table: nothing was ever loaded
		err = nil
	}
	if err != nil {
		return nil, fmt.Errorf("ssicount: attach: %w", err)
	}
	for _, s := range cfg.Stock {
		total, ok := loaded[s.SKU]
		if !ok {
			return nil, fmt.Errorf("ssicount: attach: %w: sku %q has no stock", strategy.ErrConfig, s.SKU)
		}
		if total != s.Total {
			return nil, fmt.Errorf("ssicount: attach: %w: sku %q was loaded with %d units, not %d", strategy.ErrConfig, s.SKU, total, s.Total)
		}
	}
	return newDeployment(cfg, opts), nil
}

var (
	_ strategy.Deployment = (*Deployment)(nil)
	_ strategy.Restarter  = (*Deployment)(nil)
	_ strategy.Ager       = (*Deployment)(nil)
	_ strategy.Strategy   = (*node)(nil)
	_ strategy.Confirmer  = (*node)(nil)
	_ strategy.Releaser   = (*node)(nil)
	_ strategy.Expirer    = (*node)(nil)
	// Deliberately not strategy.SessionOpener nor strategy.ExpirySessionOpener.
)

// Deployment keeps nothing in memory but its config: every node is a handle
// on the pool, and a restart loses nothing.
type Deployment struct {
	db          *pgxpool.Pool
	skus        []string
	known       map[string]bool
	maxAttempts int

	mu    sync.Mutex
	nodes []*node
}

func newDeployment(cfg strategy.Config, opts Options) *Deployment {
	d := &Deployment{db: cfg.DB, skus: cfg.SKUs(), known: map[string]bool{}, maxAttempts: opts.MaxAttempts}
	if d.maxAttempts <= 0 {
		d.maxAttempts = DefaultMaxAttempts
	}
	for _, sku := range d.skus {
		d.known[sku] = true
	}
	for range cfg.NodeCount() {
		d.nodes = append(d.nodes, &node{d: d})
	}
	return d
}

// Node returns node i; an i out of range panics (strategy.CheckNode).
func (d *Deployment) Node(i int) strategy.Strategy {
	strategy.CheckNode(i, len(d.nodes))
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.nodes[i]
}

// Restart replaces node i: the old one answers strategy.ErrNodeClosed.
func (d *Deployment) Restart(_ context.Context, i int) error {
	if i < 0 || i >= len(d.nodes) {
		return fmt.Errorf("ssicount: restart: %w: node %d of %d", strategy.ErrNodeRange, i, len(d.nodes))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nodes[i].closed.Store(true)
	d.nodes[i] = &node{d: d}
	return nil
}

// Close closes every node; the data stays.
func (d *Deployment) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, n := range d.nodes {
		n.closed.Store(true)
	}
	return nil
}

// Audit reports total, active and the derived available (total - active)
// of each SKU of the deployment.
func (d *Deployment) Audit(ctx context.Context) ([]strategy.StockAudit, error) {
	rows, err := d.db.Query(ctx, auditSQL, d.skus)
	if err != nil {
		return nil, fmt.Errorf("ssicount: audit: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (strategy.StockAudit, error) {
		var a strategy.StockAudit
		err := r.Scan(&a.SKU, &a.Total, &a.Active)
		a.Available = a.Total - a.Active // no counter: available is derived
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("ssicount: audit: %w", err)
	}
	return list, nil
}

// MakeDue moves expires_at of these HELD reservations into the past.
func (d *Deployment) MakeDue(ctx context.Context, keys []string) (int, error) {
	stored := make([]string, 0, len(keys))
	for _, k := range keys {
		if strategy.Storable(k) {
			stored = append(stored, k)
		}
	}
	tag, err := d.db.Exec(ctx, makeDueSQL, stored, d.skus)
	if err != nil {
		return 0, fmt.Errorf("ssicount: make due: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

type node struct {
	d      *Deployment
	closed atomic.Bool
}

// alive is the first thing every node method checks: a node that was
// restarted, or whose deployment was closed, answers strategy.ErrNodeClosed.
func (n *node) alive() error {
	if n.closed.Load() {
		return fmt.Errorf("ssicount: %w", strategy.ErrNodeClosed)
	}
	return nil
}

// Reserve runs the decision in a SERIALIZABLE transaction and runs it again
// when PostgreSQL aborts it for a conflict, at most Options.MaxAttempts times.
func (n *node) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if err := n.alive(); err != nil {
		return strategy.Result{}, err
	}
	if err := req.Validate(); err != nil {
		return strategy.BadRequest(err)
	}
	if !n.d.known[req.SKU] {
		return strategy.BadRequest(strategy.UnknownSKU(req.SKU))
	}
	var err error
	for attempt := 1; ; attempt++ {
		var res strategy.Result
		res, err = n.d.reserveOnce(ctx, req)
		if err == nil {
			attempts.observe(attempt)
			return res, nil
		}
		if !retryable(err) || attempt == n.d.maxAttempts || pause(ctx, attempt) != nil {
			attempts.observe(attempt)
			return strategy.Result{}, fmt.Errorf("ssicount: reserve %s (attempt %d of %d): %w", req.Key, attempt, n.d.maxAttempts, err)
		}
	}
}

// reserveOnce is one attempt: one SERIALIZABLE transaction, committed if
// the decision needs no retry.
func (d *Deployment) reserveOnce(ctx context.Context, req strategy.Request) (res strategy.Result, err error) {
	err = pgx.BeginTxFunc(ctx, d.db, pgx.TxOptions{IsoLevel: pgx.Serializable}, func(tx pgx.Tx) error {
		var derr error
		res, derr = decide(ctx, tx, req)
		return derr
	})
	return res, err
}

// decide is the whole reservation, inside a SERIALIZABLE transaction.
func decide(ctx context.Context, tx pgx.Tx, req strategy.Request) (strategy.Result, error) {
	if known, err := lookup(ctx, tx, req.Key); err != nil {
		return strategy.Result{}, err
	} else if known.Status != strategy.StatusNotFound {
		return answerKnownKey(known, req), nil
	}
	var total, active int
	var holds bool
	if err := tx.QueryRow(ctx, countSQL, req.SKU, req.User).Scan(&total, &active, &holds); err != nil {
		return strategy.Result{}, err
	}
	if holds {
		return strategy.Result{Outcome: strategy.OutcomeUserLimit}, nil
	}
	if active >= total {
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil
	}
	var expires time.Time
	if err := tx.QueryRow(ctx, insertSQL, req.Key, req.User, req.SKU, req.TTL).Scan(&expires); err != nil {
		return strategy.Result{}, err // 40001 or 23505: retried on a fresh snapshot
	}
	return strategy.Result{Outcome: strategy.OutcomeHeld, Reservation: strategy.Reservation{
		Key: req.Key, User: req.User, SKU: req.SKU, Status: strategy.StatusHeld, ExpiresAt: expires,
	}}, nil
}

// retryable: a serialization failure (40001), a deadlock (40P01), or a
// unique violation (23505), which PostgreSQL raises only once the other
// row's transaction has committed, so the next snapshot sees that row.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "40001", "40P01", "23505":
		return true
	}
	return false
}

// pause waits before attempt+1, or returns ctx's error.
func pause(ctx context.Context, attempt int) error {
	limit := min(backoffCap, backoffBase<<min(attempt-1, 16))
	t := time.NewTimer(rand.N(limit))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func answerKnownKey(known strategy.Reservation, req strategy.Request) strategy.Result {
	if known.User != req.User || known.SKU != req.SKU {
		return strategy.Result{Outcome: strategy.OutcomeKeyReused, Reservation: known}
	}
	return strategy.Result{Outcome: strategy.OutcomeReplay, Reservation: known}
}

func lookup(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, key string) (strategy.Reservation, error) {
	r := strategy.Reservation{Key: key}
	err := q.QueryRow(ctx, lookupSQL, key).Scan(&r.User, &r.SKU, &r.Status, &r.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, nil
	}
	return r, err
}

func (n *node) Lookup(ctx context.Context, key string) (strategy.Reservation, error) {
	if err := n.alive(); err != nil {
		return strategy.Reservation{}, err
	}
	if !strategy.Storable(key) { // never stored; the query would fail on the encoding
		return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, nil
	}
	r, err := lookup(ctx, n.d.db, key)
	if err != nil {
		return r, fmt.Errorf("ssicount: lookup %s: %w", key, err)
	}
	return r, nil
}

func (n *node) Confirm(ctx context.Context, key string, mode strategy.ConfirmMode) (bool, error) {
	if err := n.alive(); err != nil {
		return false, err
	}
	if !strategy.Storable(key) {
		return false, nil
	}
	tag, err := n.d.db.Exec(ctx, confirmSQL, key, mode == strategy.ConfirmUntilExpired, n.d.skus)
	if err != nil {
		return false, fmt.Errorf("ssicount: confirm %s: %w", key, err)
	}
	return tag.RowsAffected() == 1, nil
}

func (n *node) Release(ctx context.Context, key string) (int, error) {
	if err := n.alive(); err != nil {
		return 0, err
	}
	if !strategy.Storable(key) {
		return 0, nil
	}
	tag, err := n.d.db.Exec(ctx, releaseSQL, key, n.d.skus)
	if err != nil {
		return 0, fmt.Errorf("ssicount: release %s: %w", key, err)
	}
	return int(tag.RowsAffected()), nil
}

// ExpireDue counts only the rows this statement moved (its row count).
func (n *node) ExpireDue(ctx context.Context) (int, error) {
	if err := n.alive(); err != nil {
		return 0, err
	}
	tag, err := n.d.db.Exec(ctx, expireSQL, n.d.skus)
	if err != nil {
		return 0, fmt.Errorf("ssicount: expire: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// attempts records how many attempts Reserve calls needed, for the package's
// own tests (the retry bound is a claim about them).
var attempts attemptStats

type attemptStats struct {
	mu    sync.Mutex
	max   int
	hist  map[int]int
	calls int
}

func (s *attemptStats) observe(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hist == nil {
		s.hist = map[int]int{}
	}
	s.calls++
	s.hist[n]++
	s.max = max(s.max, n)
}
