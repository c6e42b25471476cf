package rediscounter

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/reservebench/reservebench/strategy"
)

// The transitions move the row in PostgreSQL first (WHERE status = 'HELD',
// RETURNING what moved) and mark it unit_owed in the same UPDATE, then
// give each moved row's unit back in Redis with giveBackScript, which
// returns a unit only for a key still marked. A crash between the two, or
// an UPDATE whose COMMIT outlived its caller's deadline, leaves the unit
// out of the counter (the row is no longer active, the counter not
// raised) until the expiry job's next run, which gives back the unit of
// every row still marked unit_owed and clears the mark (ExpireDue), or,
// for a release, until it is sent again (Release gives back a unit still
// owed for a row already moved). Before the job did that, an expiry whose
// caller gave up at COMMIT lost its unit for good: the kit's commit-timeout
// scenario showed it.
const (
	sqlConfirm = `
UPDATE rediscounter_reservation SET status = 'CONFIRMED', updated_at = now()
WHERE request_key = $1 AND sku = ANY($2) AND status = 'HELD' AND ($3 OR expires_at >= now())`

	// sqlUndoRelease is the mistake UndoReleaseOnError's undo.
	sqlUndoRelease = `
UPDATE rediscounter_reservation SET status = 'HELD', updated_at = now()
WHERE request_key = $1 AND sku = ANY($2) AND status = 'RELEASED'`

	sqlRelease = `
UPDATE rediscounter_reservation SET status = 'RELEASED', unit_owed = true, updated_at = now()
WHERE request_key = $1 AND sku = ANY($2) AND status = 'HELD'
RETURNING sku, request_key, user_id`

	// sqlReleaseNotOwed is sqlRelease with the mistake ReleaseNotOwed.
	sqlReleaseNotOwed = `
UPDATE rediscounter_reservation SET status = 'RELEASED', updated_at = now()
WHERE request_key = $1 AND sku = ANY($2) AND status = 'HELD'
RETURNING sku, request_key, user_id`

	// sqlReleased finds the row of a key that a transition already moved
	// out of the active statuses: a Release sent again after an unknown
	// outcome (its UPDATE committed, the answer and the unit's return to
	// Redis never came) gives the unit back then, since giveBackScript
	// returns a unit only for a key still marked.
	sqlReleased = `
SELECT sku, request_key, user_id FROM rediscounter_reservation
WHERE request_key = $1 AND sku = ANY($2) AND status IN ('RELEASED', 'EXPIRED')`

	// sqlExpireDue moves the due rows and returns them (moved true) with
	// the rows moved before whose unit may still be owed (moved false):
	// the UPDATE's rows are not in the snapshot the second SELECT reads, so
	// no row comes twice.
	sqlExpireDue = `
WITH moved AS (
  UPDATE rediscounter_reservation SET status = 'EXPIRED', unit_owed = true, updated_at = now()
  WHERE sku = ANY($1) AND status = 'HELD' AND expires_at < now()
  RETURNING sku, request_key, user_id)
SELECT sku, request_key, user_id, true FROM moved
UNION ALL
SELECT sku, request_key, user_id, false FROM rediscounter_reservation
WHERE sku = ANY($1) AND unit_owed AND status IN ('RELEASED', 'EXPIRED')`

	// sqlGivenBack clears unit_owed on rows whose units giveBackScript has
	// settled (returned now, or before: the marker was gone). Concurrent
	// jobs may clear the same rows; a row another is clearing is skipped,
	// not waited for, so two jobs never wait for each other here (two
	// UPDATEs that met the rows in different orders deadlocked in
	// expiry-race).
	sqlGivenBack = `
UPDATE rediscounter_reservation SET unit_owed = false
WHERE request_key IN (
  SELECT request_key FROM rediscounter_reservation
  WHERE request_key = ANY($1) AND unit_owed
  FOR NO KEY UPDATE SKIP LOCKED)`

	sqlMakeDue = `
UPDATE rediscounter_reservation SET expires_at = now() - interval '400 days'
WHERE request_key = ANY($1) AND sku = ANY($2) AND status = 'HELD'`

	sqlAudit = `
SELECT s.sku, s.total,
       (SELECT count(*)::int FROM rediscounter_reservation r WHERE r.sku = s.sku AND r.status IN ('HELD','CONFIRMED'))
FROM rediscounter_stock s WHERE s.sku = ANY($1) ORDER BY s.sku`
)

// returned is a row a transition moved out of the active statuses.
type returned struct{ sku, key, user string }

func scanReturned(rows pgx.Rows) ([]returned, error) {
	var out []returned
	var r returned
	_, err := pgx.ForEachRow(rows, []any{&r.sku, &r.key, &r.user}, func() error {
		out = append(out, r)
		return nil
	})
	return out, err
}

// giveBack returns the units of these rows in Redis, each once, and says
// how many it returned.
func (d *Deployment) giveBack(ctx context.Context, rows []returned) (int, error) {
	script := giveBackScript
	if d.mistake == GiveBackByUser {
		script = giveBackByUserScript
	}
	n := 0
	for _, r := range rows {
		got, err := script.Run(ctx, d.rdb, d.keys(r.sku), r.key, r.user).Int()
		if err != nil {
			return n, fmt.Errorf("give back %q: %w", r.key, err)
		}
		n += got
	}
	return n, nil
}

// Confirm moves the reservation from HELD to CONFIRMED (PostgreSQL only:
// the unit stays taken).
func (n *node) Confirm(ctx context.Context, key string, mode strategy.ConfirmMode) (bool, error) {
	if ok, err := n.CheckKey(key); !ok {
		return false, err
	}
	tag, err := n.d.db.Exec(ctx, sqlConfirm, key, n.d.skus, mode == strategy.ConfirmUntilExpired)
	if err != nil {
		return false, fmt.Errorf("%s: confirm %q: %w", Name, key, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Release moves the reservation from HELD to RELEASED, then gives its unit
// back in Redis; it returns 1 if this call moved the row.
func (n *node) Release(ctx context.Context, key string) (int, error) {
	if ok, err := n.CheckKey(key); !ok {
		return 0, err
	}
	release := sqlRelease
	if n.d.mistake == ReleaseNotOwed {
		release = sqlReleaseNotOwed
	}
	rows, err := n.d.db.Query(ctx, release, key, n.d.skus)
	if err != nil {
		return 0, fmt.Errorf("%s: release %q: %w", Name, key, err)
	}
	moved, err := scanReturned(rows)
	if err != nil {
		return 0, fmt.Errorf("%s: release %q: %w", Name, key, err)
	}
	gaveBack, err := n.d.giveBack(ctx, moved)
	if err != nil {
		if n.d.mistake == UndoReleaseOnError {
			_, _ = n.d.db.Exec(ctx, sqlUndoRelease, key, n.d.skus)
		}
		return 0, fmt.Errorf("%s: release %q: the row moved, the unit did not come back: %w", Name, key, err)
	}
	if len(moved) == 0 {
		// Moved before, perhaps by a call whose outcome its client never
		// learned: a unit still owed to Redis comes back now. This call
		// moved nothing, so it reports 0.
		rows, err := n.d.db.Query(ctx, sqlReleased, key, n.d.skus)
		if err != nil {
			return 0, fmt.Errorf("%s: release %q: %w", Name, key, err)
		}
		owed, err := scanReturned(rows)
		if err != nil {
			return 0, fmt.Errorf("%s: release %q: %w", Name, key, err)
		}
		back, err := n.d.giveBack(ctx, owed)
		if err != nil {
			return 0, fmt.Errorf("%s: release %q: the unit still owed did not come back: %w", Name, key, err)
		}
		if n.d.mistake == ReleaseCountsOwed {
			return back, nil
		}
	}
	if n.d.mistake == ReleaseAnswersGiveBacks {
		return gaveBack, nil
	}
	if n.d.mistake == ReleaseRecounts && n.d.keep == KeepRecover {
		for _, r := range moved {
			if err := n.d.load(ctx, r.sku, true, ""); err != nil {
				return len(moved), fmt.Errorf("%s: release %q: %w", Name, key, err)
			}
		}
	}
	return len(moved), nil
}

// ExpireDue moves every due HELD reservation to EXPIRED and gives the
// units back in Redis, with those of rows moved before whose give-back may
// not have happened (unit_owed); the count is of the rows it moved now.
func (n *node) ExpireDue(ctx context.Context) (int, error) {
	if err := n.Check(); err != nil {
		return 0, err
	}
	if n.d.mistake == ExpireGiveBackInTx {
		return n.expireGiveBackInTx(ctx)
	}
	rows, err := n.d.db.Query(ctx, sqlExpireDue, n.d.skus)
	if err != nil {
		return 0, fmt.Errorf("%s: expire due: %w", Name, err)
	}
	var owed []returned // the rows moved now first, then those moved before
	var r returned
	var now bool
	moved := 0
	_, err = pgx.ForEachRow(rows, []any{&r.sku, &r.key, &r.user, &now}, func() error {
		if now {
			moved++
		} else if n.d.mistake == OwedNeverSwept || n.d.mistake == ExpireCountsOnly || n.d.mistake == BatchGiveBack {
			return nil
		}
		owed = append(owed, r)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("%s: expire due: %w", Name, err)
	}
	if n.d.mistake == ExpireCountsOnly {
		for _, r := range owed {
			if err := n.d.rdb.IncrBy(ctx, n.d.keys(r.sku)[0], 1).Err(); err != nil {
				return 0, fmt.Errorf("%s: expire due: %w", Name, err)
			}
		}
		return moved, nil
	}
	if n.d.mistake == BatchGiveBack {
		return moved, n.d.giveBackBatch(ctx, owed)
	}
	done, err := n.d.giveBackUntilError(ctx, owed)
	if n.d.mistake == OwedClearedTried {
		done = done[:0]
		for _, r := range owed {
			done = append(done, r.key)
		}
	}
	if len(done) > 0 {
		// A failure here leaves rows marked whose units are back: the next
		// run gives each back again, which its marker makes a no-op, and
		// clears it. It does not make this run's answer wrong.
		_, _ = n.d.db.Exec(ctx, sqlGivenBack, done)
	}
	if err != nil {
		return 0, fmt.Errorf("%s: expire due: %d rows moved, not every unit owed came back (the next run gives back the rest): %w", Name, moved, err)
	}
	if n.d.mistake == ExpiryRecounts && n.d.keep == KeepRecover {
		for _, sku := range n.d.skus {
			if err := n.d.load(ctx, sku, true, ""); err != nil {
				return moved, fmt.Errorf("%s: expire due: %w", Name, err)
			}
		}
	}
	return moved, nil
}

// expireGiveBackInTx is ExpireGiveBackInTx's expiry job: the rows moved,
// their units given back and unit_owed cleared, then one COMMIT.
func (n *node) expireGiveBackInTx(ctx context.Context) (int, error) {
	tx, err := n.d.db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("%s: expire due: %w", Name, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(ctx, sqlExpireDue, n.d.skus)
	if err != nil {
		return 0, fmt.Errorf("%s: expire due: %w", Name, err)
	}
	var owed []returned
	var r returned
	var now bool
	moved := 0
	if _, err := pgx.ForEachRow(rows, []any{&r.sku, &r.key, &r.user, &now}, func() error {
		if now {
			moved++
		}
		owed = append(owed, r)
		return nil
	}); err != nil {
		return 0, fmt.Errorf("%s: expire due: %w", Name, err)
	}
	done, err := n.d.giveBackUntilError(ctx, owed)
	if err != nil {
		return 0, fmt.Errorf("%s: expire due: %w", Name, err)
	}
	if len(done) > 0 {
		if _, err := tx.Exec(ctx, sqlGivenBack, done); err != nil {
			return 0, fmt.Errorf("%s: expire due: %w", Name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("%s: expire due: commit: %w", Name, err)
	}
	return moved, nil
}

// giveBackUntilError gives back the units of rows in order until one
// fails (Redis is then likely away: each further call would wait out its
// own timeout, and the rows left stay owed for the next run), and returns
// the keys whose units are settled.
func (d *Deployment) giveBackUntilError(ctx context.Context, rows []returned) ([]string, error) {
	var done []string
	for _, r := range rows {
		if _, err := d.giveBack(ctx, []returned{r}); err != nil {
			return done, err
		}
		done = append(done, r.key)
	}
	return done, nil
}

// MakeDue moves expires_at of these HELD reservations into the past.
func (d *Deployment) MakeDue(ctx context.Context, keys []string) (int, error) {
	tag, err := d.db.Exec(ctx, sqlMakeDue, keys, d.skus)
	if err != nil {
		return 0, fmt.Errorf("%s: make due: %w", Name, err)
	}
	return int(tag.RowsAffected()), nil
}

// Audit reports the total and the active reservations from PostgreSQL and
// the available units from the Redis counter.
func (d *Deployment) Audit(ctx context.Context) ([]strategy.StockAudit, error) {
	rows, err := d.db.Query(ctx, sqlAudit, d.skus)
	if err != nil {
		return nil, fmt.Errorf("%s: audit: %w", Name, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (strategy.StockAudit, error) {
		var a strategy.StockAudit
		err := r.Scan(&a.SKU, &a.Total, &a.Active)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: audit: %w", Name, err)
	}
	for i := range out {
		v, err := d.counter(ctx, out[i].SKU)
		if err != nil {
			return nil, fmt.Errorf("%s: audit: %w", Name, err)
		}
		out[i].Available = v
	}
	return out, nil
}

// counter reads the counter of sku. A missing one (Redis restarted without
// it) is first loaded the way the next request would load it, so the audit
// shows what the strategy will count as free.
func (d *Deployment) counter(ctx context.Context, sku string) (int, error) {
	for attempt := 0; ; attempt++ {
		v, err := d.rdb.Get(ctx, d.keys(sku)[0]).Int()
		if err == nil || !errors.Is(err, redis.Nil) || attempt > 0 {
			if err != nil {
				return 0, fmt.Errorf("counter of %q: %w", sku, err)
			}
			return v, nil
		}
		if err := d.load(ctx, sku, false, ""); err != nil {
			return 0, err
		}
	}
}

// giveBackBatch is Mistake BatchGiveBack: one giveBackBatchScript per SKU.
func (d *Deployment) giveBackBatch(ctx context.Context, rows []returned) error {
	bySKU := map[string][]any{}
	for _, r := range rows {
		bySKU[r.sku] = append(bySKU[r.sku], r.key, r.user)
	}
	for sku, args := range bySKU {
		if err := giveBackBatchScript.Run(ctx, d.rdb, d.keys(sku), args...).Err(); err != nil {
			return fmt.Errorf("%s: expire due: give back %q: %w", Name, sku, err)
		}
	}
	return nil
}
