package strategytest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkTransitionKeepsDeadline: a reservation's ExpiresAt is TTL after the
// moment it was made (strategy.Reservation), and a transition does not
// make it anew. Two reservations are held; one is confirmed, the other
// released; Lookup then reads each with the expires_at its HELD answer
// carried. A Confirm or Release that stamps expires_at with now() ("the
// hold is over") leaves a deadline no answer ever carried, and every
// other check reads only the status after a transition (outsider round
// 51's b30 and b38).
func checkTransitionKeepsDeadline(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "deadline-kept", 2)
	defer dep.Close()
	node := dep.Node(0)
	type move struct {
		name string
		do   func(key string) error
		want strategy.Status
	}
	var moves []move
	if c, ok := node.(strategy.Confirmer); ok {
		moves = append(moves, move{"Confirm", func(key string) error {
			if moved, err := c.Confirm(ctx, key, strategy.ConfirmBeforeExpiry); err != nil || !moved {
				t.Fatalf("Confirm %q: %v, %v; want true", key, moved, err)
			}
			return nil
		}, strategy.StatusConfirmed})
	}
	if r, ok := node.(strategy.Releaser); ok {
		moves = append(moves, move{"Release", func(key string) error {
			if units, err := r.Release(ctx, key); err != nil || units != 1 {
				t.Fatalf("Release %q: %d, %v; want 1", key, units, err)
			}
			return nil
		}, strategy.StatusReleased})
	}
	if len(moves) == 0 {
		t.Skip("no Confirm and no Release")
	}
	for i, m := range moves {
		req := strategy.Request{Key: "kit-deadline-kept-" + m.name + "-" + sku, User: "kit-deadline-kept-" + m.name, SKU: sku, TTL: time.Hour}
		res, err := reserveUntilAnswered(ctx, node, req)
		if err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Fatalf("Reserve %q (%d of %d): %s, %v; want HELD", req.Key, i+1, len(moves), res.Outcome, err)
		}
		_ = m.do(req.Key)
		got, err := node.Lookup(ctx, req.Key)
		if err != nil || got.Status != m.want {
			t.Fatalf("Lookup %q after %s: %+v, %v; want %s", req.Key, m.name, got, err, m.want)
		}
		// A millisecond of slack: an answer built in Go may carry
		// nanoseconds its column drops; a stamp made anew is minutes off.
		if d := got.ExpiresAt.Sub(res.Reservation.ExpiresAt); d > time.Millisecond || d < -time.Millisecond {
			t.Errorf("Lookup %q after %s reads expires_at %s; its HELD answer carried %s: a transition keeps the deadline the reservation was made with",
				req.Key, m.name, got.ExpiresAt.Format(time.RFC3339Nano), res.Reservation.ExpiresAt.Format(time.RFC3339Nano))
		}
	}
}
