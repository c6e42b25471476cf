package controls

import (
	"context"
	"sync/atomic"

	"github.com/reservebench/reservebench/admission"
	"github.com/reservebench/reservebench/service"
	"github.com/reservebench/reservebench/strategy"
)

// The controls above break the strategy. ctl-unbounded-gate breaks the
// front the http-* scenarios put before it: its admission admits every
// call at once and reports the limits it was given, as a gate whose bound
// was lost would (a semaphore never acquired, an executor with an
// unbounded queue in front of it). The strategy behind it is strategy A
// unchanged.

// unboundedGate is a service.Admission that does not bound.
type unboundedGate struct {
	limits             admission.Limits
	admitted, inFlight atomic.Int64
	maxInFlight        atomic.Int64
}

func newUnboundedGate(_ strategy.Strategy, l admission.Limits) (service.Admission, error) {
	return &unboundedGate{limits: l}, nil
}

func (g *unboundedGate) Acquire(ctx context.Context) (func(), error) {
	g.admitted.Add(1)
	n := g.inFlight.Add(1)
	for cur := g.maxInFlight.Load(); n > cur && !g.maxInFlight.CompareAndSwap(cur, n); cur = g.maxInFlight.Load() {
	}
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			g.inFlight.Add(-1)
		}
	}, nil
}

func (g *unboundedGate) Stats() admission.Stats {
	return admission.Stats{Admitted: g.admitted.Load(), MaxInFlight: g.maxInFlight.Load()}
}

func (g *unboundedGate) InFlight() int            { return int(g.inFlight.Load()) }
func (g *unboundedGate) Waiting() int             { return 0 }
func (g *unboundedGate) Limits() admission.Limits { return g.limits }
