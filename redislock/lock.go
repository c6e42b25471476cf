package redislock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"

	"github.com/reservebench/reservebench/strategy"
)

// The lock is bsm/redislock's: SET key token NX PX ttl to take it, a Lua
// compare-and-pexpire to renew it and a Lua compare-and-delete to release
// it, so only the holder of the token can extend or drop it. This file adds
// what the library lacks: a watchdog (Redisson's renewal of a lease taken
// without a lease time); a wait loop whose waiting can be observed (the
// harness counts a waiting take as blocked, as it counts a backend in
// pg_blocking_pids); and, when a take is abandoned while its SET may have
// run on the server, the key's deletion by its token, which the library
// cannot do without a *Lock.

// errLockWait is the wait bound passing without the lock: BUSY.
var errLockWait = errors.New("lock not granted within the wait bound")

// releaseByToken is bsm/redislock's release script, for a take whose
// answer was lost.
var releaseByToken = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`)

// locker takes the per-SKU locks of one deployment.
type locker struct {
	rdb    *redis.Client
	lib    *redislock.Client
	prefix string
	ttl    time.Duration // the lease the watchdog renews
	wait   time.Duration // how long a take may wait
	poll   time.Duration // how often a waiting take asks again
	// unlockByDelete is Options.Mistake UnlockByDelete.
	unlockByDelete bool
	// abandonByDelete is Options.Mistake AbandonByDelete.
	abandonByDelete bool
	// lockWaitSticky is Options.Mistake LockWaitSticky.
	lockWaitSticky bool
}

func (l *locker) key(sku string) string { return l.prefix + sku }

// held is a lock taken, and its watchdog.
type held struct {
	l     *locker
	lock  *redislock.Lock
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
	lost  atomic.Bool // a renewal found the lock gone or taken by another
	renew atomic.Int64
	// waited: the take found the lock held by another at least once
	// (Options.Mistake LastUnitWaitSoldOut reads it).
	waited bool
}

// take waits up to l.wait for the lock of sku. waiting, when set, and the
// strategy.LockWait ctx carries, are true only while the take sleeps after
// an attempt that found the lock held by another, never during an attempt,
// so that an observer that reads it true, finds the key, and reads it true
// again knows the take waits for another holder. (That is why the wait loop is here and not bsm/redislock's retry
// strategy: the library's loop cannot be observed.) errLockWait means the
// bound passed; any other error is Redis's (down, or unreachable): either
// way nothing was written.
func (l *locker) take(ctx context.Context, sku string, waiting *atomic.Bool) (*held, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	token := hex.EncodeToString(b[:])
	wctx, cancel := context.WithTimeout(ctx, l.wait)
	defer cancel()
	if waiting == nil {
		waiting = new(atomic.Bool)
	}
	traced := strategy.LockWaitOf(ctx)
	defer func() {
		waiting.Store(false)
		if !l.lockWaitSticky {
			traced.Set(false)
		}
	}()
	tick := time.NewTicker(l.poll)
	defer tick.Stop()
	waited := false
	for {
		waiting.Store(false)
		if !l.lockWaitSticky {
			traced.Set(false)
		}
		lock, err := l.lib.Obtain(wctx, l.key(sku), l.ttl, &redislock.Options{Token: token, RetryStrategy: redislock.NoRetry()})
		if err == nil {
			h := &held{l: l, lock: lock, stop: make(chan struct{}), done: make(chan struct{}), waited: waited}
			go h.watchdog()
			return h, nil
		}
		if !errors.Is(err, redislock.ErrNotObtained) {
			return nil, l.abandon(ctx, sku, token, err)
		}
		waited = true
		waiting.Store(true)
		traced.Set(true)
		select {
		case <-wctx.Done():
			return nil, l.abandon(ctx, sku, token, wctx.Err())
		case <-tick.C:
		}
	}
}

// abandon ends a take that did not get the lock. The last SET may have run
// on the server after the client gave up on its answer: the key is deleted
// if it carries our token, or it would block the SKU for a lease.
func (l *locker) abandon(ctx context.Context, sku, token string, err error) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	if l.abandonByDelete {
		_ = l.rdb.Del(cctx, l.key(sku)).Err() // the mistake
	} else {
		_ = releaseByToken.Run(cctx, l.rdb, []string{l.key(sku)}, token).Err()
	}
	cancel()
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, context.DeadlineExceeded):
		return errLockWait
	}
	return fmt.Errorf("take lock %s: %w", l.key(sku), err)
}

// watchdog renews the lease every third of it while the work runs, as
// Redisson's does for a lock taken without a lease time (30 s renewed every
// 10 s). It stops at release, or when a renewal finds the lock is no
// longer ours.
func (h *held) watchdog() {
	defer close(h.done)
	t := time.NewTicker(h.l.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), h.l.ttl/3)
		err := h.lock.Refresh(ctx, h.l.ttl, nil)
		cancel()
		h.renew.Add(1)
		if errors.Is(err, redislock.ErrNotObtained) {
			h.lost.Store(true)
			return
		}
	}
}

func (h *held) stopWatchdog() {
	h.once.Do(func() { close(h.stop) })
	<-h.done
}

// release stops the watchdog and deletes the lock if it is still ours
// (compare-and-delete). A lock already gone (expired, Redis restarted) is
// not an error: there is nothing left to release.
func (h *held) release(ctx context.Context) error {
	h.stopWatchdog()
	if h.l.unlockByDelete {
		return h.l.rdb.Del(ctx, h.lock.Key()).Err()
	}
	err := h.lock.Release(ctx)
	if err == nil || errors.Is(err, redislock.ErrLockNotHeld) {
		return nil
	}
	return fmt.Errorf("release lock %s: %w", h.lock.Key(), err)
}

// stall stops the watchdog and sets the remaining lease to ttl, as a holder
// that stopped renewing (a long pause) would leave it.
func (h *held) stall(ctx context.Context, ttl time.Duration) error {
	h.stopWatchdog()
	if err := h.lock.Refresh(ctx, ttl, nil); err != nil {
		return fmt.Errorf("shorten lease of %s: %w", h.lock.Key(), err)
	}
	return nil
}
