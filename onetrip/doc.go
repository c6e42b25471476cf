// Package onetrip is hotrow's design with the row lock held for as little
// as one statement can hold it: the one-round-trip hot row.
//
// hotrow keeps a SKU's stock row locked from its UPDATE until the client's
// COMMIT arrives, one round trip later, and its reservation's foreign key
// turns every waiter's insert into a new MultiXact on that row; on the
// machine of docs/performance.md it peaks at half of what the server does
// with the bare UPDATE alone. onetrip keeps hotrow's tables, guarantees and
// answers and changes two things:
//
//  1. The decrement and the reservation row are one statement
//     (sqlTakeAndInsert), sent in autocommit: the server inserts, locks,
//     decrements and commits without waiting for the client, and a HELD
//     answer is one round trip. The row and its index entries are written
//     before the row is locked, so the lock is held for the decrement and
//     the commit (the WAL flush), as in the bare UPDATE, never for a trip
//     to the client.
//  2. No foreign key from the reservation to the stock row (schema.sql), so
//     nothing ever takes a KEY SHARE lock on the row while another
//     transaction holds it: the row never becomes a MultiXact
//     (TestNoMultiXactOnTheStockRow shows one locker where hotrow shows a
//     MultiXact in the same situation). Reserve checks the SKU against the
//     deployment's config before it touches the database, as slotrows and
//     memquota do.
//
// # The statement
//
//	WITH seen AS (SELECT sku FROM onetrip_stock WHERE sku = $3 AND available > 0),
//	     ins  AS (INSERT INTO onetrip_reservation ... SELECT ... FROM seen ON CONFLICT DO NOTHING RETURNING ...),
//	     take AS (UPDATE onetrip_stock SET available = available - 1 WHERE ... available > 0 AND EXISTS (ins)),
//	     undo AS (INSERT INTO onetrip_no_unit ... WHERE a row went in and no unit came out)
//	SELECT unit_seen, expires_at
//
// HELD: a row was inserted and the unit taken, together. A row inserted
// for a unit that went while the statement waited for the stock row is
// undone by a constraint that always fails (undo: SQLSTATE 23514 on
// onetrip_no_unit_abort), so the statement writes nothing. Otherwise
// nothing was written and nothing locked, and a second statement,
// sqlWhyNot, in a new snapshot, gives the answer in hotrow's order: the
// reservation that owns the key (REPLAY, or KEY_REUSED for another user or
// SKU), then the user's active reservation (USER_LIMIT), then SOLD_OUT.
// TestRoundTrips counts them with a pgx tracer: HELD 1, every other answer
// 2. Only requests that raced for the last units meet the failing
// constraint (TestLastUnitWhileWaiting); no statement fails on a conflict
// (pgx drops a statement from its cache after any error, and the next
// request on the connection would pay two extra round trips).
//
// # Guarantees, and why
//
// They are hotrow's (the package doc of hotrow has the argument) and hold
// under READ COMMITTED, the only level onetrip runs at:
//
//   - No oversell, conservation: a unit leaves the stock only in the
//     statement that inserts its reservation, only when the UPDATE finds
//     available > 0 on the row's newest version under its lock (a
//     decrement in flight is waited for, then re-evaluated: docs 13.2.1),
//     and a reservation without its unit never commits (undo). Units come
//     back only with the transition that moved the row, in the same
//     statement (transitions.go, hotrow's statements).
//   - One reservation per key, one active per user and SKU: the unique
//     index on request_key and the partial unique index on (sku, user_id)
//     are the insert's arbiters. A conflicting insert in flight is waited
//     for. A request that did not hold looks its key up first, so a
//     request that lost to its own twin is REPLAY, never USER_LIMIT, and a
//     twin that took the last unit is REPLAY, never SOLD_OUT (its commit
//     came before this request found the row empty).
//   - No phantom sold-out: a decrement in flight is waited for, never
//     skipped; SOLD_OUT means the newest committed version had no unit.
//   - Restart loses nothing: the database is the whole state.
//
// TestConformance runs the conformance kit over all of it.
//
// # The boundary
//
// It is still a hot row: decrements of one SKU commit one at a time, each
// waiting for the previous one's WAL flush (the fsync probe of
// docs/performance.md bounds that at about one flush time per unit), and a
// session held open (strategy.Session) makes every other request for the
// SKU wait, as in hotrow. What it removes from the time the row stays
// locked is the client's round trip, the reservation's insert and the
// MultiXact. The requests that race for the last units each insert a row
// and then fail the undo constraint: a refusal that costs an error, and on
// its connection a new Prepare.
//
// onetrip runs at READ COMMITTED only. At REPEATABLE READ or SERIALIZABLE
// a request that waited for the row would fail with 40001 instead of
// re-evaluating it, and the retries would give back what the single
// statement saves; hotrow's variants show that cost.
package onetrip
