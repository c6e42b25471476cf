package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// CommandCounter reads total_commands_processed of a Redis over one
// connection of its own, so that between two readings the only command of
// its own Redis counts is the first reading's INFO (a command is counted
// once it has run, after it answered). The benchmarks and table 28-1's
// cost per reservation count a strategy's Redis commands with it.
type CommandCounter struct {
	c      *redis.Client
	before int64
}

// CountCommands takes the first reading of the Redis at addr.
func CountCommands(ctx context.Context, addr string) (*CommandCounter, error) {
	c, err := Client(addr)
	if err != nil {
		return nil, err
	}
	cc := &CommandCounter{c: c}
	if cc.before, err = cc.read(ctx); err != nil {
		_ = c.Close()
		return nil, err
	}
	return cc, nil
}

// Since returns the commands processed since the first reading, less that
// reading's INFO, and closes the connection.
func (cc *CommandCounter) Since(ctx context.Context) (int64, error) {
	defer cc.c.Close()
	after, err := cc.read(ctx)
	return after - cc.before - 1, err
}

func (cc *CommandCounter) read(ctx context.Context) (int64, error) {
	info, err := cc.c.Info(ctx, "stats").Result()
	if err != nil {
		return 0, fmt.Errorf("redistest: INFO stats: %w", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("redistest: INFO stats has no total_commands_processed")
}
