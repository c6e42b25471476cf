package controls

import (
	"github.com/reservebench/reservebench/redislock"
	"github.com/reservebench/reservebench/strategy"
)

// lockOnly is seed 002's strategy with its last line removed: the per-SKU
// Redis lock, the double check under it, and an UPDATE without
// available > 0 (and no CHECK). It claims what redislock claims. While the
// lock holds it sells exactly; once the lock stops protecting a holder's
// open work (an unlock before the commit, a lease that expires during a
// pause, Redis restarted empty), a second holder's stale double check lets
// it sell the unit again: the lock alone is not the guarantee.
func lockOnly() Control {
	m := redislock.New(redislock.Options{LockOnly: true})
	m.Claims = redislock.Claims
	return fromStrategy(m, "ctl-lock-only", "redislock without the conditional UPDATE (the lock alone decides)", "seed 002",
		"the Redis lock and the double check decide alone: the UPDATE has no available > 0",
		join(
			expect("lock-early-unlock", strategy.NoOversell),
			expect("lock-expiry", strategy.NoOversell),
			expect("lock-redis-restart", strategy.NoOversell),
		))
}

// lockMistakes are redislock with one mistake in how it uses the lock or
// the database under it, claiming what redislock claims. None oversells,
// and each passed every scenario until the lock faults (redis-restart's
// stall for ctl-lock-unlock-error-is-busy; the deployment contract for the
// last two) checked what it breaks.
func lockMistakes() []Control {
	var out []Control
	for _, c := range []struct {
		mistake      redislock.Mistake
		name, breaks string
		scenarios    []string
	}{
		{redislock.UnlockByDelete, "ctl-lock-unlock-by-delete",
			"the unlock deletes the lock's key without comparing its token: a holder whose lease expired deletes its successor's lock",
			[]string{"lock-expiry", "lock-redis-restart"}},
		{redislock.ConditionInCheckOnly, "ctl-lock-check-refuses",
			"the UPDATE has no available > 0; only the table's CHECK refuses the second holder's oversell, as an error",
			[]string{"lock-early-unlock", "lock-expiry", "lock-redis-restart"}},
		{redislock.UnlockErrorIsBusy, "ctl-lock-unlock-error-is-busy",
			"a request whose unlock failed after its COMMIT (Redis stopped answering) is answered BUSY: its client is told nothing was written, and its reservation is",
			[]string{"redis-restart"}},
		{redislock.BusyWhenLost, "ctl-lock-lost-is-busy",
			"a request whose watchdog found its lock taken by another while it worked is answered BUSY after its COMMIT (\"the answer cannot be trusted: try again\"): its client is told nothing was written, and its reservation is",
			[]string{"deployment-contract"}},
	} {
		var exp []Expectation
		for _, sc := range c.scenarios {
			exp = append(exp, expect(sc, contract)...)
		}
		out = append(out, fromStrategy(redislock.New(redislock.Options{Mistake: c.mistake}),
			c.name, "redislock with one mistake", "seed 002", c.breaks, exp))
	}
	return append(out, fromStrategy(redislock.New(redislock.Options{Mistake: redislock.WaitIsSoldOut}),
		"ctl-lock-wait-sold-out", "redislock with one mistake", "seed 002",
		"a request whose lock was not granted within its wait (3 s) is answered SOLD_OUT (\"a queue that long means the SKU is gone\"), while the holder's attempt may roll back and a unit is free",
		inContract(strategy.NoPhantomSoldOut, "checkWaitOutlastsTimeouts")),
		fromStrategy(redislock.New(redislock.Options{Mistake: redislock.DoubleCheckStockOnly}),
			"ctl-lock-double-check-stock-only", "redislock with one mistake", "seed 002",
			"the double check under the lock answers SOLD_OUT when no unit is left without looking the key up again: a twin that waited for the lock while the first request committed the last unit is told SOLD_OUT, though its own reservation holds the unit",
			inContract(contract, "checkTwinBehindRedis")),
		fromStrategy(redislock.New(redislock.Options{Mistake: redislock.SetFromCheck}),
			"ctl-lock-set-from-check", "redislock with one mistake", "new",
			"under the lock the double check's read is taken as the truth and the UPDATE writes available = <that read> - 1: when two holders overlap, the second writes the first's decrement again, and two reservations take one unit (outsider round 40's m5)",
			inContract(strategy.Conserves, "checkLockLostUpdate")),
		fromStrategy(redislock.New(redislock.Options{Mistake: redislock.GoneAfterCommitIsBusy}),
			"ctl-lock-gone-after-commit-busy", "redislock with one mistake", "new",
			"a request whose caller gave up by the time its COMMIT and its unlock are done is answered BUSY (\"the caller left: try again\"): its client is told nothing was written, and its reservation is (outsider round 40's m6)",
			inContract(contract, "checkGivenUpAfterCommit")),
		fromStrategy(redislock.New(redislock.Options{Mistake: redislock.PreCheckStockOnly}),
			"ctl-lock-pre-check-stock-only", "redislock with one mistake", "new",
			"the unlocked pre-check answers SOLD_OUT when it reads no unit left without looking the key up again: a twin that read its key before the first request committed the last unit, and the stock after, is told SOLD_OUT, though its own reservation holds the unit",
			inContract(contract, "checkTwinBehindTableLock")),
		fromStrategy(redislock.New(redislock.Options{Mistake: redislock.PreCheckUser}),
			"ctl-lock-pre-check-user", "redislock with one mistake", "new",
			"the unlocked pre-check, right after the key, answers USER_LIMIT when the user holds the SKU, without looking the key up again: a twin that read its key before the first request committed, and the user's reservations after, is told USER_LIMIT about its own reservation (outsider round 45's m08)",
			inContract(contract, "checkTwinBetweenStatements")),
		fromStrategy(redislock.New(redislock.Options{Mistake: redislock.LastUnitWaitSoldOut}),
			"ctl-lock-last-unit-wait-sold-out", "redislock with one mistake", "new",
			"a request that read one unit left before the lock, and had to wait for the lock, answers SOLD_OUT (its key looked up first): a phantom when the last unit's holder rolls back (outsider round 45's m13)",
			inContract(strategy.NoPhantomSoldOut, "checkNewBehindLastUnitRolledBack")),
		fromStrategy(redislock.New(redislock.Options{Mistake: redislock.AbandonByDelete}),
			"ctl-lock-abandon-by-delete", "redislock with one mistake", "new",
			"a lock take given up (its wait bound passed, its caller gone) deletes the SKU's lock by DEL, not by its token: the SKU is free under the holder still at work (outsider round 45's m09)",
			inContract(contract, "checkGivenUpLeavesLock")),
		fromStrategy(redislock.New(redislock.Options{Mistake: redislock.LockWaitSticky}),
			"ctl-lock-wait-sticky", "redislock with one mistake", "new",
			"the strategy.LockWait of a request that waited for the lock is never cleared: it says \"waiting\" after the lock is taken and after the answer, and the kit goes on before the request waits anywhere (outsider round 45's m01)",
			inContract(contract, "checkLockWaitReported")),
		fromStrategy(redislock.New(redislock.Options{Mistake: redislock.SessionRelocks}),
			"ctl-lock-session-relocks", "redislock with one mistake", "new",
			"every attempt of a session takes the SKU's lock, also when its own session holds it: a second unit of one SKU in one session waits for itself until its bound (3 s) and is answered BUSY",
			inContract(contract, "checkTTLMicroseconds")))
}
