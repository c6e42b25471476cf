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
//     (sqlInsertAndTake), sent in autocommit: the server inserts, locks,
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
//     memquota do, and a trigger keeps every stock row in place.
//
// Its reservation table also writes fewer index entries than hotrow's: the
// key is the primary key (no surrogate id), and there is no index of due
// HELD rows (the expiry job scans the one-active index; schema.sql says
// what that saved and what it costs).
//
// # The statement
//
//	WITH ins AS (INSERT INTO onetrip_reservation ... VALUES (...) RETURNING sku, expires_at)
//	UPDATE onetrip_stock SET available = available - 1 WHERE sku = (SELECT sku FROM ins)
//	RETURNING (SELECT expires_at FROM ins)
//
// It does on the way to HELD nothing but what a one-statement reservation
// must: write the row, decrement. Every other answer is the statement
// failing, which undoes it whole, insert included:
//
//   - a known key, or an active reservation of the same user and SKU: the
//     insert fails on one of the two unique indexes (23505);
//   - no unit: the decrement fails the stock row's CHECK (available >= 0,
//     SQLSTATE 23514). PostgreSQL evaluates the CHECK before it writes the
//     row: on the statement's snapshot first (no unit there fails at once,
//     without waiting for a release in flight: SOLD_OUT is true of that
//     snapshot), and again on the newest version once a decrement in
//     flight was waited for.
//
// A second statement, sqlWhyNot, in a new snapshot, then gives the answer
// in hotrow's order: the reservation that owns the key (REPLAY, or
// KEY_REUSED for another user or SKU), then the user's active reservation
// (USER_LIMIT), then SOLD_OUT. TestRoundTrips counts them with a pgx
// tracer: HELD 1, every other answer 2.
//
// An earlier version made no answer an error: it read the stock row in the
// statement's snapshot first, inserted with ON CONFLICT DO NOTHING and
// undid a row whose unit was gone with a second insert that always failed.
// Those checks cost the server more per reservation than writing the row
// did: make bench at commit aa3c4d2 measured that version at 0.66 [0.57,
// 0.80] of the bare UPDATE's peak, and the insert and decrement alone (its
// insert-update control, pgbench.go) at 0.82 [0.67, 0.99].
// What an error costs instead: pgx prepares a statement again after it
// failed, one more round trip for the connection's next request; and a
// refused request wrote a row version that is dead at once (vacuum's). A
// sold-out SKU would pay both on every request, so a node that finds a SKU
// empty remembers it (node.soldOut, a hint per SKU, never an answer) and
// sends sqlWhyNot first, which also reads the stock: SOLD_OUT in one round
// trip, writing nothing, until a unit comes back (TestSoldOutThenBack).
// Only requests that race for the last units, or that meet a conflict,
// fail a statement.
//
// # Guarantees, and why
//
// They are hotrow's (the package doc of hotrow has the argument) and hold
// under READ COMMITTED, the only level onetrip runs at:
//
//   - No oversell, conservation: a unit leaves the stock only in the
//     statement that inserts its reservation, only when the row's newest
//     version, under its lock, keeps available >= 0 after the decrement (a
//     decrement in flight is waited for, then re-evaluated: docs 13.2.1),
//     and a reservation without its unit never commits (the CHECK fails
//     the whole statement; the trigger keeps the row the UPDATE must
//     find). Units come back only with the transition that moved the row,
//     in the same statement (transitions.go, hotrow's statements).
//   - One reservation per key, one active per user and SKU: the unique
//     index on request_key and the partial unique index on (sku, user_id)
//     refuse the insert. A conflicting insert in flight is waited for. A
//     request that did not hold looks its key up first, so a request that
//     lost to its own twin is REPLAY, never USER_LIMIT, and a twin that
//     took the last unit is REPLAY, never SOLD_OUT (its commit came before
//     this request found the row empty).
//   - No phantom sold-out: a decrement in flight is waited for, never
//     skipped; SOLD_OUT means the newest committed version had no unit
//     when the statement had the row, or, when sqlWhyNot went first, in
//     its snapshot (taken while the request was in flight).
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
// MultiXact. The requests that race for the last units, and those that
// meet a conflict, each insert a row and then fail: a refusal that costs an
// error, a dead row version, and on its connection a new Prepare.
//
// onetrip runs at READ COMMITTED only. At REPEATABLE READ or SERIALIZABLE
// a request that waited for the row would fail with 40001 instead of
// re-evaluating it, and the retries would give back what the single
// statement saves; hotrow's variants show that cost.
package onetrip
