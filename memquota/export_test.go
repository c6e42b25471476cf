package memquota

import (
	"context"

	"github.com/reservebench/reservebench/strategy"
)

// ErrCrashed is what a reserve (Deployment.CrashMidReserve) or a transition
// made to die below returns.
var ErrCrashed = errCrashed

// ExpireDueDying runs node i's ExpireDue and dies after its statement
// committed and before the units reach memory, returning ErrCrashed.
func ExpireDueDying(ctx context.Context, dep *Deployment, i int) error {
	n := dep.nodes[i].Load()
	_, err := n.transition(ctx, false, expireSQL, dep.skus)
	return err
}

// ReleaseDying is ExpireDueDying for node i's Release of key.
func ReleaseDying(ctx context.Context, dep *Deployment, i int, key string) error {
	n := dep.nodes[i].Load()
	_, err := n.transition(ctx, false, releaseSQL, key, dep.skus)
	return err
}

// InDoubt counts the units in doubt over the deployment's nodes.
func InDoubt(dep strategy.Deployment) int {
	d := dep.(*Deployment)
	n := 0
	for i := range d.nodes {
		n += int(d.nodes[i].Load().ndoubt.Load())
	}
	return n
}
