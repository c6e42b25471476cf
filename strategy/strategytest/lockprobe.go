package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/reservebench/reservebench/redistest"
	"github.com/reservebench/reservebench/strategy"
)

// The harness's view of a lock a strategy takes outside PostgreSQL
// (strategy.LockTaker): whether it is held now, and ending its lease.

// expireLock ends the lease of the lock of sku now (PEXPIRE 1 ms) and
// waits until the key is gone; it returns the lease it had left (0 when
// there was no lock).
func (t *trial) expireLock(ctx context.Context, sku string) (time.Duration, error) {
	info := t.node(0).(strategy.LockTaker).LockOf(sku)
	srv, ok := t.env.Resources[info.Resource]
	if !ok {
		return 0, fmt.Errorf("the lock lives in %q, which the strategy does not declare in Meta.Needs", info.Resource)
	}
	rdb, err := redistest.Client(srv.Addr())
	if err != nil {
		return 0, err
	}
	defer rdb.Close()
	left, err := rdb.PTTL(ctx, info.Key).Result()
	if err != nil {
		return 0, fmt.Errorf("PTTL of %s: %w", info.Key, err)
	}
	if left <= 0 {
		return 0, nil
	}
	if err := rdb.PExpire(ctx, info.Key, time.Millisecond).Err(); err != nil {
		return 0, fmt.Errorf("fast-forward the lease of %s: %w", info.Key, err)
	}
	if _, err := waitKeyGone(ctx, rdb, info.Key, 10*time.Second); err != nil {
		return 0, err
	}
	return left, nil
}

// lockHeld reports whether the lock of sku exists on its server now.
func (t *trial) lockHeld(ctx context.Context, sku string) (bool, error) {
	info := t.node(0).(strategy.LockTaker).LockOf(sku)
	srv, ok := t.env.Resources[info.Resource]
	if !ok {
		return false, fmt.Errorf("the lock lives in %q, which the strategy does not declare in Meta.Needs", info.Resource)
	}
	rdb, err := redistest.Client(srv.Addr())
	if err != nil {
		return false, err
	}
	defer rdb.Close()
	n, err := rdb.Exists(ctx, info.Key).Result()
	if err != nil {
		return false, fmt.Errorf("probe lock %s: %w", info.Key, err)
	}
	return n == 1, nil
}
