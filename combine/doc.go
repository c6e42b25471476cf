// Package combine is a hot row that shares its commits: each node gathers
// the concurrent requests for one SKU and serves them with one transaction,
// one conditional decrement by n and n reservation rows, and every request
// still gets its own exact answer.
//
// A hot row commits one decrement at a time, each waiting for the previous
// one's WAL flush (docs/performance.md: hotrow and the bare UPDATE). Only
// designs that share a commit get past that; combine shares it between the
// requests that queue for the same row anyway, instead of between rows.
//
// # Mechanism
//
// A node has one combiner per SKU (combiner.go). A request joins the
// combiner's queue; an idle combiner sends it at once, as a batch of one
// (no window: a lone request waits for nobody). While a batch is in
// flight, the requests that arrive queue, and form the next batch when it
// is done: under load a batch holds what arrived during the previous
// batch's round trip and commit, up to Options.MaxBatch. A batch never
// holds two requests with one key or one user: the second waits for the
// next batch, which sees the first's outcome committed, so each gets the
// answer it would have got alone.
//
// A batch is one statement in autocommit (sqlBatch in batch.go), one round
// trip and one commit:
//
//	known: keys already committed                  -> REPLAY / KEY_REUSED
//	cand:  the rest, minus users at their limit    -> USER_LIMIT; ranked by arrival
//	stock: SELECT ... FOR NO KEY UPDATE the SKU's row when it has a unit
//	ins:   INSERT the candidates ranked within available ... ON CONFLICT DO NOTHING
//	take:  UPDATE available = available - (rows inserted)
//
// A partial fill (fewer units than candidates) inserts the first ones in
// arrival order; the others are SOLD_OUT. A request the statement could not
// settle (its insert met a key or user that committed after the statement's
// snapshot, or it was ranked out while such a conflict left a unit over) is
// asked about again with a second statement, sqlWhyNot, in a new snapshot,
// in hotrow's order (known key, user's limit, stock), or goes back to the
// queue when the conflict is gone. No statement fails on a conflict.
//
// # Guarantees, and why
//
// Those of hotrow, from the same row lock and the same unique indexes, at
// READ COMMITTED:
//
//   - No oversell, conservation: the batch locks the stock row (waiting for
//     a batch or session in flight and re-reading the newest version, docs
//     13.2.1), inserts at most available rows, and decrements by exactly
//     the rows it inserted, in the same statement, so the same commit.
//     Transitions return units with the status change, in one statement.
//   - One reservation per key, one active per user and SKU: the unique
//     indexes are the arbiters of every insert, also between batches of
//     different nodes; within a batch there is nothing to arbitrate.
//   - No phantom sold-out: SOLD_OUT only when the batch found the row's
//     newest version without units for that request; a request ranked out
//     while units were left is requeued, never refused.
//   - Restart loses nothing: the database is the whole state; a restart
//     loses only requests still waiting in a combiner, which had no answer.
//
// Every answer is the request's own. Under faults a batch is all or
// nothing: an error of sqlBatch (a deadline, a broken connection, a
// server crash) answers every request in the batch with that error, each
// an unknown outcome that Lookup or a replay of the same request resolves,
// as for any other strategy. Its batch runs under its own deadline
// (Options.BatchTimeout, or strategy.Config.InternalDeadline when that is
// shorter), not a request's: a caller that gives up gets an error at once,
// and the batch still commits or fails for all. A batch whose own deadline
// fires answers the same error: its COMMIT may have been sent.
//
// TestConformance runs the conformance kit over all of it.
//
// # The boundary
//
//   - Blast radius: one failed batch is up to MaxBatch unknown outcomes
//     at once, where another strategy has one. The mean and largest batch
//     sizes are reported by Deployment.BatchStats and in
//     docs/performance.md.
//   - Latency: a request that arrives while a batch is in flight waits for
//     it to finish before its own batch starts: up to two batch times
//     instead of one. A lone request pays the batch statement, which does
//     more than onetrip's (the arrays and the per-request checks).
//   - It is still a hot row for everyone else: a session held open on the
//     SKU makes every batch wait, and batches of different nodes for one
//     SKU take turns on the row.
//   - Combining happens per node and per SKU: many nodes, or many SKUs
//     with a few requests each, make small batches.
package combine
