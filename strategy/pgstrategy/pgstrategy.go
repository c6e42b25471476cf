// Package pgstrategy holds the plumbing that strategies over PostgreSQL
// share, so that each strategy package keeps only its own design:
//
//   - [Tx], a transaction held open on a connection of its own: the body
//     of a strategy.Session or strategy.ExpirySession (Backends, Commit,
//     Rollback, ErrSessionEnded after the end), with [TxHooks] for state
//     kept outside the database, [InTx] to run work in it, and
//     [AsSession] and [AsExpirySession] for the node's Open methods;
//   - [Handle], a node's own life (ErrNodeClosed once restarted or closed,
//     strategy.Storable keys, the start of Reserve), and [Handles], the
//     node table of a deployment whose nodes keep nothing in memory: Node,
//     Restart and Close with the contract's ErrNodeRange and ErrNodeClosed;
//   - [Schema], the body of Open (the schema created once under an
//     advisory lock, the stock loaded in the same transaction, with
//     [AllInserted]) and of Meta.Attach (the stock checked, nothing
//     written), and [Schema.Setup], the body of Meta.Setup (the schema
//     created by the owner role, [Grant]s to the runtime role); [Bind], a
//     strategy's typed Open as Meta.Open or Meta.Attach;
//   - [SKUs], a deployment's SKUs and the checks of a request that need no
//     database; [ScanReservation] and [KnownKey], a looked-up reservation
//     and the REPLAY or KEY_REUSED answer to its key;
//   - [PgbenchSQL] and [PgbenchScript], a strategy's own SQL as a pgbench
//     script.
//
// It imports only package strategy, pgx and the standard library; a
// strategy may use any part of it and nothing here is required by the
// contract.
package pgstrategy

import (
	"context"

	"github.com/reservebench/reservebench/strategy"
)

// Bind turns a strategy package's Open (or attach) function, which returns
// its concrete deployment type, into the func of strategy.Meta.Open or
// strategy.Meta.Attach with opts bound. A failed call returns a nil
// strategy.Deployment, never an interface holding a typed nil.
func Bind[D strategy.Deployment, O any](open func(context.Context, strategy.Config, O) (D, error), opts O) func(context.Context, strategy.Config) (strategy.Deployment, error) {
	return func(ctx context.Context, cfg strategy.Config) (strategy.Deployment, error) {
		d, err := open(ctx, cfg, opts)
		if err != nil {
			return nil, err
		}
		return d, nil
	}
}
