package slotrows

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/reservebench/reservebench/strategy"
)

// The SQL of the transitions out of HELD, the audit and MakeDue. Every
// transition carries status = 'HELD' in its WHERE clause, and each is one
// statement: the status change and the freeing of exactly the slots the
// moved reservations hold commit together or not at all, and the units are
// counted from those freed slots only (RETURNING), never from ids read
// earlier. Each is scoped to the deployment's SKUs ($2 or $1).
// Each strategy keeps its own SQL over its own tables; where the contract's
// steps are alike, so are the statements.
const (
	sqlConfirmBeforeExpiry = `
UPDATE slotrows_reservation SET status = 'CONFIRMED', updated_at = now()
WHERE request_key = $1 AND sku = ANY($2::text[]) AND status = 'HELD' AND expires_at >= now()`

	sqlConfirmUntilExpired = `
UPDATE slotrows_reservation SET status = 'CONFIRMED', updated_at = now()
WHERE request_key = $1 AND sku = ANY($2::text[]) AND status = 'HELD'`

	sqlRelease = `
WITH moved AS (
    UPDATE slotrows_reservation SET status = 'RELEASED', updated_at = now()
    WHERE request_key = $1 AND sku = ANY($2::text[]) AND status = 'HELD'
    RETURNING id
), freed AS (
    UPDATE slotrows_slot SET holder = NULL
    WHERE holder IN (SELECT id FROM moved)
    RETURNING slot_no
)
SELECT count(*) FROM freed`

	// sqlExpireDue locks the due rows with SKIP LOCKED, so concurrent runs of
	// the job (and confirmations or releases in flight) never wait for one
	// another and never deadlock: a row locked by another run is that run's
	// to move, a row locked by a confirm or a release is theirs (and if that
	// transaction fails, the next run of the job moves it). The UPDATE
	// re-checks status = 'HELD' all the same.
	sqlExpireDue = `
WITH due AS (
    SELECT id FROM slotrows_reservation
    WHERE sku = ANY($1::text[]) AND status = 'HELD' AND expires_at < now()
    FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE slotrows_reservation r SET status = 'EXPIRED', updated_at = now()
    FROM due
    WHERE r.id = due.id AND r.status = 'HELD'
    RETURNING r.id
), freed AS (
    UPDATE slotrows_slot SET holder = NULL
    WHERE holder IN (SELECT id FROM moved)
    RETURNING slot_no
)
SELECT count(*) FROM freed`

	sqlMakeDue = `
UPDATE slotrows_reservation SET expires_at = now() - interval '400 days'
WHERE request_key = ANY($1::text[]) AND sku = ANY($2::text[]) AND status = 'HELD'`

	// sqlAudit reads, in one snapshot, per SKU of the deployment: the slot
	// rows (the total), the free ones (available) and the active
	// reservations (the truth the two are checked against).
	sqlAudit = `
SELECT k.sku,
    (SELECT count(*) FROM slotrows_slot s WHERE s.sku = k.sku),
    (SELECT count(*) FROM slotrows_slot s WHERE s.sku = k.sku AND s.holder IS NULL),
    (SELECT count(*) FROM slotrows_reservation r WHERE r.sku = k.sku AND r.status IN ('HELD', 'CONFIRMED'))
FROM slotrows_sku k
WHERE k.sku = ANY($1::text[])
ORDER BY array_position($1::text[], k.sku)`
)

// Lookup returns the committed reservation with key. Keys are unique across
// the database, so this finds a key whichever deployment holds it.
func (n *node) Lookup(ctx context.Context, key string) (strategy.Reservation, error) {
	if ok, err := n.CheckKey(key); !ok {
		return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, err
	}
	r, _, err := lookupKey(ctx, n.d.db, key)
	if err != nil {
		return strategy.Reservation{}, fmt.Errorf("slotrows: lookup %q: %w", key, err)
	}
	return r, nil
}

// Confirm moves the reservation from HELD to CONFIRMED. It keeps its slot.
func (n *node) Confirm(ctx context.Context, key string, mode strategy.ConfirmMode) (bool, error) {
	if ok, err := n.CheckKey(key); !ok {
		return false, err
	}
	sql := sqlConfirmBeforeExpiry
	if mode == strategy.ConfirmUntilExpired {
		sql = sqlConfirmUntilExpired
	}
	tag, err := n.d.db.Exec(ctx, sql, key, n.d.skus)
	if err != nil {
		return false, fmt.Errorf("slotrows: confirm %q: %w", key, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Release moves the reservation from HELD to RELEASED and frees its slot.
func (n *node) Release(ctx context.Context, key string) (int, error) {
	if ok, err := n.CheckKey(key); !ok {
		return 0, err
	}
	var units int
	if err := n.d.db.QueryRow(ctx, sqlRelease, key, n.d.skus).Scan(&units); err != nil {
		return 0, fmt.Errorf("slotrows: release %q: %w", key, err)
	}
	return units, nil
}

// ExpireDue moves every due HELD reservation of the deployment to EXPIRED and
// frees their slots.
func (n *node) ExpireDue(ctx context.Context) (int, error) {
	if err := n.Check(); err != nil {
		return 0, err
	}
	return n.d.expireIn(ctx, n.d.db)
}

// expireIn runs the expiry statement on db: the pool, or a session's
// transaction.
func (d *Deployment) expireIn(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) (int, error) {
	var units int
	if err := db.QueryRow(ctx, sqlExpireDue, d.skus).Scan(&units); err != nil {
		return 0, fmt.Errorf("slotrows: expire due: %w", err)
	}
	return units, nil
}

// MakeDue moves expires_at of the deployment's HELD reservations with these
// keys 400 days into the past (strategy.Ager).
func (d *Deployment) MakeDue(ctx context.Context, keys []string) (int, error) {
	tag, err := d.db.Exec(ctx, sqlMakeDue, keys, d.skus)
	if err != nil {
		return 0, fmt.Errorf("slotrows: make due: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// Audit reports, per SKU of the deployment: Total is the number of slot rows,
// Available the free slots, Active the HELD and CONFIRMED reservations.
func (d *Deployment) Audit(ctx context.Context) ([]strategy.StockAudit, error) {
	rows, err := d.db.Query(ctx, sqlAudit, d.skus)
	if err != nil {
		return nil, fmt.Errorf("slotrows: audit: %w", err)
	}
	defer rows.Close()
	var out []strategy.StockAudit
	for rows.Next() {
		var a strategy.StockAudit
		if err := rows.Scan(&a.SKU, &a.Total, &a.Available, &a.Active); err != nil {
			return nil, fmt.Errorf("slotrows: audit: %w", err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("slotrows: audit: %w", err)
	}
	if len(out) != len(d.skus) {
		return nil, fmt.Errorf("slotrows: audit: %d of the deployment's %d SKUs have a stock row", len(out), len(d.skus))
	}
	return out, nil
}
