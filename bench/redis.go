package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/reservebench/reservebench/redistest"
	"github.com/reservebench/reservebench/resourcetest"
	"github.com/reservebench/reservebench/strategy"
)

// redisCounter reads total_commands_processed of a strategy's Redis over
// one connection, so that between two readings the only command of its own
// that Redis counts is the first reading's INFO (a command is counted once
// it has run, after it answered).
type redisCounter struct {
	c      *redis.Client
	before int64
}

// startRedisCounter takes the first reading; nil without a Redis.
func startRedisCounter(ctx context.Context, res resourcetest.Set) (*redisCounter, error) {
	srv, ok := res[strategy.Redis]
	if !ok {
		return nil, nil
	}
	c, err := redistest.Client(srv.Addr())
	if err != nil {
		return nil, err
	}
	rc := &redisCounter{c: c}
	if rc.before, err = rc.read(ctx); err != nil {
		_ = c.Close()
		return nil, err
	}
	return rc, nil
}

// since returns the commands processed since the first reading, less that
// reading's INFO, and closes the connection.
func (rc *redisCounter) since(ctx context.Context) (int64, error) {
	if rc == nil {
		return 0, nil
	}
	defer rc.c.Close()
	after, err := rc.read(ctx)
	return after - rc.before - 1, err
}

func (rc *redisCounter) read(ctx context.Context) (int64, error) {
	info, err := rc.c.Info(ctx, "stats").Result()
	if err != nil {
		return 0, fmt.Errorf("bench: redis INFO stats: %w", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("bench: redis INFO stats has no total_commands_processed")
}
