package compare_test

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/compare"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

// The negative controls of seed 000 (C28-10..C28-12): strategy A with one
// deliberate mistake each, claiming everything A claims. The harness must
// catch each with the right verdict; they exist only in this test binary.
//
// What decides a write must be a condition the database evaluates at the
// moment of writing (a WHERE clause, a unique index). Each control moves that
// condition somewhere else: it is missing (C28-10), in another transaction
// (C28-11), or evaluated before the write (C28-12).

type breakage int

const (
	// releaseWithoutStatusCheck (C28-10): the expiry job selects due rows
	// without status = 'HELD' and returns one unit per id it read.
	releaseWithoutStatusCheck breakage = iota
	// splitRelease (C28-11): the expiry job returns stock in one transaction
	// and moves the status in a second one; the first run dies between them
	// and is rerun.
	splitRelease
	// checkThenInsert (C28-12): the per-user limit is a SELECT before the
	// INSERT, with no partial unique index behind it.
	checkThenInsert
)

// controls are the negative controls and the violations each must produce.
func controls() []*compare.ControlReport {
	mk := func(name, cs, breaks string, b breakage, expect ...compare.Expectation) *compare.ControlReport {
		return &compare.ControlReport{
			StrategyReport: &compare.StrategyReport{Meta: controlMeta(name, b)},
			Case:           cs, Breaks: breaks, Expect: expect,
		}
	}
	return []*compare.ControlReport{
		mk("ctl-release-no-status-check", "C28-10",
			"the expiry job reads due ids without status = 'HELD' and returns one unit per id read",
			releaseWithoutStatusCheck,
			compare.Expectation{Scenario: "expiry-replay", Claim: strategy.ReturnOnce},
			compare.Expectation{Scenario: "expiry-replay", Claim: strategy.Conserves}),
		mk("ctl-split-release", "C28-11",
			"the expiry job returns stock in one transaction and moves status in another; it dies between them and is rerun",
			splitRelease,
			compare.Expectation{Scenario: "expiry-replay", Claim: strategy.ReturnOnce},
			compare.Expectation{Scenario: "kill-release", Claim: strategy.ReturnOnce}),
		mk("ctl-check-then-insert", "C28-12",
			"the one-per-user rule is a SELECT before the INSERT, without the partial unique index",
			checkThenInsert,
			compare.Expectation{Scenario: "same-user", Claim: strategy.OneActivePerUser}),
	}
}

// The controls run in helper processes too (the kill scenarios), which find
// strategies by name.
func init() {
	for _, c := range controls() {
		strategytest.RegisterForHelpers(c.Meta)
	}
}

//go:embed testdata/control_schema.sql
var controlSchema string

const controlUserIndex = `CREATE UNIQUE INDEX IF NOT EXISTS ctl_reservation_one_active ON ctl_reservation (sku, user_id) WHERE status IN ('HELD','CONFIRMED')`

func controlMeta(name string, b breakage) strategy.Meta {
	return strategy.Meta{
		Name:        name,
		Description: "negative control: strategy A with one deliberate mistake",
		Correctness: "none: it claims what it cannot keep",
		Claims: strategy.NoOversell | strategy.IdempotentKey | strategy.OneActivePerUser | strategy.ReturnOnce |
			strategy.Conserves | strategy.NoPhantomSoldOut | strategy.SurvivesRestart,
		Open: func(ctx context.Context, cfg strategy.Config) (strategy.Deployment, error) {
			if err := cfg.Validate(); err != nil {
				return nil, err
			}
			if cfg.Attach {
				var n int
				if err := cfg.DB.QueryRow(ctx, `SELECT count(*) FROM ctl_stock WHERE sku = ANY($1)`, cfg.SKUs()).Scan(&n); err != nil {
					return nil, err
				}
				if n != len(cfg.Stock) {
					return nil, fmt.Errorf("%w: attach: %d of %d SKUs have stock", strategy.ErrConfig, n, len(cfg.Stock))
				}
				return &control{db: cfg.DB, skus: cfg.SKUs(), breaks: b}, nil
			}
			err := pgx.BeginFunc(ctx, cfg.DB, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(2810)`); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, controlSchema); err != nil {
					return err
				}
				if b != checkThenInsert {
					if _, err := tx.Exec(ctx, controlUserIndex); err != nil {
						return err
					}
				}
				for _, s := range cfg.Stock {
					tag, err := tx.Exec(ctx, `INSERT INTO ctl_stock (sku, total, available) VALUES ($1, $2, $2) ON CONFLICT DO NOTHING`, s.SKU, s.Total)
					if err != nil {
						return err
					}
					if tag.RowsAffected() == 0 {
						return fmt.Errorf("%w: %s", strategy.ErrStockExists, s.SKU)
					}
				}
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("%s: open: %w", name, err)
			}
			return &control{db: cfg.DB, skus: cfg.SKUs(), breaks: b}, nil
		},
	}
}

// control is deployment and node at once: it keeps nothing in memory.
type control struct {
	db           *pgxpool.Pool
	skus         []string
	breaks       breakage
	firstRunDied atomic.Bool // splitRelease: the first expiry run has died
}

var (
	_ strategy.Deployment    = (*control)(nil)
	_ strategy.Strategy      = (*control)(nil)
	_ strategy.Expirer       = (*control)(nil)
	_ strategy.SessionOpener = (*control)(nil)
	_ strategy.Ager          = (*control)(nil)
)

func (c *control) Node(int) strategy.Strategy         { return c }
func (c *control) Restart(context.Context, int) error { return nil }
func (c *control) Close() error                       { return nil }

func (c *control) Audit(ctx context.Context) ([]strategy.StockAudit, error) {
	rows, err := c.db.Query(ctx, `
		SELECT s.sku, s.total, s.available,
		       (SELECT count(*) FROM ctl_reservation r WHERE r.sku = s.sku AND r.status IN ('HELD','CONFIRMED'))
		FROM ctl_stock s WHERE s.sku = ANY($1) ORDER BY s.sku`, c.skus)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (strategy.StockAudit, error) {
		var a strategy.StockAudit
		err := r.Scan(&a.SKU, &a.Total, &a.Available, &a.Active)
		return a, err
	})
}

func (c *control) MakeDue(ctx context.Context, keys []string) (int, error) {
	tag, err := c.db.Exec(ctx, `UPDATE ctl_reservation SET expires_at = now() - interval '1 second' WHERE request_key = ANY($1) AND status = 'HELD'`, keys)
	return int(tag.RowsAffected()), err
}

func (c *control) Lookup(ctx context.Context, key string) (strategy.Reservation, error) {
	return lookupIn(ctx, c.db, key)
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func lookupIn(ctx context.Context, q querier, key string) (strategy.Reservation, error) {
	r := strategy.Reservation{Key: key}
	err := q.QueryRow(ctx, `SELECT user_id, sku, status, expires_at FROM ctl_reservation WHERE request_key = $1`, key).
		Scan(&r.User, &r.SKU, &r.Status, &r.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, nil
	}
	return r, err
}

func (c *control) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if err := req.Validate(); err != nil {
		return strategy.BadRequest(err)
	}
	var res strategy.Result
	err := pgx.BeginFunc(ctx, c.db, func(tx pgx.Tx) error {
		var err error
		res, err = c.reserveIn(ctx, tx, req)
		return err
	})
	return res, err
}

func (c *control) reserveIn(ctx context.Context, tx pgx.Tx, req strategy.Request) (strategy.Result, error) {
	if c.breaks == checkThenInsert {
		var has bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM ctl_reservation WHERE sku = $1 AND user_id = $2 AND status IN ('HELD','CONFIRMED'))`,
			req.SKU, req.User).Scan(&has); err != nil {
			return strategy.Result{}, err
		}
		if has {
			return strategy.Result{Outcome: strategy.OutcomeUserLimit}, nil
		}
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return strategy.Result{}, err
	}
	var expires time.Time
	err = sp.QueryRow(ctx, `
		INSERT INTO ctl_reservation (request_key, user_id, sku, status, expires_at)
		VALUES ($1, $2, $3, 'HELD', now() + $4::interval)
		ON CONFLICT (request_key) DO NOTHING RETURNING expires_at`,
		req.Key, req.User, req.SKU, req.TTL).Scan(&expires)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && pgErr.Code == "23505":
		_ = sp.Rollback(ctx)
		existing, lerr := lookupIn(ctx, tx, req.Key)
		switch {
		case lerr != nil:
			return strategy.Result{}, lerr
		case existing.Status == strategy.StatusNotFound:
			return strategy.Result{Outcome: strategy.OutcomeUserLimit}, nil
		case existing.User != req.User || existing.SKU != req.SKU:
			return strategy.Result{Outcome: strategy.OutcomeKeyReused, Reservation: existing}, nil
		}
		return strategy.Result{Outcome: strategy.OutcomeReplay, Reservation: existing}, nil
	case errors.As(err, &pgErr) && pgErr.Code == "23503":
		_ = sp.Rollback(ctx)
		return strategy.BadRequest(strategy.UnknownSKU(req.SKU))
	case err != nil:
		return strategy.Result{}, err
	}
	tag, err := sp.Exec(ctx, `UPDATE ctl_stock SET available = available - 1 WHERE sku = $1 AND available > 0`, req.SKU)
	if err != nil {
		return strategy.Result{}, err
	}
	if tag.RowsAffected() == 0 {
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, sp.Rollback(ctx)
	}
	if err := sp.Commit(ctx); err != nil {
		return strategy.Result{}, err
	}
	return strategy.Result{Outcome: strategy.OutcomeHeld, Reservation: strategy.Reservation{
		Key: req.Key, User: req.User, SKU: req.SKU, Status: strategy.StatusHeld, ExpiresAt: expires}}, nil
}

// ExpireDue is broken in the way the control says; under checkThenInsert it
// is the correct single-statement job.
func (c *control) ExpireDue(ctx context.Context) (int, error) {
	var units int
	err := pgx.BeginFunc(ctx, c.db, func(tx pgx.Tx) error {
		var err error
		units, err = c.expireIn(ctx, tx, true)
		return err
	})
	return units, err
}

// expireIn runs the expiry job in tx. The split control commits its stock
// return on its own, outside tx: that is its mistake. In process, its first
// run dies between the two (simulateDeath); in the kill-release scenario a
// real SIGKILL does it.
func (c *control) expireIn(ctx context.Context, tx pgx.Tx, simulateDeath bool) (int, error) {
	switch c.breaks {
	case releaseWithoutStatusCheck:
		rows, err := tx.Query(ctx, `SELECT reservation_id FROM ctl_reservation WHERE sku = ANY($1) AND expires_at < now()`, c.skus)
		if err != nil {
			return 0, err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return 0, err
		}
		if _, err := tx.Exec(ctx, `UPDATE ctl_reservation SET status = 'EXPIRED' WHERE reservation_id = ANY($1)`, ids); err != nil {
			return 0, err
		}
		return len(ids), c.giveBack(ctx, tx, ids)
	case splitRelease:
		var ids []int64
		err := pgx.BeginFunc(ctx, c.db, func(first pgx.Tx) error {
			rows, err := first.Query(ctx, `SELECT reservation_id FROM ctl_reservation WHERE sku = ANY($1) AND status = 'HELD' AND expires_at < now()`, c.skus)
			if err != nil {
				return err
			}
			if ids, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
				return err
			}
			return c.giveBack(ctx, first, ids)
		})
		if err != nil {
			return 0, err
		}
		if simulateDeath && len(ids) > 0 && c.firstRunDied.CompareAndSwap(false, true) {
			return 0, errors.New("release job killed between its two transactions (simulated)")
		}
		_, err = tx.Exec(ctx, `UPDATE ctl_reservation SET status = 'EXPIRED' WHERE reservation_id = ANY($1)`, ids)
		return len(ids), err
	default:
		var units int
		err := tx.QueryRow(ctx, `
			WITH moved AS (
				UPDATE ctl_reservation SET status = 'EXPIRED'
				WHERE sku = ANY($1) AND status = 'HELD' AND expires_at < now() RETURNING sku),
			per AS (SELECT sku, count(*) AS n FROM moved GROUP BY sku),
			upd AS (UPDATE ctl_stock s SET available = s.available + per.n FROM per WHERE s.sku = per.sku RETURNING per.n)
			SELECT coalesce(sum(n), 0) FROM upd`, c.skus).Scan(&units)
		return units, err
	}
}

// giveBack returns one unit per id read, per SKU: the count comes from the
// list, not from rows a transition moved.
func (c *control) giveBack(ctx context.Context, tx pgx.Tx, ids []int64) error {
	_, err := tx.Exec(ctx, `
		UPDATE ctl_stock s SET available = s.available + per.n
		FROM (SELECT sku, count(*) AS n FROM ctl_reservation WHERE reservation_id = ANY($1) GROUP BY sku) per
		WHERE s.sku = per.sku`, ids)
	return err
}

func (c *control) OpenSession(ctx context.Context) (strategy.Session, error) {
	conn, err := c.db.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		conn.Release()
		return nil, err
	}
	return &controlSession{c: c, conn: conn, tx: tx}, nil
}

type controlSession struct {
	c    *control
	conn *pgxpool.Conn
	tx   pgx.Tx
	done bool
}

func (s *controlSession) Backends() []uint32 { return []uint32{s.conn.Conn().PgConn().PID()} }

func (s *controlSession) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if err := req.Validate(); err != nil {
		return strategy.BadRequest(err)
	}
	return s.c.reserveIn(ctx, s.tx, req)
}

// ExpireDue runs the job inside the session: the helper process of the
// kill-release scenario dies before Commit.
func (s *controlSession) ExpireDue(ctx context.Context) (int, error) {
	return s.c.expireIn(ctx, s.tx, false)
}

func (s *controlSession) end(ctx context.Context, commit bool) error {
	if s.done {
		return nil
	}
	s.done = true
	defer s.conn.Release()
	if commit {
		return s.tx.Commit(ctx)
	}
	return s.tx.Rollback(ctx)
}

func (s *controlSession) Commit(ctx context.Context) error   { return s.end(ctx, true) }
func (s *controlSession) Rollback(ctx context.Context) error { return s.end(ctx, false) }
