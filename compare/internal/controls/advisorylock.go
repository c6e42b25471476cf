package controls

import (
	"github.com/reservebench/reservebench/advisorylock"
	"github.com/reservebench/reservebench/strategy"
)

// advisorylockMistakes are advisorylock with one mistake each (in the lock
// its attempts held open take, or in the isolation level its transactions
// begin at), claiming what advisorylock claims.
func advisorylockMistakes() []Control {
	noWait := advisorylock.New(advisorylock.Options{})
	noWait.Claims |= strategy.NoWait
	return []Control{fromStrategy(reserveOnlyMeta(noWait),
		"ctl-advisory-claims-no-wait", "advisorylock, plain requests only, claiming no-wait", "C28-14",
		"claims no-wait, with no attempt held open for the phantom scenario to try: its requests queue on the SKU's advisory lock, a lock no row of its tables shows (outsider round 50's m37)",
		inContract(strategy.NoWait, "checkNoWaitUnderLoad")),
		fromStrategy(advisorylock.New(advisorylock.Options{SessionLockApart: true}),
			"ctl-session-lock-apart", "advisorylock with one mistake", "C28-14",
			"an attempt held open takes the SKU's advisory lock under another key than a plain request: the two never exclude each other, and both take the last unit",
			inContract(strategy.NoOversell, "checkPlainBesideSession")),
		fromStrategy(advisorylock.New(advisorylock.Options{ServerDefaultIsolation: true}),
			"ctl-advisory-default-isolation", "advisorylock with one mistake", "new",
			"transactions begin at the server's default isolation level, which a DBA set to REPEATABLE READ: a request that waited for the SKU's lock counts from a snapshot taken before the wait, and takes the unit the holder sold",
			inContract(strategy.NoOversell, "checkAtDefaultIsolation")),
		fromStrategy(advisorylock.New(advisorylock.Options{LockByPosition: true}),
			"ctl-advisory-lock-by-position", "advisorylock with one mistake", "new",
			"the SKU's advisory lock id is its position in the deployment's configuration: a second process that lists the SKUs in another order locks another SKU's id, and its request beside an attempt of the first takes the unit the attempt sold",
			inContract(strategy.NoOversell, "checkAttachedInOtherOrder")),
		fromStrategy(advisorylock.New(advisorylock.Options{LockFirstAttemptOnly: true}),
			"ctl-advisory-lock-first-attempt", "advisorylock with one mistake", "new",
			"a session takes its advisory lock in its first attempt only (\"held until the session ends\"): a cart's second SKU is reserved under the first SKU's lock, and a plain request for it sells its last unit too",
			inContract(strategy.NoOversell, "checkPlainBesideSession")),
		fromStrategy(advisorylock.New(advisorylock.Options{UserFoldedOnReplay: true}),
			"ctl-replay-user-folded", "advisorylock with one mistake", "new",
			"a known key's user is compared ignoring case (\"usernames are case-insensitive\"): Alice's resend of alice's key is answered REPLAY with alice's reservation, not KEY_REUSED (outsider round 41)",
			inContract(contract, "checkDistinctText")),
		fromStrategy(advisorylock.New(advisorylock.Options{SoldOutBeforeKey: true}),
			"ctl-sold-out-before-key", "advisorylock with one mistake", "new",
			"under the SKU's lock the count comes first: a SKU with no unit left is SOLD_OUT before the key is looked up, so another user's request for the key that took the last unit, having waited behind it, is told SOLD_OUT, not KEY_REUSED (outsider round 44's ctr8)",
			inContract(contract, "checkKeyBehindLastUnit")),
		fromStrategy(advisorylock.New(advisorylock.Options{BigSKUNoLock: true}),
			"ctl-big-sku-no-lock", "advisorylock with one mistake", "new",
			"a plain request for a SKU of 1,000 units or more takes no lock (\"nobody races for the last of a thousand\"): beside an attempt held open on the last unit it counts the unit as free and sells it again (outsider round 49's m19)",
			inContract(contract, "checkExpireAllDue")),
		fromStrategy(advisorylock.New(advisorylock.Options{RestartLockApart: true}),
			"ctl-restart-lock-apart", "advisorylock with one mistake", "C28-15",
			"a node started by Restart takes its SKU locks in a namespace of its own: an attempt held open on it and a plain request on another node both take the last unit (outsider round 49's m21)",
			inContract(strategy.NoOversell, "checkPlainBesideSession")),
		fromStrategy(advisorylock.New(advisorylock.Options{DeadlockSoldOut: true}),
			"ctl-deadlock-sold-out", "advisorylock with one mistake", "new",
			"an attempt held open that PostgreSQL ends as a deadlock's victim answers SOLD_OUT (\"it lost the race\"): two carts that took two SKUs in opposite orders, with units left on both, are told one is sold out (outsider round 49's m17)",
			inContract(contract, "checkDeadlockVictim")),
		fromStrategy(advisorylock.New(advisorylock.Options{PlainDeadlockSoldOut: true}),
			"ctl-plain-deadlock-sold-out", "advisorylock with one mistake", "new",
			"a plain Reserve that PostgreSQL ends as a deadlock's victim answers SOLD_OUT (\"it lost the race\"): a request that waited for a key an attempt held open holds, while that attempt asked for the request's SKU, is told the SKU is sold out though it has units (outsider round 53's b05)",
			inContract(contract, "checkPlainDeadlockVictim")),
		fromStrategy(advisorylock.New(advisorylock.Options{SessionServerDefaultIsolation: true}),
			"ctl-session-default-isolation", "advisorylock with one mistake", "new",
			"attempts held open begin at the server's default isolation level (the plain path names READ COMMITTED): under a default of REPEATABLE READ a cart counts a SKU from its first statement's snapshot, and sells a unit a plain request took since (outsider round 49's m02)",
			inContract(strategy.NoOversell, "checkAtDefaultIsolation")),
		fromStrategy(advisorylock.New(advisorylock.Options{LockSaltPerProcess: true}),
			"ctl-lock-salt-per-process", "advisorylock with one mistake", "C28-15",
			"the SKU's advisory lock id hashes the SKU with a salt drawn once per process: the nodes of one process exclude each other, and a request from a second process beside an attempt of the first that holds every unit takes one too (outsider round 49's m01)",
			expect("kill-reserve", strategy.NoOversell)),
		fromStrategy(advisorylock.New(advisorylock.Options{SessionCountsOnce: true}),
			"ctl-session-counts-once", "advisorylock with one mistake", "new",
			"an attempt held open counts a SKU's active reservations once and keeps the count (\"it holds the SKU's lock\"): a unit released outside it since is not seen, and its next request for the SKU is SOLD_OUT (outsider round 49's m18)",
			inContract(strategy.NoPhantomSoldOut, "checkSessionSeesGiveBack")),
	}
}
