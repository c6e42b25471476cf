package strategytest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reservebench/reservebench/redistest"
	"github.com/reservebench/reservebench/strategy"
)

// The lock faults of seed 002. In each, attempt A holds its work open
// under the SKU's lock (its UPDATE done, not committed), the lock stops
// protecting it, and attempt B arrives:
//
//	unlock-before-commit  A's unlock runs before its commit (a finally block
//	                      around the transaction): the seed's 11-step timeline
//	expire                A stops renewing (a pause past its lease); the
//	                      harness waits until the key is gone, by polling
//	                      PTTL on the lock's server
//	restart-empty         the lock's server is SIGKILLed and restarted with
//	                      no data: every lock is gone
//
// B takes the lock, passes the double check on a stale read (A has not
// committed), and its UPDATE waits for A's row lock, seen in
// pg_blocking_pids. A commits. Whether B sells the unit A sold is up to
// the database's condition: with it, B's UPDATE re-evaluates available > 0
// on A's committed row, moves 0 rows, and B is told SOLD_OUT.
const (
	LockUnlockBeforeCommit = "unlock-before-commit"
	LockExpire             = "expire"
	LockRestartEmpty       = "restart-empty"
)

// stallTTL is the lease left to a stalled holder in the expire fault.
const stallTTL = 200 * time.Millisecond

func runLockFault(ctx context.Context, t *trial) error {
	in := t.in
	sku := t.sku(in.Stock[0].SKU)
	info := t.node(0).(strategy.LockTaker).LockOf(sku)
	srv, ok := t.env.Resources[info.Resource]
	if !ok {
		return fmt.Errorf("the lock lives in %q, which the strategy does not declare in Meta.Needs", info.Resource)
	}
	if in.LockFault == LockRestartEmpty && !srv.Controllable() {
		return notApplicable(fmt.Sprintf("the %s server is not one the harness started: it cannot be killed", info.Resource))
	}
	rdb, err := redistest.Client(srv.Addr())
	if err != nil {
		return err
	}
	defer rdb.Close()
	opener := t.node(0).(strategy.SessionOpener)

	// A: its work done under the lock, held open.
	reqA := strategy.Request{Key: t.key("req-A"), User: t.user("user-A"), SKU: sku, TTL: strategy.TTLForever}
	a, err := opener.OpenSession(ctx)
	if err != nil {
		return fmt.Errorf("open session A: %w", err)
	}
	defer a.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	la, ok := a.(strategy.LockedSession)
	if !ok {
		return fmt.Errorf("the node is a strategy.LockTaker but its session is no strategy.LockedSession")
	}
	opA := Op{Process: "A", Req: reqA, Invoke: t.hist.Begin()}
	res, err := a.Reserve(ctx, reqA)
	opA = reserveOp(opA, res, err)
	if opA.Type == OpOK {
		opA.Type = OpInfo // held open: decided by its commit
	}
	t.hist.End(opA)
	if err != nil || res.Outcome != strategy.OutcomeHeld {
		return fmt.Errorf("setup: A answered %s %v", res.Outcome, err)
	}
	before, err := rdb.PTTL(ctx, info.Key).Result()
	if err != nil {
		return fmt.Errorf("PTTL of A's lock: %w", err)
	}

	// The fault.
	var fault string
	switch in.LockFault {
	case LockUnlockBeforeCommit:
		if err := la.DropLock(ctx); err != nil {
			return fmt.Errorf("A drops its lock: %w", err)
		}
		fault = "A's unlock ran before its commit"
	case LockExpire:
		if err := la.StallLock(ctx, stallTTL); err != nil {
			return fmt.Errorf("stall A's lock: %w", err)
		}
		waited, err := waitKeyGone(ctx, rdb, info.Key, stallTTL+10*time.Second)
		if err != nil {
			return err
		}
		t.vary("ms polled until the stalled lock expired", int(waited.Milliseconds()))
		fault = fmt.Sprintf("A stopped renewing; its lock expired after a %v lease", stallTTL)
	case LockRestartEmpty:
		if err := srv.Kill(ctx); err != nil {
			return fmt.Errorf("kill %s: %w", info.Resource, err)
		}
		if err := srv.Wipe(); err != nil {
			return err
		}
		if err := srv.Restart(ctx); err != nil {
			return fmt.Errorf("restart %s: %w", info.Resource, err)
		}
		fault = fmt.Sprintf("%s was SIGKILLed and restarted empty", info.Resource)
	}
	after, err := rdb.PTTL(ctx, info.Key).Result()
	if err != nil {
		return fmt.Errorf("PTTL of A's lock after the fault: %w", err)
	}
	t.fact("A's lock", "%s before the fault; after it: %s", lockState(before), lockState(after))

	// B: a second attempt, in a session so its backend can be watched.
	reqB := strategy.Request{Key: t.key("req-B"), User: t.user("user-B"), SKU: sku, TTL: strategy.TTLForever}
	b, err := opener.OpenSession(ctx)
	if err != nil {
		return fmt.Errorf("open session B: %w", err)
	}
	defer b.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	sb := &sessionRun{in: SessionInput{Name: "B"}, req: reqB, sess: b, busy: &inflight{step: step{Name: "B"}, done: make(chan struct{})}}
	for _, p := range b.Backends() {
		sb.pids = append(sb.pids, int32(p))
	}
	var resB strategy.Result
	var errB error
	opB := Op{Process: "B", Req: reqB, Invoke: t.hist.Begin()}
	var box panicBox
	defer box.rethrow()
	go func() {
		defer close(sb.busy.done)
		defer box.catch()
		resB, errB = b.Reserve(ctx, reqB)
	}()
	finished, err := t.await(ctx, sb)
	if err != nil {
		<-sb.busy.done
		return err
	}
	blockedInPG := false
	if !finished {
		if ls, ok := b.(strategy.LockedSession); !ok || !ls.LockWaiting() {
			blockedInPG = true
		}
	}

	// A commits; B finishes and commits what it was told.
	opC := Op{Process: "A", Kind: "commit", Req: reqA, Invoke: t.hist.Begin(), Type: OpOK}
	if err := a.Commit(ctx); err != nil {
		opC.Type, opC.Err = OpInfo, err.Error()
	}
	t.hist.End(opC)
	<-sb.busy.done
	// B waited on A's row, so it holds the lock it took, until its own
	// transaction ends: A's unlock at its commit must have deleted only
	// its own lock (compare the token, then delete), not B's.
	bLock := time.Duration(0)
	if blockedInPG && errB == nil {
		if bLock, err = rdb.PTTL(ctx, info.Key).Result(); err != nil {
			return fmt.Errorf("PTTL of B's lock after A's commit: %w", err)
		}
	}
	opB = reserveOp(opB, resB, errB)
	if errB == nil {
		if err := b.Commit(ctx); err != nil {
			opB.Type, opB.Err = OpInfo, err.Error()
		}
	}
	t.hist.End(opB)

	audit, err := t.audit(ctx)
	if err != nil {
		return err
	}
	a1 := audit[sku]
	bState := "B " + string(resB.Outcome)
	if errB != nil {
		bState = "B error"
	}
	waitWord := "did not wait"
	switch {
	case blockedInPG:
		waitWord = "passed the double check on a stale read and waited on A's row lock (pg_blocking_pids)"
	case !finished:
		waitWord = "waited for the lock"
	}
	t.fact("timeline", "A HELD, uncommitted; %s; B %s; A committed; %s", fault, waitWord, bState)
	t.fact("end", "total %d, active %d, available %d", a1.Total, a1.Active, a1.Available)
	t.check(strategy.NoOversell, "a second holder of the lock sells nothing the first one sold", a1.Oversold() == 0,
		fmt.Sprintf("%s; then %d active for %d units", fault, a1.Active, a1.Total), reqA.Key, reqB.Key)
	t.check(Base, "B gets a definite answer: the fault touched nothing PostgreSQL does", opB.Type != OpInfo,
		fmt.Sprintf("%s; B: %s", fault, opB.Err), reqB.Key)
	t.check(Base, "A's unlock at its commit leaves the lock B took (the unlock compares its token)", bLock != keyMissing,
		fmt.Sprintf("%s; B held the lock and waited on A's row; after A committed, %s", fault, lockState(bLock)), reqA.Key, reqB.Key)
	return nil
}

// keyMissing is PTTL's answer for a key that does not exist, as go-redis
// returns it.
const keyMissing = time.Duration(-2)

// lockState names a PTTL answer.
func lockState(pttl time.Duration) string {
	switch pttl {
	case keyMissing:
		return "gone"
	case -1: // go-redis gives PTTL's -1 and -2 as those durations
		return "held without expiry"
	}
	return "held"
}

// waitKeyGone polls PTTL until the key no longer exists (the one wait in
// the harness that is a TTL: an expiry can only be waited for), and
// returns how long it took.
func waitKeyGone(ctx context.Context, rdb *redis.Client, key string, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		pttl, err := rdb.PTTL(ctx, key).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return 0, fmt.Errorf("poll lock %s: %w", key, err)
		}
		if pttl == keyMissing {
			return time.Since(start), nil
		}
		if time.Since(start) > limit {
			return 0, fmt.Errorf("lock %s still exists after %v", key, limit)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
	}
}
