package strategytest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkReplayAfterMovedElsewhere: REPLAY carries the reservation's current
// state (strategy.OutcomeReplay), whoever moved it. A process that answers
// a resend from the reservations it has answered, forgetting one only when
// it releases or confirms it itself, answers REPLAY of a HELD reservation
// that another node or another process has released or confirmed
// (outsider round 41's ssicount with a cache of its replays). The kit's
// other transitions made elsewhere are followed by new users' requests,
// never by a resend of the key they moved.
//
// On a SKU of 8 units and two nodes (node 0's half of a split stock holds
// the four keys), for each transition the strategy offers (Release,
// Confirm) and each place it is made (node 1, and a second process: one
// that attached, or without Meta.Attach one that opened the same
// configuration again), a key is reserved on node 0 and resent there
// (REPLAY, HELD: what a memory of answers keeps), moved at that place, and
// resent on node 0 again: REPLAY, in the status the move left.
func checkReplayAfterMovedElsewhere(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("replay-moved")
	cfg := strategy.Config{Resources: rs, DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: sku, Total: 8}}}
	dep, err := meta.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	places := []struct {
		name string
		node strategy.Strategy
	}{{"node 1", dep.Node(1)}}
	// A second process: one that attaches, or, for a strategy without
	// Attach, one that opens the same configuration again (where Open
	// refuses a deployment that exists, there is no second process).
	join, how := meta.Attach, "attached"
	if join == nil {
		join, how = meta.Open, "opened again"
	}
	if other, err := join(ctx, cfg); err == nil {
		defer other.Close()
		places = append(places, struct {
			name string
			node strategy.Strategy
		}{"node 0 of a second process (" + how + ")", other.Node(0)})
	} else if meta.Attach != nil {
		t.Fatalf("Attach a second process: %v", err)
	}
	moves := []struct {
		name string
		want strategy.Status
		move func(strategy.Strategy, string) (bool, error) // false: the strategy has no such move
	}{
		{"released", strategy.StatusReleased, func(s strategy.Strategy, key string) (bool, error) {
			r, ok := s.(strategy.Releaser)
			if !ok {
				return false, nil
			}
			units, err := r.Release(ctx, key)
			if err == nil && units != 1 {
				err = fmt.Errorf("%d units, want 1", units)
			}
			return true, err
		}},
		{"confirmed", strategy.StatusConfirmed, func(s strategy.Strategy, key string) (bool, error) {
			c, ok := s.(strategy.Confirmer)
			if !ok {
				return false, nil
			}
			moved, err := c.Confirm(ctx, key, strategy.ConfirmBeforeExpiry)
			if err == nil && !moved {
				err = fmt.Errorf("not moved, want moved")
			}
			return true, err
		}},
	}
	var wrong []string
	tried := 0
	for pi, place := range places {
		for mi, mv := range moves {
			req := strategy.Request{Key: fmt.Sprintf("kit-rm-%d-%d-%s", pi, mi, sku), User: fmt.Sprintf("kit-rm-user-%d-%d", pi, mi), SKU: sku, TTL: time.Hour}
			holdForCheck(ctx, t, dep.Node(0), req)
			if res, err := reserveUnlessBusy(ctx, dep.Node(0), req); err != nil || res.Outcome != strategy.OutcomeReplay || res.Reservation.Status != strategy.StatusHeld {
				t.Fatalf("Reserve %q sent again on node 0: %s (%s), %v; want REPLAY of a HELD reservation", req.Key, res.Outcome, res.Reservation.Status, err)
			}
			if has, err := mv.move(place.node, req.Key); !has {
				continue
			} else if err != nil {
				t.Fatalf("%q %s on %s: %v", req.Key, mv.name, place.name, err)
			}
			tried++
			res, err := reserveUnlessBusy(ctx, dep.Node(0), req)
			if err != nil {
				continue // unknown: says nothing of the state it would carry
			}
			if res.Outcome != strategy.OutcomeReplay || res.Reservation.Status != mv.want {
				wrong = append(wrong, fmt.Sprintf("%q %s on %s, then sent again on node 0: %s of a %s reservation", req.Key, mv.name, place.name, res.Outcome, res.Reservation.Status))
			}
		}
	}
	if tried == 0 {
		t.Skip("no Release or Confirm: no move to make elsewhere")
	}
	if len(wrong) > 0 {
		t.Errorf("a resend is REPLAY of the reservation's current state, whoever moved it: %s; want REPLAY with the status the move left", strings.Join(wrong, "; "))
	}
}
