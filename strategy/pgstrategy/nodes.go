package pgstrategy

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/reservebench/reservebench/strategy"
)

// Handle is what a node that keeps nothing in memory knows of its own life:
// whether it was restarted or its deployment closed. The node embeds it (or
// holds a pointer) and calls Check first in every method.
type Handle struct{ closed atomic.Bool }

// Check returns strategy.ErrNodeClosed once the node was restarted or its
// deployment closed, else nil.
func (h *Handle) Check() error {
	if h.closed.Load() {
		return strategy.ErrNodeClosed
	}
	return nil
}

// Handles is the node table of a deployment whose nodes keep nothing in
// memory, every node a handle on the same pool (hotrow, slotrows,
// advisorylock): a restart loses nothing, and only the old handle has to
// stop answering. Its methods are the deployment's Node, Restarter.Restart
// and Close with the contract's behaviour; it is safe for concurrent use.
type Handles[N any] struct {
	name    string
	newNode func(h *Handle) N

	mu      sync.RWMutex
	nodes   []N
	handles []*Handle
	closed  bool
}

// NewHandles makes n nodes with newNode, each given the Handle it must
// check. name (the strategy's) prefixes Restart's errors.
func NewHandles[N any](name string, n int, newNode func(h *Handle) N) *Handles[N] {
	hs := &Handles[N]{name: name, newNode: newNode, nodes: make([]N, n), handles: make([]*Handle, n)}
	for i := range hs.nodes {
		hs.handles[i] = new(Handle)
		hs.nodes[i] = newNode(hs.handles[i])
	}
	return hs
}

// Node returns node i; out of range it panics through strategy.CheckNode.
func (hs *Handles[N]) Node(i int) N {
	hs.mu.RLock()
	defer hs.mu.RUnlock()
	strategy.CheckNode(i, len(hs.nodes))
	return hs.nodes[i]
}

// Restart closes node i (its handle answers strategy.ErrNodeClosed from
// then on) and puts a new node in its place. It fails with an error
// matching strategy.ErrNodeRange for a bad i, and strategy.ErrNodeClosed
// once the deployment is closed.
func (hs *Handles[N]) Restart(i int) error {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	switch {
	case hs.closed:
		return fmt.Errorf("%s: restart node %d: %w", hs.name, i, strategy.ErrNodeClosed)
	case i < 0 || i >= len(hs.nodes):
		return fmt.Errorf("%s: restart: %w: node %d of %d", hs.name, strategy.ErrNodeRange, i, len(hs.nodes))
	}
	hs.handles[i].closed.Store(true)
	hs.handles[i] = new(Handle)
	hs.nodes[i] = hs.newNode(hs.handles[i])
	return nil
}

// Close closes every node. It may be called more than once.
func (hs *Handles[N]) Close() error {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	hs.closed = true
	for _, h := range hs.handles {
		h.closed.Store(true)
	}
	return nil
}

// Closed reports whether Close was called.
func (hs *Handles[N]) Closed() bool {
	hs.mu.RLock()
	defer hs.mu.RUnlock()
	return hs.closed
}
