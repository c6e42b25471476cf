package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/pgtest/pgproxy"
)

// poolThroughProxy starts a pgproxy in front of db's server and opens a
// pool of at most maxConns connections, configured as db's, through it:
// the connections a fault can cut. app, when set, is their
// application_name. close stops both, the proxy first: its connections
// reset, and the pool closes at once instead of saying goodbye through a
// proxy still open and waiting for an answer. A connection never given
// back is left to the process (pgtest.CloseWithin): the leak is the failed
// check of the scenario that met it (checkPoolReturned), not a hang.
func poolThroughProxy(ctx context.Context, db *pgxpool.Pool, app string, maxConns int32) (p *pgproxy.Proxy, pool *pgxpool.Pool, close func(), err error) {
	cc := db.Config().ConnConfig
	p, err = pgproxy.Start(cc.Host, cc.Port)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("proxy: %w", err)
	}
	cfg := db.Config().Copy()
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = p.Addr()
	cfg.ConnConfig.Fallbacks = nil
	if app != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = app
	}
	cfg.MaxConns = maxConns
	pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		_ = p.Close()
		return nil, nil, nil, fmt.Errorf("pool through the proxy: %w", err)
	}
	return p, pool, func() {
		_ = p.Close()
		_ = pgtest.CloseWithin(pool, 10*time.Second)
	}, nil
}
