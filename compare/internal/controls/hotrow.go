package controls

import (
	"github.com/jackc/pgx/v5"

	"github.com/reservebench/reservebench/hotrow"
	"github.com/reservebench/reservebench/strategy"
)

// hotrowMistakes are hotrow with one mistake, claiming what hotrow claims.
func hotrowMistakes() []Control {
	return []Control{
		fromStrategy(hotrow.New(hotrow.Options{Isolation: pgx.RepeatableRead, RetriesSpentSoldOut: true}),
			"ctl-retries-spent-sold-out", "hotrow-repeatable-read with one mistake", "new",
			"a Reserve whose retries all failed (40001 each time) answers SOLD_OUT instead of BUSY (\"others are taking the last units\"): nothing was tried to the end, and the SKU has units",
			inContract(contract, "checkWritesKeepFailing")),
		fromStrategy(hotrow.New(hotrow.Options{Isolation: pgx.Serializable, UnitsSummedOverRetries: true}),
			"ctl-units-summed-over-retries", "hotrow-serializable with one mistake", "new",
			"Release and the expiry job add up the units each attempt's statement returned: an attempt whose COMMIT failed with 40001 and was retried counts its units twice, a Release of one unit reports 2 (outsider round 40's m2 and m3)",
			inContract(contract, "checkRetriedAtCommit")),
		fromStrategy(hotrow.New(hotrow.Options{LostLastUnitSoldOut: true}),
			"ctl-lost-last-unit-sold-out", "hotrow with one mistake", "new",
			"a request reads the stock row before its decrement, and when it saw the last unit and the row changed under the decrement (\"someone took the last one\") answers SOLD_OUT, though the change was a unit given back: an expiry job held open gives one back while the request waits (outsider round 57's m16, an optimistic design's compare-and-set)",
			inContract(strategy.NoPhantomSoldOut, "checkRequestBehindGiveBack")),
		fromStrategy(hotrow.New(hotrow.Options{ReplayFromMemory: true}),
			"ctl-replay-from-memory", "hotrow with one mistake", "new",
			"a process answers a resend from the reservations it answered, forgetting one only when one of its own nodes releases or confirms it: after a second process released a key, its resend is REPLAY of a HELD reservation (outsider round 41's ssicount)",
			inContract(contract, "checkReplayAfterMovedElsewhere")),
		fromStrategy(agelessMeta(hotrow.Meta()),
			"ctl-expiry-without-ager", "hotrow without MakeDue", "new",
			"an expiry job (strategy.Expirer) with no way for the kit to make a reservation due (strategy.Ager): every check of the job with a due row is skipped, and a job that gives a unit back twice, to every SKU, or lets a late Confirm revive an EXPIRED row would pass (outsider round 42's four escapes)",
			inContract(contract, "checkExpirerAges")),
	}
}
