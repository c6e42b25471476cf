package pgstrategy

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// Handle is what a node knows of its own life: whether it was restarted or
// its deployment closed. A node embeds it and calls Check (or CheckKey)
// first in every method; the zero value is a live node 0.
type Handle struct {
	closed atomic.Bool
	index  int
}

// Index is the node's place in its deployment (Deployment.Node(i)), the
// same for the node that a restart puts there.
func (h *Handle) Index() int { return h.index }

// Check returns strategy.ErrNodeClosed once the node was restarted or its
// deployment closed, else nil.
func (h *Handle) Check() error {
	if h.closed.Load() {
		return strategy.ErrNodeClosed
	}
	return nil
}

// CheckKey is Check for a method that takes a bare key (Lookup, Confirm,
// Release), then strategy.Storable: ok is false when the method must return
// at once, with err (the node is closed) or with its "nothing" answer (nil
// err: the key was never stored, so no query is sent).
func (h *Handle) CheckKey(key string) (ok bool, err error) {
	if err := h.Check(); err != nil {
		return false, err
	}
	return strategy.Storable(key), nil
}

// Admit is the start of a node's Reserve: a request skus.Check refuses is
// BAD_REQUEST with its error (strategy.BadRequest), and on a closed node the
// error is strategy.ErrNodeClosed. A nil error: go on.
func (h *Handle) Admit(skus SKUs, req strategy.Request) (strategy.Result, error) {
	if err := skus.Check(req); err != nil {
		return strategy.BadRequest(err)
	}
	return strategy.Result{}, h.Check()
}

// MarkClosed makes Check fail from now on: the node was restarted or its
// deployment closed.
func (h *Handle) MarkClosed() { h.closed.Store(true) }

// BeginTx is Begin for a node: it fails with strategy.ErrNodeClosed on a
// closed node, and wraps Begin's errors as "<name>: open session: ...".
func (h *Handle) BeginTx(ctx context.Context, db *pgxpool.Pool, name string, iso pgx.TxIsoLevel, hooks TxHooks) (*Tx, error) {
	if err := h.Check(); err != nil {
		return nil, err
	}
	tx, err := Begin(ctx, db, name, iso, hooks)
	if err != nil {
		return nil, fmt.Errorf("%s: open session: %w", name, err)
	}
	return tx, nil
}

// Handles is the node table of a deployment whose nodes keep nothing in
// memory, every node a handle on the same pool (hotrow, slotrows,
// advisorylock): a restart loses nothing, and only the old handle has to
// stop answering. A deployment embeds *Handles for its Node, Restart
// (strategy.Restarter) and Close, which behave as the contract says. It is
// safe for concurrent use.
type Handles struct {
	name    string
	newNode func(h *Handle) strategy.Strategy

	mu      sync.RWMutex
	nodes   []strategy.Strategy
	handles []*Handle
	closed  bool
}

// NewHandles makes n nodes with newNode, each given the Handle it must
// check. name (the strategy's) prefixes Restart's errors.
func NewHandles(name string, n int, newNode func(h *Handle) strategy.Strategy) *Handles {
	hs := &Handles{name: name, newNode: newNode, nodes: make([]strategy.Strategy, n), handles: make([]*Handle, n)}
	for i := range hs.nodes {
		hs.handles[i] = &Handle{index: i}
		hs.nodes[i] = newNode(hs.handles[i])
	}
	return hs
}

// Node returns node i; out of range it panics through strategy.CheckNode.
func (hs *Handles) Node(i int) strategy.Strategy {
	hs.mu.RLock()
	defer hs.mu.RUnlock()
	strategy.CheckNode(i, len(hs.nodes))
	return hs.nodes[i]
}

// Restart closes node i (its handle answers strategy.ErrNodeClosed from
// then on) and puts a new node in its place: there is nothing to recover.
// It fails with an error matching strategy.ErrNodeRange for a bad i, and
// strategy.ErrNodeClosed once the deployment is closed.
func (hs *Handles) Restart(_ context.Context, i int) error {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	switch {
	case hs.closed:
		return fmt.Errorf("%s: restart node %d: %w", hs.name, i, strategy.ErrNodeClosed)
	case i < 0 || i >= len(hs.nodes):
		return fmt.Errorf("%s: restart: %w: node %d of %d", hs.name, strategy.ErrNodeRange, i, len(hs.nodes))
	}
	hs.handles[i].MarkClosed()
	hs.handles[i] = &Handle{index: i}
	hs.nodes[i] = hs.newNode(hs.handles[i])
	return nil
}

// Close closes every node; it drops no data, and the pool, which belongs
// to the caller, stays open. Sessions already open stay usable until they
// end. It may be called more than once.
func (hs *Handles) Close() error {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	hs.closed = true
	for _, h := range hs.handles {
		h.MarkClosed()
	}
	return nil
}
