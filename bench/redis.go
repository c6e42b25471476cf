package bench

import (
	"context"

	"github.com/reservebench/reservebench/redistest"
	"github.com/reservebench/reservebench/resourcetest"
	"github.com/reservebench/reservebench/strategy"
)

// redisCounter counts the commands a strategy's Redis ran during a trial;
// nil (and 0 commands) for a strategy without a Redis.
type redisCounter struct{ cc *redistest.CommandCounter }

// startRedisCounter takes the first reading.
func startRedisCounter(ctx context.Context, res resourcetest.Set) (*redisCounter, error) {
	srv, ok := res[strategy.Redis]
	if !ok {
		return nil, nil
	}
	cc, err := redistest.CountCommands(ctx, srv.Addr())
	if err != nil {
		return nil, err
	}
	return &redisCounter{cc}, nil
}

// since returns the commands processed since the first reading.
func (rc *redisCounter) since(ctx context.Context) (int64, error) {
	if rc == nil {
		return 0, nil
	}
	return rc.cc.Since(ctx)
}
