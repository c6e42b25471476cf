// Package pgslots bounds admission across every process that shares a
// database, with the database itself: Slots session-level advisory locks
// (pg_advisory_lock(Key, slot), slot = 0..Slots-1), one held by each
// admitted call for as long as it runs. An admission.Gate stays in front
// of it in each process, so the per-process queue and wait bounds hold as
// before; the slots add the bound the gates cannot give (three processes
// with InFlight 4 each otherwise let 12 calls into the database at once).
//
// What it costs: each admitted call holds a second connection (the one
// with the lock) and makes two more round trips (take, give back), and a
// call that waits for a slot waits on one slot chosen at random, not on
// whichever frees first. A process that dies gives its slots back with its
// connections, as PostgreSQL ends their sessions.
package pgslots

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/admission"
)

// DefaultKey is the advisory lock class of the slots.
const DefaultKey int32 = 0x52425354 // "RBST"

// Gate is a process's admission through a local admission.Gate and then
// one of the database's slots. It implements service.Admission.
type Gate struct {
	local *admission.Gate
	pool  *pgxpool.Pool
	slots int32
	key   int32

	running, waitingSlot    atomic.Int64
	slotTimeouts, maxInside atomic.Int64
}

// New returns a gate over local whose calls also take one of slots
// advisory-lock slots through pool. The pool must have room for one
// connection per call local admits besides those the strategy uses.
func New(local *admission.Gate, pool *pgxpool.Pool, slots int, key int32) (*Gate, error) {
	if slots < 1 {
		return nil, fmt.Errorf("pgslots: slots must be at least 1, got %d", slots)
	}
	return &Gate{local: local, pool: pool, slots: int32(slots), key: key}, nil
}

// Acquire admits the call locally, then takes a free slot, or waits for
// one until the local gate's Wait has passed (then *admission.RejectedError
// WaitTimeout: nothing of the caller's was written).
func (g *Gate) Acquire(ctx context.Context) (func(), error) {
	start := time.Now()
	releaseLocal, err := g.local.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	conn, err := g.pool.Acquire(ctx)
	if err != nil {
		releaseLocal()
		return nil, fmt.Errorf("pgslots: a connection to hold the slot: %w", err)
	}
	slot, err := g.take(ctx, conn, start)
	if err != nil {
		conn.Release()
		releaseLocal()
		return nil, err
	}
	n := g.running.Add(1)
	for cur := g.maxInside.Load(); n > cur && !g.maxInside.CompareAndSwap(cur, n); cur = g.maxInside.Load() {
	}
	var once atomic.Bool
	return func() {
		if !once.CompareAndSwap(false, true) {
			return
		}
		g.running.Add(-1)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1, $2)`, g.key, slot); err != nil {
			// Closing the session is what gives its locks back for sure.
			_ = conn.Conn().Close(ctx)
		}
		conn.Release()
		releaseLocal()
	}, nil
}

// take returns the slot conn now holds: a free one if any, else the one
// it waited for.
func (g *Gate) take(ctx context.Context, conn *pgxpool.Conn, start time.Time) (int32, error) {
	var slot int32
	err := conn.QueryRow(ctx, `SELECT s FROM generate_series(0, $2::int - 1) s WHERE pg_try_advisory_lock($1, s) LIMIT 1`, g.key, g.slots).Scan(&slot)
	if err == nil {
		return slot, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("pgslots: take a slot: %w", err)
	}
	left := g.local.Limits().Wait - time.Since(start)
	if left <= 0 {
		g.slotTimeouts.Add(1)
		return 0, &admission.RejectedError{Reason: admission.WaitTimeout, Retry: g.local.Limits().RetryAfter}
	}
	g.waitingSlot.Add(1)
	defer g.waitingSlot.Add(-1)
	slot = rand.Int32N(g.slots)
	_, err = conn.Exec(ctx, fmt.Sprintf(`SET lock_timeout = %d`, max(1, left.Milliseconds())))
	if err == nil {
		_, err = conn.Exec(ctx, `SELECT pg_advisory_lock($1, $2)`, g.key, slot)
	}
	_, _ = conn.Exec(context.Background(), `RESET lock_timeout`)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return slot, nil
	case errors.As(err, &pgErr) && pgErr.Code == "55P03": // lock_not_available
		g.slotTimeouts.Add(1)
		return 0, &admission.RejectedError{Reason: admission.WaitTimeout, Retry: g.local.Limits().RetryAfter}
	case ctx.Err() != nil:
		_ = conn.Conn().Close(context.Background()) // the canceled lock request may still be granted
		return 0, &admission.RejectedError{Reason: admission.Canceled, Retry: g.local.Limits().RetryAfter, Err: ctx.Err()}
	}
	return 0, fmt.Errorf("pgslots: wait for a slot: %w", err)
}

// Stats are the local gate's, with the waits for a slot that timed out
// counted as WaitTimeout refusals and MaxInFlight the most calls holding
// a slot at once in this process.
func (g *Gate) Stats() admission.Stats {
	s := g.local.Stats()
	s.RejectedTimeout += g.slotTimeouts.Load()
	s.MaxInFlight = g.maxInside.Load()
	return s
}

// InFlight is the number of this process's calls holding a slot.
func (g *Gate) InFlight() int { return int(g.running.Load()) }

// Waiting counts the calls waiting in the local queue or for a slot.
func (g *Gate) Waiting() int { return g.local.Waiting() + int(g.waitingSlot.Load()) }

// Limits are the local gate's.
func (g *Gate) Limits() admission.Limits { return g.local.Limits() }
