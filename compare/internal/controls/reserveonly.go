package controls

import (
	"context"

	"github.com/reservebench/reservebench/strategy"
)

// reserveOnlyMeta is m whose nodes offer Reserve and Lookup and nothing
// else, and whose deployment offers Node, Audit and Close (no Attach, no
// Setup): the smallest strategy the contract allows, for a claim that the
// scenarios needing the optional interfaces cannot check.
func reserveOnlyMeta(m strategy.Meta) strategy.Meta {
	open := m.Open
	m.Description += ", Reserve and Lookup only"
	m.Attach, m.Setup = nil, nil
	m.Open = func(ctx context.Context, cfg strategy.Config) (strategy.Deployment, error) {
		d, err := open(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return reserveOnly{d}, nil
	}
	return m
}

type reserveOnly struct{ strategy.Deployment }

func (d reserveOnly) Node(i int) strategy.Strategy { return reserveOnlyNode{d.Deployment.Node(i)} }

type reserveOnlyNode struct{ strategy.Strategy }

// agelessMeta is m whose deployment offers Node, Audit and Close, and no
// MakeDue (strategy.Ager), while its nodes keep everything, the expiry job
// (strategy.Expirer) included: a job the kit cannot make a row due for.
func agelessMeta(m strategy.Meta) strategy.Meta {
	open := m.Open
	m.Description += ", without MakeDue"
	m.Attach, m.Setup = nil, nil
	m.Open = func(ctx context.Context, cfg strategy.Config) (strategy.Deployment, error) {
		d, err := open(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return ageless{d}, nil
	}
	return m
}

type ageless struct{ strategy.Deployment }
