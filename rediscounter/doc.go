// Package rediscounter is the design most flash-sale systems ship: the
// stock of a SKU is a counter in Redis, checked and decremented by one Lua
// script (atomic in Redis), and the reservation row is written to
// PostgreSQL afterwards. Returns (release, expiry) move the row first and
// give the unit back in Redis after. Per-key and per-user markers kept
// with the counter make a resend safe and a give-back happen once.
//
// Its guarantees hold exactly as long as Redis keeps the counter and the
// markers, so the package registers four variants, one for each answer to
// "what survives a restart of Redis" (Keep):
//
//	rediscounter               nothing; a missing counter is reloaded from the config
//	rediscounter-aof-everysec  AOF, appendfsync everysec
//	rediscounter-aof-always    AOF, appendfsync always
//	rediscounter-recover       nothing; a missing counter, and a restarted node,
//	                           recount from the reservations in PostgreSQL
//
// Each declares the redis.conf settings it relies on in Meta.Needs, and Open
// refuses (strategy.ErrConfig) a Redis that runs without them: every variant
// needs maxmemory-policy noeviction (an evicted counter or marker loses or
// doubles units while Redis runs), and the variants that keep nothing need
// save "" (a restart from a snapshot brings back a stale counter that no
// recount corrects, because it is not missing). Every variant
// claims no oversell, idempotent keys, one active reservation per user,
// return-once and conservation while Redis runs; only the recount claims to
// survive a restart. What each loses is measured, with real SIGKILLs of
// redis-server, by the redis-restart scenario (Redis SIGKILLed and
// restarted on its files, stopped, restarted empty) and the node-death
// scenario (requests that die between the Lua decrement and the insert),
// and shown in table 28-1 as observed boundaries with their counts.
//
// # Boundaries
//
//   - Between the script and the insert a unit is in no row. A request that
//     dies there loses it from the counter (undersell) until a resend of the
//     same request inserts the row (its key is marked) or a recount
//     (rediscounter-recover, at a node's restart) gives back the units of
//     that node's dead requests. The restart first waits for the node's own
//     requests, and keeps the units of keys other nodes took and have not
//     committed (each key's node is marked): a recount of the committed
//     rows alone sold those again (restart-in-flight). A key is marked with
//     every node that took or resent it, and a node's recount takes only
//     its own mark off: the unit comes back when no node is left. So the
//     recount of the node where the first attempt died leaves the unit to
//     the resend in flight, and the recount of a resend's node leaves it to
//     the first attempt still on its way (the deployment contract's two
//     resend-and-restart checks; until 2026-12-05 a resend replaced the
//     mark, and the second case sold the unit twice). A request of another
//     node that died in the window keeps its unit until that node restarts.
//     A recount after Redis lost the counter has no markers to keep: a
//     request that had its unit from the old Redis and commits its row
//     after the recount can have that unit sold again (a narrow window; the
//     redis-restart scenario's in-flight requests lose their replies first).
//   - Redis restarted without the counter: reloading from the config sells
//     the whole stock again (oversell by every unit sold before); AOF brings
//     the counter back after a SIGKILL of redis-server (a write reaches the
//     kernel before its reply), but not after the files are lost.
//     everysec and always differ only in what a machine crash or power cut
//     loses (up to a second of writes against none), which SIGKILLing a
//     process cannot show.
//   - A row moved by a transition whose give-back does not reach Redis (a
//     crash after the UPDATE, an UPDATE whose COMMIT outlived its caller's
//     deadline) keeps its unit out of the counter (undersell) until the
//     expiry job's next run gives back the unit of every row still marked
//     unit_owed, or the release is sent again. A deployment that never runs
//     the job keeps such units out, and its unit_owed rows accumulate (the
//     job clears the mark of every release as well).
//   - No sessions: the decrement is not part of a PostgreSQL transaction, so
//     an attempt cannot be held open, and the interleavings are n/a.
package rediscounter
