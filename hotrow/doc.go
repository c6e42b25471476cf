// Package hotrow is strategy A of reservebench, the reference design (seed
// 000): one stock row per SKU, decremented by a conditional UPDATE.
//
// # Mechanism
//
// The schema (schema.sql) has one row per SKU in sku_stock (total,
// available, CHECK 0 <= available <= total) and one row per request key in
// reservation (UNIQUE request_key, a status CHECK, expires_at), with the
// partial unique index reservation_one_active on (sku, user_id) WHERE status
// IN ('HELD', 'CONFIRMED'). A reservation is one transaction:
//
//	SAVEPOINT
//	INSERT INTO reservation ... 'HELD' ... ON CONFLICT (request_key) DO NOTHING RETURNING ...
//	    no row:             the key is known: REPLAY, or KEY_REUSED if user or SKU differ
//	    23505 on the user index: look the key up first (REPLAY if found), else USER_LIMIT
//	UPDATE sku_stock SET available = available - 1 WHERE sku = $1 AND available > 0
//	    0 rows:             ROLLBACK TO SAVEPOINT (the insert goes too): SOLD_OUT
//	COMMIT                  (HELD)
//
// Node.Reserve runs it in its own transaction; Session.Reserve runs the same
// function (reserveInTx) inside a transaction the caller commits or rolls
// back. Confirm, Release and ExpireDue are single statements whose WHERE
// carries status = 'HELD'; Release and ExpireDue give units back in the same
// statement, counted from the rows they moved (RETURNING), never from ids
// read earlier. Nodes keep nothing in memory but the deployment's SKU list.
//
// # Guarantees, and why
//
// They hold under READ COMMITTED, the default and the level the argument is
// made for. PostgreSQL's documentation (13.2.1, Read Committed Isolation
// Level) says that an UPDATE finding its target row changed by a concurrent
// transaction still in progress waits for that transaction; if it commits,
// the UPDATE re-evaluates its WHERE clause on the newest version of the row
// and updates it only if it still matches; if it rolls back, the UPDATE
// proceeds on the version it found. So every decrement of a SKU checks
// available > 0 on the value the previous decrement committed, under the row
// lock, and at most total decrements ever succeed.
//
//   - No oversell, conservation (claims NoOversell, Conserves): units leave
//     stock only through the conditional decrement, which commits together
//     with its reservation row; units come back only with the transition that
//     moved the row. So total - available == HELD + CONFIRMED rows.
//     TestContention: 120 users, 40 units, 2 nodes: HELD 40, SOLD_OUT 80,
//     available 0, drift 0, no retry. TestStorm: 10,000 requests for 1 unit
//     through a 16-connection pool: HELD 1, SOLD_OUT 9,999, never more than
//     16 backends. TestWaitThenReevaluate/commit: a waiter on the last unit
//     re-evaluates after the holder's commit and answers SOLD_OUT.
//   - One reservation per key (IdempotentKey): request_key is UNIQUE and the
//     arbiter of ON CONFLICT; rows are never deleted, so a known key is
//     always REPLAY (its current status) or KEY_REUSED (the owner's
//     reservation). A concurrent request with the same key can reach
//     reservation_one_active before request_key and fail there with 23505
//     (the seed's intermittent {HELD=1, REPLAY=14, USER_LIMIT=1}); the key
//     is looked up before USER_LIMIT is answered. TestDuplicateKeyAndUserLimit
//     repeats 16 same-key requests 50 times, {HELD 1, REPLAY 15} every time;
//     TestSameKeyReachesUserIndexFirst steps through that race
//     deterministically and shows REPLAY; TestKeyReused.
//   - One active reservation per user and SKU (OneActivePerUser): the
//     partial unique index. TestDuplicateKeyAndUserLimit: 8 keys of one user
//     give {HELD 1, USER_LIMIT 7}, 50 times; the stock is down by exactly 2.
//   - Units return exactly once (ReturnOnce): every transition's WHERE has
//     status = 'HELD'; of racing transitions the first to commit moves the row
//     and the others re-evaluate the WHERE and move nothing. TestExpiryReplay
//     (C28-07: 8, 0, 0 in total for 4 concurrent replays, then 12),
//     TestConfirmVsExpire (C28-08: every row CONFIRMED or EXPIRED, units back
//     only for EXPIRED), TestReleaseReplay (1, then 0), TestConfirmModes.
//   - No phantom sold-out (NoPhantomSoldOut): an uncommitted decrement is
//     waited for, never skipped, so SOLD_OUT means the newest committed
//     version had no unit when the UPDATE ran. TestPhantomInputWaitsThenSucceeds
//     (C28-14). (A unit that a release or expiry still in flight is giving
//     back is not waited for: the answer is SOLD_OUT as of the last commit.
//     Under REPEATABLE READ and SERIALIZABLE "the last commit" is the one
//     before the transaction's snapshot, taken at its INSERT.)
//   - Restart loses nothing (SurvivesRestart): the database is the whole
//     state. TestRestart, and the kit's restart scenario.
//
// TestConformance runs the conformance kit (strategytest) over all of it.
//
// # The boundary: who waits, and when
//
// hotrow does not claim NoWait. The row lock taken by the decrement is held
// until its transaction ends, so:
//
//   - A Reserve of a SKU waits while another transaction holds an
//     uncommitted decrement of that SKU: a session held open, or simply a
//     reservation between its UPDATE and its COMMIT. When the holder commits,
//     the waiter re-evaluates (SOLD_OUT if the holder took the last unit);
//     when it rolls back, the waiter gets the unit. TestPhantomInputWaitsThenSucceeds:
//     2 units, t1 holds its attempt open, t2 and t3 are seen blocked in
//     pg_blocking_pids, t1 rolls back, t2 and t3 are HELD.
//     TestWaitThenReevaluate shows both ends.
//   - A request with the same key, or the same user and SKU, as an
//     uncommitted attempt waits for it in the unique index, then answers
//     REPLAY or USER_LIMIT. Requests for other SKUs, replays of committed
//     keys, KEY_REUSED, Lookup and Audit do not wait (TestWhoWaits).
//
// So the decrements of one SKU run one commit at a time, and one slow or
// stuck transaction on a SKU stalls every buyer of it. The waiters sit in
// PostgreSQL holding a connection each; the pool (Config.DB) bounds how many
// (TestStorm), and bounded admission in front of the strategy bounds the rest.
//
// # What breaks it
//
//   - Deciding in the application: SELECT available, compare, then an
//     unconditional UPDATE. The window between read and write is not under
//     the row lock, and concurrent buyers oversell.
//   - Splitting a SKU's stock over several rows without a new condition: a
//     per-row available > 0 no longer bounds the total.
//   - Decrementing in another transaction than the reservation insert, or
//     returning units in another transaction than the status change: a crash
//     between them leaves drift (the negative controls C28-10..12 of compare).
//   - A transition without status = 'HELD', or counting returned units from
//     ids read earlier: replays return units twice.
//   - Answering every 23505 as USER_LIMIT: a same-key replay is misreported
//     (TestSameKeyReachesUserIndexFirst fails with that change).
//   - REPEATABLE READ or SERIALIZABLE without retries: a waiter whose snapshot
//     predates the holder's commit fails with 40001 instead of re-evaluating
//     (TestIsolationWaiterAfterCommit; in TestIsolationContention most of the
//     120 requests fail, 74 to 104 in our runs). Options.Isolation selects
//     those levels, and the whole transaction is then retried up to
//     Options.MaxRetries times with a jittered pause; with retries the counts are exact again (HELD 40,
//     SOLD_OUT 80) and Deployment.Retries reports the cost. A Reserve that
//     lost on every attempt answers BUSY, nothing written
//     (TestRetriesSpentIsBusy). A Session never retries: its caller owns
//     the transaction.
//
// # Deployments and errors
//
// The package has the constructors every strategy package has: Name, Meta
// (the registered "hotrow"), New(Options) for a variant, and Open, which
// returns the concrete *Deployment (a strategy.Deployment, strategy.Restarter
// and strategy.Ager, with Retries and the pgbench scripts of package bench).
//
// Several deployments with disjoint SKUs share one database. Open creates the
// schema under an advisory lock when it is missing and loads the stock, in
// one transaction (strategy.ErrStockExists if any SKU exists). Meta.Attach
// writes nothing and only checks that the stock is there with the same
// totals, as a second process of the service would (TestAttach). A request
// for a SKU outside the deployment is BAD_REQUEST (strategy.UnknownSKU);
// ExpireDue, Confirm, Release, MakeDue and Audit touch only the deployment's
// SKUs; request keys are unique across the whole table, and Lookup sees
// every key. A node that was restarted or closed answers
// strategy.ErrNodeClosed; a session used after its end,
// strategy.ErrSessionEnded. SQLSTATEs are read from *pgconn.PgError codes
// and constraint names, never from message text. An error from Reserve
// other than a bad request leaves the outcome unknown to the caller, as the
// contract says: Lookup or a replay of the same request resolves it.
package hotrow
