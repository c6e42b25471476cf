package controls

import (
	"context"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reservebench/reservebench/hotrow"
	"github.com/reservebench/reservebench/strategy"
)

// cutMistakes are strategies with one mistake in how a transition treats a
// connection that broke under it, which only a cut transition (the
// partition scenario's reset trials) shows.
func cutMistakes() []Control {
	return []Control{fromStrategy(retryReleaseMeta(hotrow.Meta()),
		"ctl-release-retry-safe", "hotrow with one mistake", "new",
		"Release is sent once more when pgx says its error is safe to retry (pgconn.SafeToRetry, \"a pooled connection the server had closed\"), which pgx also says of a COMMIT whose connection reset after the server executed it: the retry moves nothing and Release answers 0 for the unit it gave back",
		expect("partition", contract))}
}

// retryReleaseMeta is m whose nodes send a failed Release once more when
// pgconn.SafeToRetry says so. The deployment keeps Ager (the partition
// scenario's expiry cut needs it) and every node interface the scenario
// probes: Confirm, Release, ExpireDue.
func retryReleaseMeta(m strategy.Meta) strategy.Meta {
	open, attach := m.Open, m.Attach
	m.Open = func(ctx context.Context, cfg strategy.Config) (strategy.Deployment, error) {
		d, err := open(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return retryReleaseDep{d}, nil
	}
	if attach != nil {
		m.Attach = func(ctx context.Context, cfg strategy.Config) (strategy.Deployment, error) {
			d, err := attach(ctx, cfg)
			if err != nil {
				return nil, err
			}
			return retryReleaseDep{d}, nil
		}
	}
	return m
}

type retryReleaseDep struct{ strategy.Deployment }

func (d retryReleaseDep) Node(i int) strategy.Strategy {
	return retryReleaseNode{d.Deployment.Node(i)}
}

func (d retryReleaseDep) MakeDue(ctx context.Context, keys []string) (int, error) {
	return d.Deployment.(strategy.Ager).MakeDue(ctx, keys)
}

type retryReleaseNode struct{ strategy.Strategy }

func (n retryReleaseNode) Confirm(ctx context.Context, key string, mode strategy.ConfirmMode) (bool, error) {
	return n.Strategy.(strategy.Confirmer).Confirm(ctx, key, mode)
}

func (n retryReleaseNode) ExpireDue(ctx context.Context) (int, error) {
	return n.Strategy.(strategy.Expirer).ExpireDue(ctx)
}

// Release is the mistake: a transition is idempotent by its WHERE status =
// 'HELD', so sending it again looks harmless, but the second call reports
// what it moved, not what the first one did.
func (n retryReleaseNode) Release(ctx context.Context, key string) (int, error) {
	r := n.Strategy.(strategy.Releaser)
	units, err := r.Release(ctx, key)
	if err != nil && ctx.Err() == nil && pgconn.SafeToRetry(err) {
		units, err = r.Release(ctx, key)
	}
	return units, err
}
