package combine

import (
	"context"
	"fmt"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// Reserve hands the request to the node's combiner for its SKU and waits
// for its batch's answer, or for ctx. When ctx ends first the outcome is
// unknown to the caller, as the contract says of any error: the batch may
// still commit the reservation (a Lookup, or the same request sent again,
// finds out). A batch that fails answers every request in it with its
// error: each is then unknown, and resolved the same way.
func (n *node) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if res, err := n.Admit(n.d.owns, req); err != nil {
		return res, err
	}
	p := &pending{ctx: ctx, req: req, done: make(chan answer, 1)}
	n.combiners[req.SKU].submit(p)
	select {
	case a := <-p.done:
		return a.res, a.err
	case <-ctx.Done():
		return strategy.Result{}, fmt.Errorf("combine: reserve %q: %w (outcome unknown: its batch may commit)", req.Key, ctx.Err())
	}
}

// Queued is strategy.Queuer: the requests for sku waiting in this node's
// combiner, not yet in a batch.
func (n *node) Queued(sku string) int {
	c, ok := n.combiners[sku]
	if !ok {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// Lookup reads the committed reservation with this key, whatever its SKU.
func (n *node) Lookup(ctx context.Context, key string) (strategy.Reservation, error) {
	if ok, err := n.CheckKey(key); !ok {
		return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, err
	}
	r, _, err := pgstrategy.ScanReservation(n.d.db.QueryRow(ctx, sqlLookup, key), key)
	if err != nil {
		return strategy.Reservation{}, fmt.Errorf("combine: lookup %q: %w", key, err)
	}
	return r, nil
}
