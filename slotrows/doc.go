// Package slotrows is strategy B of reservebench: one row per unit, claimed
// with SELECT ... FOR UPDATE SKIP LOCKED (seed 000, C28-13 and C28-14).
// It registers itself as [Name]; import it for that side effect or use the
// constructors every strategy package has: [Meta] (the registered default),
// [New] (a variant with other [Options]) and [Open], which returns the
// concrete [*Deployment] (strategy.Deployment, strategy.Restarter,
// strategy.Ager and the pgbench script of package bench). Meta.Attach opens
// a second process's deployment over stock already loaded: it writes
// nothing and refuses a SKU without stock or with another total.
//
// # Where correctness comes from
//
// Open pre-splits the stock of every SKU into slot rows numbered 1..total,
// in the same transaction as the SKU row (schema.sql). A slot row has one
// holder column, so a unit has at most one holder; the number of slot rows
// never changes, so active reservations never exceed the stock. Reserve
// claims a slot with one UPDATE whose WHERE carries holder IS NULL and whose
// subquery locks the slot FOR UPDATE SKIP LOCKED: under READ COMMITTED
// (every attempt begins so, whatever the server default) a slot taken since
// the statement's
// snapshot is re-checked on its newest version and passed over, and a slot
// locked by a claim in flight is skipped, never waited for. A slot becomes
// free again only in the statement that moves its holder out of HELD
// (Release, ExpireDue: WHERE status = 'HELD', RETURNING), and the units
// reported are the slots that statement freed, so a replayed, concurrent or
// rerun release returns each unit exactly once. UNIQUE (holder) adds the
// converse invariant, one slot per reservation.
//
// Requirements 2 and 3 are unique indexes, not reads: request_key (across
// the whole table) and (sku, user_id) WHERE status IN ('HELD', 'CONFIRMED').
// The reservation is inserted with ON CONFLICT DO NOTHING and no conflict
// target, so both indexes are arbiters: a conflict with an attempt in flight
// waits for it and then inserts nothing, and the statement never fails with
// 23505. Nothing inserted, the key is looked up first (REPLAY, KEY_REUSED)
// and only then is the answer USER_LIMIT, so a request that raced its own
// twin is REPLAY (the seed's {HELD=1, REPLAY=14, USER_LIMIT=1} cannot
// happen). The insert comes before the claim: a repeated key never locks a
// slot it will not take, and REPLAY is answered even when the stock is gone.
// No slot: SOLD_OUT, and the insert is undone (the plain path rolls its
// transaction back; a session rolls back to a savepoint). See reserveIn.
//
// Available is derived: Audit counts free slot rows against the HELD and
// CONFIRMED reservations (drift 0 when every held slot has an active holder).
// All state is in the database: nodes are handles on one pool, and a restart
// loses nothing.
//
// Deployments with disjoint SKUs share one database and one set of tables.
// Reserve refuses a SKU outside its deployment's config (BAD_REQUEST, nothing
// written); Audit, MakeDue, ExpireDue, Confirm and Release touch only the
// deployment's SKUs. Request keys are unique across the database: a key one
// deployment holds is KEY_REUSED in another, and Lookup finds it from any.
// A node that was restarted, or whose deployment was closed, answers
// strategy.ErrNodeClosed; a session used after its end,
// strategy.ErrSessionEnded.
//
// # The boundary: phantom sold-out
//
// A claim skips slots that other attempts have locked but not committed. If
// such an attempt then rolls back, its slot was free all along, and a request
// that found only locked slots was told SOLD_OUT while a unit remained
// (seed C28-14; the SELECT docs call this an inconsistent view). B does not
// claim strategy.NoPhantomSoldOut. TestPhantomSoldOut runs the exact
// sequence: 2 units; t1 claims slot 1 and holds its attempt open; t2 gets
// slot 2; t3 is told SOLD_OUT without ever being blocked; t1 rolls back; one
// unit is free; t3's retry gets it. The kit's phantom scenario reports it as
// an observed boundary.
//
// What a user of B must add: SOLD_OUT means "no slot free and unlocked right
// now", not "none left". Treat it as final only when the committed free-slot
// count is 0 (Audit's Available; the phantom case has Available > 0), and
// otherwise retry after a short backoff, a bounded number of times: the
// attempts in flight finish within a transaction's time. When the count is
// 0, re-offer the sale later: releases, expiries and rolled-back attempts
// free slots again.
//
// B never waits for another attempt's claim (strategy.NoWait: t3 above
// answers at once). It does wait, in the unique index, for an attempt in
// flight with the same key or the same user and SKU: its answer (REPLAY or
// USER_LIMIT, or HELD if that attempt rolls back) depends on that attempt's
// outcome. The kit's same-key and same-user interleavings see that wait; see
// TestConformance. One more wait is seen that B does not ask for: with 16
// claims at once (the kit's checkNoWaitUnderLoad), a claim's UPDATE waits on
// another claim's transaction (a transactionid lock in pg_blocking_pids,
// the other attempt between its statements) about once in 40 probes, for
// the milliseconds until that attempt ends. It is a row wait inside
// PostgreSQL's execution of the claim, not a queue: an attempt held open
// (the phantom interleaving) never blocks t3, and the load check judges
// only waits on locks that are not a row's.
//
// # Which free slot a claim picks
//
// [LowestFirst] (the default) takes the lowest free slot: one probe at the
// head of the partial index of free slots, reproducible runs (t1 gets slot
// 1, t2 slot 2), and concurrent claimers collide at the head, each skipping
// the slots locked by the claims in flight ahead of it (a failed conditional
// row lock each, bounded by the pool size). [KeyHashFirst] starts at
// 1 + hash(key) mod total and wraps around, so concurrent claimers rarely
// meet and the index entries of taken slots do not pile up at the head, at
// the cost of a second probe once the slots above the start are gone. Both
// are one statement (sqlClaimSlot, LowestFirst is start 1); the benchmark
// compares them through New. Without the partial index on free slots a
// claim scans the taken slots (seed: 900 claims/s fell to 90/s on 200,000
// slots); TestClaimUsesFreeSlotIndex checks the plans use it.
//
// # Tests, per claim
//
//	no-oversell          TestContention (C28-13), TestStormBoundedPool (10,000 for 1 unit, pool 16), kit contention, storm, skew
//	idempotent-key       TestDuplicateKeyAndUserLimitStorms (50 trials), TestKeyReused, TestReplayWhenSoldOut, kit duplicate-key, same-key
//	one-active-per-user  TestDuplicateKeyAndUserLimitStorms, kit user-limit, same-user
//	return-once          TestExpiryReplay (C28-07), TestConfirmVsExpire (C28-08), TestConfirmModes, kit release-replay
//	conserves            every test's audit (drift 0), kit every scenario
//	no-wait              TestPhantomSoldOut, TestNoWait (kit phantom with every claim)
//	survives-restart     TestRestartAndClose, kit restart
//	(boundary)           TestPhantomSoldOut: no-phantom-sold-out is not claimed
package slotrows
