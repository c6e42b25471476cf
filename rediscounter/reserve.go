package rediscounter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// A reservation:
//
//	lookup the key in PostgreSQL        REPLAY / KEY_REUSED, Redis untouched
//	takeScript in Redis                 check and decrement in one step, with the markers
//	    counter missing: load it (the variant's way), then once more
//	INSERT ... 'HELD' ON CONFLICT (request_key) DO NOTHING   (its own transaction)
//	    the user already holds one (the per-user index): give the unit back, USER_LIMIT
//	    the key's row is another SKU's (sent at once for two): give the unit back, KEY_REUSED
//
// Between the script and the insert the unit is out of the counter and in
// no row: a crash there loses it (CrashMidReserve), until a resend of the
// same request inserts it (its key is marked) or a recount from the log
// gives it back.
const (
	sqlLookup = `SELECT user_id, sku, status, expires_at FROM rediscounter_reservation WHERE request_key = $1`
	sqlInsert = `
INSERT INTO rediscounter_reservation (request_key, user_id, sku, status, expires_at)
VALUES ($1, $2, $3, 'HELD', now() + $4 * interval '1 microsecond')
ON CONFLICT (request_key) DO NOTHING
RETURNING expires_at`
	sqlActive = `SELECT request_key, user_id FROM rediscounter_reservation WHERE sku = $1 AND status IN ('HELD','CONFIRMED')`

	constraintOneActive = "rediscounter_one_active"
)

// Reserve takes a unit in Redis, then writes the reservation.
func (n *node) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if res, err := n.Admit(n.d.owns, req); err != nil {
		return res, err
	}
	i := n.Index()
	n.d.inFlight[i].RLock()
	defer n.d.inFlight[i].RUnlock()
	if err := n.Check(); err != nil {
		return strategy.Result{}, err // restarted while this request waited for the restart
	}
	res, err := n.d.reserve(ctx, req, i, false)
	if err != nil {
		return strategy.Result{}, fmt.Errorf("%s: reserve %q: %w", Name, req.Key, err)
	}
	return res, nil
}

// errDied is what a request killed between the script and the insert sees.
var errDied = errors.New("the request died between the Redis decrement and the PostgreSQL insert")

// reserve is Reserve's work on node i; die stops it after the script.
func (d *Deployment) reserve(ctx context.Context, req strategy.Request, i int, die bool) (strategy.Result, error) {
	if r, found, err := d.lookup(ctx, req.Key); err != nil || found {
		if err != nil {
			return strategy.Result{}, err
		}
		return pgstrategy.KnownKey(req, r), nil
	}
	got, err := d.take(ctx, req, i)
	switch {
	case isDown(err) && d.mistake == DownIsSoldOut: // the mistake
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil
	case isDown(err), err != nil && d.mistake == ErrorIsBusy:
		return strategy.Result{Outcome: strategy.OutcomeBusy}, nil // the script never reached Redis
	case err != nil:
		return strategy.Result{}, fmt.Errorf("take: %w", err) // it may or may not have run: resend
	}
	switch got {
	case takeSoldOut:
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil
	case takeUserHolds:
		return strategy.Result{Outcome: strategy.OutcomeUserLimit}, nil
	case takeKeyOther:
		return d.keyOfAnother(ctx, req)
	}
	if die {
		return strategy.Result{}, errDied
	}
	var expires time.Time
	conn, err := d.db.Acquire(ctx)
	if err != nil {
		// The unit is taken and marked for this key: a resend inserts it.
		return strategy.Result{}, fmt.Errorf("insert reservation: %w", err)
	}
	pid := conn.Conn().PgConn().PID()
	err = conn.QueryRow(ctx, sqlInsert, req.Key, req.User, req.SKU, req.TTL.Microseconds()).Scan(&expires)
	conn.Release()
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return strategy.Result{Outcome: strategy.OutcomeHeld, Reservation: strategy.Reservation{
			Key: req.Key, User: req.User, SKU: req.SKU, Status: strategy.StatusHeld, ExpiresAt: expires,
		}}, nil
	case errors.Is(err, pgx.ErrNoRows):
		// A resend of the same key inserted it meanwhile: one unit, one row.
		r, found, err := d.lookup(ctx, req.Key)
		if err != nil {
			return strategy.Result{}, err
		}
		if !found {
			return strategy.Result{}, fmt.Errorf("key %q conflicts with a row it cannot see", req.Key)
		}
		return d.keyTaken(ctx, req, r)
	case errors.As(err, &pgErr) && pgErr.ConstraintName == constraintOneActive:
		// A resend of the same key can reach the per-user index before the
		// key's: its row is there now, and the unit is that row's.
		if r, found, err := d.lookup(ctx, req.Key); err != nil || found {
			if err != nil {
				return strategy.Result{}, err
			}
			return d.keyTaken(ctx, req, r)
		}
		// The user holds one in PostgreSQL that Redis had forgotten (it
		// restarted): the unit goes back.
		if d.mistake == KeepUnitOnUserLimit {
			return strategy.Result{Outcome: strategy.OutcomeUserLimit}, nil
		}
		if _, err := d.giveBack(ctx, []returned{{sku: req.SKU, key: req.Key, user: req.User}}); err != nil {
			return strategy.Result{}, fmt.Errorf("give back after the user limit: %w", err)
		}
		return strategy.Result{Outcome: strategy.OutcomeUserLimit}, nil
	case d.mistake == InsertLostIsBusy && !errors.As(err, &pgErr) && ctx.Err() == nil:
		if _, gerr := d.giveBack(ctx, []returned{{sku: req.SKU, key: req.Key, user: req.User}}); gerr != nil {
			return strategy.Result{}, fmt.Errorf("give back after a lost insert: %w", gerr)
		}
		return strategy.Result{Outcome: strategy.OutcomeBusy}, nil // the mistake: the insert may have committed
	default:
		// The unit is taken and marked for this key: a resend inserts it.
		// The backend may still commit the row (a restart waits for it).
		if !errors.As(err, &pgErr) {
			d.orphans[i].add(int32(pid))
		}
		return strategy.Result{}, fmt.Errorf("insert reservation: %w", err)
	}
}

// keyTaken answers a request whose insert found its key's row already
// written. An active row of the same SKU holds the unit this request took
// (a resend: the key's marker is one). A row of another SKU does not: the
// markers are per SKU, so one key sent at once for two SKUs took a unit of
// each, and the one whose row lost gives its unit back. Nor does an ended
// row of the same SKU: its unit went back when it ended, with the marker,
// so this request's script found no marker and took a fresh unit (it
// looked its key up before the row was written, and ran its script after
// the row was released or expired); it gives that unit back. The give-back
// is guarded by the key's marker, so a unit already given back under it
// (the row's own, owed by a release whose give-back failed) comes back
// once either way.
func (d *Deployment) keyTaken(ctx context.Context, req strategy.Request, r strategy.Reservation) (strategy.Result, error) {
	ended := r.Status != strategy.StatusHeld && r.Status != strategy.StatusConfirmed
	if d.mistake == EndedIsReleasedOnly {
		ended = r.Status == strategy.StatusReleased
	}
	if r.SKU != req.SKU || (ended && d.mistake != EndedRowKeepsUnit) {
		back := returned{sku: req.SKU, key: req.Key, user: req.User}
		if d.mistake == GiveBackOwnersMarks && r.SKU != req.SKU {
			back.key, back.user = r.Key, r.User // the mistake: the owner's marks, not the request's
		}
		if _, err := d.giveBack(ctx, []returned{back}); err != nil {
			return strategy.Result{}, fmt.Errorf("give back the unit of a key whose row does not hold it: %w", err)
		}
	}
	return pgstrategy.KnownKey(req, r), nil
}

// keyOtherWait bounds how long a request whose key another user's request
// is taking waits for that request's row; keyOtherPoll paces the lookups.
const (
	keyOtherWait = time.Second
	keyOtherPoll = 2 * time.Millisecond
)

// keyOfAnother answers a request whose key took a unit for another user
// whose row is not written yet (it is between its script and its insert):
// once the row is there, KEY_REUSED with it. The owner's insert follows its
// script at once, so the wait is short; an owner that died there never
// writes it, and after keyOtherWait the answer is BUSY (nothing written).
func (d *Deployment) keyOfAnother(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	deadline := time.Now().Add(keyOtherWait)
	tick := time.NewTicker(keyOtherPoll)
	defer tick.Stop()
	for {
		r, found, err := d.lookup(ctx, req.Key)
		switch {
		case err != nil:
			return strategy.Result{}, err
		case found:
			return pgstrategy.KnownKey(req, r), nil
		case d.mistake == KeyOtherFromMarker:
			owner, err := d.rdb.HGet(ctx, d.keys(req.SKU)[1], req.Key).Result()
			if err != nil {
				return strategy.Result{}, err
			}
			return strategy.Result{Outcome: strategy.OutcomeKeyReused, Reservation: strategy.Reservation{ // the mistake: Redis's word for the owner
				Key: req.Key, User: owner, SKU: req.SKU, Status: strategy.StatusHeld}}, nil
		case time.Now().After(deadline):
			return strategy.Result{Outcome: strategy.OutcomeBusy}, nil
		}
		select {
		case <-ctx.Done():
			return strategy.Result{}, ctx.Err()
		case <-tick.C:
		}
	}
}

// take runs takeScript for node i, loading a missing counter once.
func (d *Deployment) take(ctx context.Context, req strategy.Request, i int) (int64, error) {
	for attempt := 0; ; attempt++ {
		script := takeScript
		switch d.mistake {
		case ResendKeepsNode:
			script = takeKeepsNodeScript
		case ResendMovesNode:
			script = takeMovesNodeScript
		}
		got, err := script.Run(ctx, d.rdb, d.keys(req.SKU), req.Key, req.User, i).Int64()
		if err == nil && got == takeTaken && d.mistake == KeysExpire {
			for _, k := range d.keys(req.SKU) {
				if err := d.rdb.PExpire(ctx, k, 7*24*time.Hour).Err(); err != nil {
					return got, err
				}
			}
		}
		if err != nil || got != takeNotLoaded {
			return got, err
		}
		if attempt > 0 {
			return 0, fmt.Errorf("the counter of %q is still missing after loading it", req.SKU)
		}
		if err := d.load(ctx, req.SKU, false, ""); err != nil {
			return 0, err
		}
	}
}

// load sets the counter (and markers) of sku: from the config, or, for
// KeepRecover, from the active reservations in PostgreSQL. Without force
// it only fills a missing counter. node is the restarted node (loadScript
// keeps the other nodes' units in flight), or "".
func (d *Deployment) load(ctx context.Context, sku string, force bool, node string) error {
	units := d.owns[sku]
	var pairs []any
	if d.keep == KeepRecover {
		if node == "" && d.mistake != ReloadSkipsOrphans {
			// A counter missing (Redis restarted empty) took every key's
			// marker with it: an insert of any node whose client gave up
			// may still commit, after a recount that counted its unit free.
			var pids []int32
			for i := range d.orphans {
				if d.mistake == OrphansOfNodeZero {
					i = 0
				}
				pids = append(pids, d.orphans[i].peek()...)
			}
			if err := pgstrategy.AwaitBackendsDone(ctx, d.db, pids); err != nil {
				return fmt.Errorf("recount %q: %w", sku, err)
			}
		}
		rows, err := d.db.Query(ctx, sqlActive, sku)
		if err != nil {
			return fmt.Errorf("recount %q: %w", sku, err)
		}
		var key, user string
		if _, err := pgx.ForEachRow(rows, []any{&key, &user}, func() error {
			pairs = append(pairs, key, user)
			return nil
		}); err != nil {
			return fmt.Errorf("recount %q: %w", sku, err)
		}
		if d.mistake == RecountBounded && len(pairs) > 2*1000 {
			pairs = pairs[:2*1000]
		}
		units -= len(pairs) / 2
		if d.mistake == RecoverCountOnly {
			pairs = nil
		}
	}
	f := "0"
	if force {
		f = "1"
	}
	args := append([]any{f, strconv.Itoa(units), node}, pairs...)
	if err := loadScript.Run(ctx, d.rdb, d.keys(sku), args...).Err(); err != nil {
		return fmt.Errorf("load counter of %q: %w", sku, err)
	}
	return nil
}

// isDown reports whether err says the command never reached Redis: the
// connection could not be made.
func isDown(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

func (d *Deployment) lookup(ctx context.Context, key string) (strategy.Reservation, bool, error) {
	r, found, err := pgstrategy.ScanReservation(d.db.QueryRow(ctx, sqlLookup, key), key)
	if err != nil {
		return r, false, fmt.Errorf("look up key: %w", err)
	}
	return r, found, nil
}

// Lookup reads the committed reservation with this key.
func (n *node) Lookup(ctx context.Context, key string) (strategy.Reservation, error) {
	if ok, err := n.CheckKey(key); !ok {
		return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, err
	}
	r, _, err := n.d.lookup(ctx, key)
	if err != nil {
		return r, fmt.Errorf("%s: lookup %q: %w", Name, key, err)
	}
	return r, nil
}

// CrashMidReserve runs a reservation on node i that dies after the Lua
// script took its unit and before the insert: the unit stays out of the
// counter, in no row, and its key stays marked.
func (d *Deployment) CrashMidReserve(ctx context.Context, i int, req strategy.Request) error {
	strategy.CheckNode(i, d.nodes)
	if err := d.owns.Check(req); err != nil {
		return err
	}
	_, err := d.reserve(ctx, req, i, true)
	if err == nil {
		return fmt.Errorf("%s: crash mid-reserve %q: the request did not reach the script", Name, req.Key)
	}
	return fmt.Errorf("%s: crash mid-reserve %q: %w", Name, req.Key, err)
}
