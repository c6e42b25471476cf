package strategytest_test

import (
	"context"
	"testing"

	"github.com/reservebench/reservebench/advisorylock"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

// TestKitPassesReserveOnly: a correct strategy in PostgreSQL whose nodes
// offer Reserve and Lookup alone (advisorylock, the rest hidden; its
// deployment keeps Restart) passes every scenario: the kit asks nothing of
// a capability a strategy does not have. checkRetriedAtCommit did until
// 2026-12-07: it wanted a new request HELD on a SKU whose every unit it
// held, counting on a Release or an expiry run to have freed one, and told
// a correct reserve-only strategy its SOLD_OUT was wrong. The in-memory
// fakes above keep no tables, so that check skipped them.
//
// The deployment is a struct value with a slice in it, which == cannot
// compare: the kit compared a Restart's deployment with the one it had
// (checkBesideOrphan), and a value of such a type made it panic, a false
// violation of survives-restart (found the same day, with capabilities
// hidden one at a time from advisorylock).
func TestKitPassesReserveOnly(t *testing.T) {
	strategytest.RunWith(t, reserveOnly(advisorylock.Meta()), pgtest.Pools, strategytest.Options{Skip: fakeSkips})
}

// reserveOnly is m whose nodes offer Reserve and Lookup and nothing else,
// and whose deployment offers Node, Audit, Close and Restart. The negative
// controls have their own (compare/internal/controls' reserveOnlyMeta,
// without Restart), which this package cannot import: it is internal to
// compare, and the kit must not depend on compare.
func reserveOnly(m strategy.Meta) strategy.Meta {
	open := m.Open
	m.Name += "-reserve-only"
	m.Attach, m.Setup = nil, nil
	m.Open = func(ctx context.Context, cfg strategy.Config) (strategy.Deployment, error) {
		d, err := open(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return reserveOnlyDeployment{d, d.(strategy.Restarter), []string{"Confirm", "Release", "ExpireDue", "OpenSession", "MakeDue", "Attach"}}, nil
	}
	return m
}

type reserveOnlyDeployment struct {
	strategy.Deployment
	strategy.Restarter
	hidden []string // makes the type one == cannot compare
}

func (d reserveOnlyDeployment) Node(i int) strategy.Strategy {
	return reserveOnlyNode{d.Deployment.Node(i)}
}

type reserveOnlyNode struct{ strategy.Strategy }
