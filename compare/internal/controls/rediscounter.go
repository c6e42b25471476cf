package controls

import (
	"github.com/reservebench/reservebench/rediscounter"
	"github.com/reservebench/reservebench/strategy"
)

// counterMistakes are rediscounter with one mistake in its give-back,
// claiming what rediscounter claims.
func counterMistakes() []Control {
	return []Control{
		fromStrategy(rediscounter.New(rediscounter.Options{Mistake: rediscounter.KeepUnitOnUserLimit}),
			"ctl-counter-keeps-limit-unit", "rediscounter with one mistake", "seed 002",
			"a request the per-user index refuses (its user holds a unit Redis forgot) keeps the unit the script took",
			expect("redis-restart", strategy.Conserves)),
		fromStrategy(rediscounter.New(rediscounter.Options{Keep: rediscounter.KeepRecover, Mistake: rediscounter.RecoverCountOnly}),
			"ctl-counter-recovers-count-only", "rediscounter-recover with one mistake", "seed 002",
			"after Redis restarts empty it rebuilds the counter from PostgreSQL but not the markers: a unit released or expired from an earlier reservation never comes back",
			expect("redis-restart", strategy.SurvivesRestart)),
		fromStrategy(rediscounter.New(rediscounter.Options{Keep: rediscounter.KeepRecover, Mistake: rediscounter.ErrorIsBusy}),
			"ctl-counter-error-is-busy", "rediscounter-recover with one mistake", "seed 002",
			"any error of the take script is answered BUSY (nothing written), also a reply that timed out after Redis ran it",
			expect("redis-restart", contract)),
		fromStrategy(rediscounter.New(rediscounter.Options{Keep: rediscounter.KeepRecover, Mistake: rediscounter.RestartRecountsCommitted}),
			"ctl-counter-restart-recounts-committed", "rediscounter-recover with one mistake", "seed 002",
			"a node's restart sets the shared counter from the committed reservations at once: a request in flight on any node, its unit taken and its row not yet committed, has that unit sold again",
			expect("restart-in-flight", strategy.SurvivesRestart)),
		fromStrategy(rediscounter.New(rediscounter.Options{Keep: rediscounter.KeepRecover, Mistake: rediscounter.RecountBounded}),
			"ctl-counter-recount-bounded", "rediscounter-recover with one mistake", "seed 002",
			"a restart recounts at most 1,000 active reservations of a SKU (to keep the script's arguments bounded) and subtracts only those: a SKU with more sells the rest again",
			expect("deployment-contract", contract)),
		fromStrategy(rediscounter.New(rediscounter.Options{Mistake: rediscounter.GiveBackByUser}),
			"ctl-counter-give-back-by-user", "rediscounter with one mistake", "seed 002",
			"the give-back script asks whether the user still holds a unit instead of whether the key does: a release sent again after its user reserved anew gives the new reservation's unit back",
			join(expect("release-replay", strategy.ReturnOnce), expect("expiry-replay", strategy.ReturnOnce))),
		fromStrategy(rediscounter.New(rediscounter.Options{Mistake: rediscounter.UndoReleaseOnError}),
			"ctl-counter-undo-release", "rediscounter with one mistake", "new",
			"a Release whose give-back to Redis fails sets its row back to HELD (\"the unit did not come back, so the release did not happen\"), although a give-back whose reply was lost ran: the unit is free in Redis and held by the row",
			expect("redis-restart", strategy.NoOversell)),
		fromStrategy(rediscounter.New(rediscounter.Options{Mistake: rediscounter.ExpireCountsOnly}),
			"ctl-counter-expire-counts-only", "rediscounter with one mistake", "new",
			"the expiry job gives its units back with one INCRBY per row moved and leaves the keys' markers in Redis: a release of a hold the job expired finds its marker and gives the unit back again",
			expect("redis-restart", strategy.NoOversell)),
		fromStrategy(rediscounter.New(rediscounter.Options{Mistake: rediscounter.KeysExpire}),
			"ctl-counter-keys-expire", "rediscounter with one mistake", "seed 002",
			"every take sets a TTL of a week on the SKU's keys (\"keys of SKUs nobody sells any more fill Redis\"): a SKU sold out and paid for sits quiet, its counter expires while Redis runs, and its whole stock is loaded and sold again",
			expect("deployment-contract", strategy.NoOversell)),
		fromStrategy(rediscounter.New(rediscounter.Options{Mistake: rediscounter.SKUNameCut}),
			"ctl-counter-sku-cut", "rediscounter with one mistake", "seed 002",
			"the SKU in its Redis keys' names is cut to 40 bytes (\"key names are capped at 64 bytes\"): two SKUs that share their first 40 bytes share one counter, and the smaller sells past its total",
			expect("deployment-contract", contract)),
		fromStrategy(rediscounter.New(rediscounter.Options{Mistake: rediscounter.SKUNameHashed}),
			"ctl-counter-sku-hashed", "rediscounter with one mistake", "seed 002",
			"the SKU in its Redis keys' names is its CRC-32 (\"a SKU with '}' breaks the hash tag; eight hex digits are safe\"): two SKUs whose CRC-32 is equal share one counter, and the smaller sells past its total",
			expect("deployment-contract", contract)),
		fromStrategy(rediscounter.New(rediscounter.Options{Mistake: rediscounter.OpenKeepsCounter}),
			"ctl-counter-open-keeps", "rediscounter with one mistake", "seed 002",
			"Open loads a SKU's counter only where Redis has none (\"a second app server must not reset the stock the first is selling from\"): a database made again on the same Redis sells its SKUs from the earlier life's count",
			expect("deployment-contract", strategy.NoOversell)),
	}
}
