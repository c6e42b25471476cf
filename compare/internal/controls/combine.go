package controls

import (
	"github.com/reservebench/reservebench/combine"
	"github.com/reservebench/reservebench/strategy"
)

// combineMistakes are combine with one mistake in how it forms or serves a batch,
// claiming what combine claims.
func combineMistakes() []Control {
	return []Control{
		fromStrategy(combine.New(combine.Options{Mistake: combine.KeysInOneBatch}),
			"ctl-combine-keys-in-one-batch", "combine with one mistake", "C28-04",
			"a batch takes several requests with one key: one key from several users at once on one node is HELD for more than one of them",
			expect("duplicate-key", strategy.IdempotentKey)),
		fromStrategy(combine.New(combine.Options{Mistake: combine.TakeByCandidates}),
			"ctl-combine-take-by-candidates", "combine with one mistake", "C28-04",
			"a batch takes as many units as rows it tried to insert: a row that ON CONFLICT dropped (its key committed for another SKU by a transaction running beside it) still takes a unit",
			inContract(strategy.Conserves, "checkConflictBehind")),
		fromStrategy(combine.New(combine.Options{Mistake: combine.SoldOutUntried}),
			"ctl-combine-sold-out-untried", "combine with one mistake", "C28-04",
			"a request ranked past the units a batch saw is answered SOLD_OUT without being tried, also when an earlier one's insert met a reservation committed while the batch waited and left a unit over",
			inContract(strategy.NoPhantomSoldOut, "checkConflictCommitsWhileWaiting")),
		fromStrategy(combine.New(combine.Options{Mistake: combine.GaveUpSoldOut}),
			"ctl-combine-gave-up-sold-out", "combine with one mistake", "new",
			"a request sent back to the queue too often without an error (its row never went in while units were left) answers SOLD_OUT (\"every batch gave the units to requests ahead of it\"), though nothing refused it",
			inContract(strategy.NoPhantomSoldOut, "checkWritesSkipped")),
		fromStrategy(combine.New(combine.Options{Mistake: combine.SessionRequeueSoldOut}),
			"ctl-combine-session-requeue-sold-out", "combine with one mistake", "new",
			"an attempt held open answers SOLD_OUT where its batch of one would go back to the queue (its row did not go in, and nothing that refused it is left when it looks), though the SKU has units (outsider round 56's m15)",
			inContract(strategy.NoPhantomSoldOut, "checkWritesSkipped")),
		fromStrategy(combine.New(combine.Options{Mistake: combine.IgnoresInternalDeadline}),
			"ctl-combine-ignores-internal-deadline", "combine with one mistake", "new",
			"a batch keeps its 30 s deadline however short Config.InternalDeadline is: once its callers gave up, it goes on waiting in PostgreSQL (outsider round 56's m13)",
			inContract(contract, "checkInternalDeadlineKept")),
		fromStrategy(combine.New(combine.Options{Mistake: combine.AttachDropsInternalDeadline}),
			"ctl-combine-attach-drops-internal-deadline", "combine with one mistake", "new",
			"a deployment made by Attach keeps its batches' 30 s deadline whatever Config.InternalDeadline says (one made by Open honours it): a batch of an attached process whose callers gave up goes on waiting (outsider round 56's m36)",
			inContract(contract, "checkInternalDeadlineKept")),
		fromStrategy(combine.New(combine.Options{Mistake: combine.ResendsAfterEOF}),
			"ctl-combine-resends-after-eof", "combine with one mistake", "new",
			"a batch whose connection ended in an unexpected end of stream is sent again, as if nothing had been written: where PostgreSQL ended its backend while the COMMIT waited for a synchronous standby (committed locally), the batch sent again answers REPLAY for reservations a failover loses (outsider round 56's m35)",
			expect("commit-timeout", contract)),
		fromStrategy(combine.New(combine.Options{Mistake: combine.AnswersByPosition}),
			"ctl-combine-answers-by-position", "combine with one mistake", "new",
			"a batch's statement has no ORDER BY, and each row it returns answers the request at its position (\"the input is read in request order, so the rows come back in it\"): once the server's plan returns them in another order, a request gets another request's answer",
			inContract(contract, "checkAnswersInAnyPlanOrder")),
		fromStrategy(combine.New(combine.Options{Mistake: combine.WhyNotByPosition}),
			"ctl-combine-why-not-by-position", "combine with one mistake", "new",
			"the batch's second statement, which asks why the requests it could not settle were refused, matches its rows to them by position (\"unnest keeps its order\"): a request whose key was taken by an attempt that committed while the batch waited gets the owner of another request's key",
			inContract(contract, "checkLateConflictsInAnyPlanOrder")),
		fromStrategy(combine.New(combine.Options{Mistake: combine.DeadlineIsBusy}),
			"ctl-combine-deadline-busy", "combine with one mistake", "new",
			"a batch whose own deadline expired while its COMMIT waited answers BUSY, a definite answer, though the COMMIT was sent and commits once the wait ends",
			expect("commit-timeout", contract)),
		fromStrategy(combine.New(combine.Options{Mistake: combine.BatchUnderFirstCaller}),
			"ctl-combine-batch-under-first-caller", "combine with one mistake", "new",
			"a batch runs under its first request's context: when that caller gives up, the other requests of the batch, whose callers did not, end with its cancellation",
			inContract(contract, "checkOthersGiveUp")),
	}
}
