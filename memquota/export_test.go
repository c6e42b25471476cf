package memquota

import "github.com/reservebench/reservebench/strategy"

// ErrCrashed is what a reserve or a transition returns when a hook below
// made it die.
var ErrCrashed = errCrashed

// SetCrashAfterDecrement installs a fault-injection hook on a deployment
// opened by this package: every reserve for which die returns true stops
// after the in-memory decrement, before the sales-log insert, and returns
// ErrCrashed, as a request killed between the two would. nil removes it.
func SetCrashAfterDecrement(dep strategy.Deployment, die func(strategy.Request) bool) {
	d := dep.(*Deployment)
	if die == nil {
		d.crashAfterDecrement.Store(nil)
		return
	}
	d.crashAfterDecrement.Store(&die)
}

// SetCrashBeforeGiveBack makes every transition that gives units back
// (Release, ExpireDue) stop after its statement committed and before the
// units reach memory, returning ErrCrashed.
func SetCrashBeforeGiveBack(dep strategy.Deployment, die bool) {
	dep.(*Deployment).crashBeforeGiveBack.Store(die)
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
