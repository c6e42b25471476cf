// Package resourcetest provides the resources a strategy needs besides
// PostgreSQL (strategy.Meta.Needs), real ones, to the conformance kit, the
// harness and the benchmarks, so that none of them names a strategy: they
// hand Start a Meta and put the Set's addresses into strategy.Config.Resources.
//
// Today the one resource is strategy.Redis, provided by package redistest
// with the settings the strategy needs (its Need.Settings, e.g.
// "appendonly yes"). Each Start gets instances of its own.
package resourcetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/reservebench/reservebench/redistest"
	"github.com/reservebench/reservebench/strategy"
)

// Server is one running resource: its address for strategy.Config, and the
// control the fault scenarios need (only on an instance started here from
// a local binary; Controllable says whether it works).
type Server interface {
	Addr() string
	Controllable() bool
	// Kill ends the process at once (SIGKILL); Stop shuts it down
	// gracefully; Restart starts it again on its data; Wipe removes its
	// data while it is down, so that the restart is empty.
	Kill(ctx context.Context) error
	Stop(ctx context.Context) error
	Restart(ctx context.Context) error
	Wipe() error
	// Running reports whether an instance started here is up.
	Running() bool
}

// Set is the resources of one strategy, by resource.
type Set map[strategy.Resource]Server

// Addrs are the addresses to put into strategy.Config.Resources; nil for
// an empty set.
func (s Set) Addrs() map[strategy.Resource]string {
	if len(s) == 0 {
		return nil
	}
	out := make(map[strategy.Resource]string, len(s))
	for r, srv := range s {
		out[r] = srv.Addr()
	}
	return out
}

// Close stops every server of the set.
func (s Set) Close() error {
	var errs []error
	for r, srv := range s {
		if c, ok := srv.(interface{ Close() error }); ok {
			if err := c.Close(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", r, err))
			}
		}
	}
	return errors.Join(errs...)
}

// ErrUnknown is matched by Start's error for a resource it cannot provide.
var ErrUnknown = errors.New("resourcetest: no provider for resource")

// Start starts every resource meta needs, with the settings it needs. A
// strategy that needs nothing gets an empty Set. On error, whatever was
// started is stopped.
func Start(ctx context.Context, meta strategy.Meta) (Set, error) {
	set := Set{}
	for _, r := range strategy.NeedsOf(meta) {
		var srv Server
		var err error
		switch r {
		case strategy.Redis:
			srv, err = redistest.Start(ctx, strategy.SettingsOf(meta, r)...)
		default:
			err = fmt.Errorf("%w %q (strategy %s)", ErrUnknown, r, meta.Name)
		}
		if err != nil {
			_ = set.Close()
			return nil, err
		}
		set[r] = srv
	}
	return set, nil
}

// New is Start for a test: the set is closed when the test ends, and a
// failure fails the test.
func New(tb testing.TB, meta strategy.Meta) Set {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	set, err := Start(ctx, meta)
	if err != nil {
		tb.Fatalf("resources for %s: %v", meta.Name, err)
	}
	tb.Cleanup(func() {
		if err := set.Close(); err != nil {
			tb.Errorf("%v", err)
		}
	})
	return set
}
