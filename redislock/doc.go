// Package redislock is seed 002 as a strategy: a per-SKU lock in Redis in
// front of strategy A's transaction. A reservation looks its key up, checks
// the stock (SOLD_OUT without the lock when it is gone), takes the SKU's
// lock (SET NX PX with a random token; waits up to 3 s, polling, then
// answers BUSY, the seed's 429), and under it checks the stock again (the
// double check) and runs the conditional UPDATE with the reservation row in
// one transaction; the lock is released after the commit, by a Lua
// compare-and-delete so that only its holder can release it. The lock is
// taken without a lease time, so a watchdog renews a 30 s lease every 10 s
// while the work runs (Redisson's lockWatchdogTimeout). The lock comes from
// github.com/bsm/redislock (SET NX PX, token, Lua refresh and release);
// this package adds what that library lacks: the watchdog, and the cleanup
// of a take abandoned at the wait bound whose SET may have reached Redis.
//
// # Guarantees, and why
//
// The seed's argument is that the database condition, not the lock,
// prevents oversell: the last line is
//
//	UPDATE redislock_stock SET available = available - 1 WHERE sku = $1 AND available > 0
//
// which PostgreSQL re-evaluates on the newest committed row under its row
// lock (READ COMMITTED), exactly as in hotrow. The lock only queues the
// buyers of a SKU so that they rarely meet in PostgreSQL. The harness
// proves it with the lock-fault scenarios, which make the lock stop
// protecting a holder whose UPDATE is done but not committed: its unlock
// runs before its commit (seed 002's 11-step timeline), its lease expires
// while it stalls, or Redis is SIGKILLed and restarted empty. Each time the
// second buyer takes the lock, passes the double check on a stale read,
// waits on the first one's row lock (seen in pg_blocking_pids), and after
// the first commits its UPDATE moves no row: SOLD_OUT, one order. The
// negative control ctl-lock-only (Options.LockOnly: no condition, no
// CHECK) sells the unit twice in all three, so the lock alone is not the
// guarantee. Two more controls (Options.Mistake) oversell nothing and are
// caught all the same: an unlock by plain DEL deletes the lock the second
// buyer holds, and an UPDATE without its condition leaves the CHECK to
// refuse the second sale as an error instead of SOLD_OUT. Keys, the one-per-user rule and return-once come from the
// same unique indexes and status conditions as hotrow's.
//
// Redis down: a request cannot take the lock and is answered BUSY (nothing
// written, safe to resend); the redis-restart scenario shows nothing sold
// twice across SIGKILL, stop and an empty restart. 10,000 requests at once
// for 1 unit end with exactly 1 reservation (TestStorm); the others are
// SOLD_OUT, or BUSY when the lock's queue outlasts the 3 s wait (thousands
// of them in the storm: the waiters' double checks queue on the connection
// pool behind the pre-checks).
//
// # Boundary
//
// Every request for a SKU waits for its lock (not claimed: no-wait); the
// phantom scenario shows t2 and t3 waiting for t1. A process that dies
// holding the lock leaves it for the rest of its lease: up to 30 s of BUSY
// for that SKU (kill-reserve reports it). Each reservation costs Redis
// round trips on top of hotrow's SQL (two without contention, many more
// while waiters poll) and three PostgreSQL round trips more (the lookup and
// the two checks).
package redislock
