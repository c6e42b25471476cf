package controls

import (
	"context"

	"github.com/reservebench/reservebench/strategy"
)

// reserveOnlyMeta is strategy A (with s's mistake) whose nodes offer
// Reserve and Lookup and nothing else, and whose deployment offers Node,
// Audit and Close: the smallest strategy the contract allows, for a claim
// that the scenarios needing the optional interfaces cannot check.
func reserveOnlyMeta(s spec) strategy.Meta {
	return strategy.Meta{
		Name:        s.name,
		Description: "negative control: strategy A with one deliberate mistake, Reserve and Lookup only",
		Correctness: "none: it claims what it cannot keep",
		Claims:      s.claims,
		Open: func(ctx context.Context, cfg strategy.Config) (strategy.Deployment, error) {
			d, err := open(ctx, s, cfg)
			if err != nil {
				return nil, err
			}
			return reserveOnly{d}, nil
		},
	}
}

type reserveOnly struct{ strategy.Deployment }

func (d reserveOnly) Node(i int) strategy.Strategy { return reserveOnlyNode{d.Deployment.Node(i)} }

type reserveOnlyNode struct{ strategy.Strategy }
