package controls

import (
	"github.com/reservebench/reservebench/onetrip"
	"github.com/reservebench/reservebench/strategy"
)

// onetripMistakes are onetrip with one mistake (its sold-out hint, its
// session's read of why not, its expiry job's count), claiming what onetrip claims (no phantom
// sold-out among them).
func onetripMistakes() []Control {
	return []Control{fromStrategy(onetrip.New(onetrip.Options{SoldOutFromMemory: true}),
		"ctl-sold-out-from-memory", "onetrip with one mistake", "C28-14",
		"a node that found its SKU empty answers SOLD_OUT from that memory until its own Release or ExpireDue clears it: a unit given back through another node is never sold by this one",
		inContract(contract, "checkAnswersWhenSoldOut")),
		fromStrategy(onetrip.New(onetrip.Options{HintReplaysByUser: true}),
			"ctl-hint-replays-by-user", "onetrip with one mistake", "new",
			"while a node remembers its SKU sold out it asks why first, and answers a known key of the same user REPLAY whatever SKU it was sold for: a key of another SKU resent for the sold-out one is REPLAY of a reservation it did not ask for, not KEY_REUSED (outsider round 40's m15)",
			inContract(contract, "checkAnswersWhenSoldOut")),
		fromStrategy(onetrip.New(onetrip.Options{WhyNotCountsEnded: true}),
			"ctl-why-not-counts-ended", "onetrip with one mistake", "new",
			"the reading that explains a refused insert counts the user's reservations of the SKU whatever their status: a user whose hold was released or expired, asking again once the SKU is sold out, is answered USER_LIMIT, not SOLD_OUT",
			inContract(contract, "checkEndedHolderWhenSoldOut")),
		fromStrategy(onetrip.New(onetrip.Options{InvisibleConflictSoldOut: true}),
			"ctl-invisible-conflict-sold-out", "onetrip with one mistake", "C28-14",
			"an insert refused by a unique index whose conflict is gone when the next statement asks why (the user's reservation released in between) is answered SOLD_OUT (\"refused, and nothing holds it: the unit must be gone\") instead of run again (outsider round 35's m2)",
			inContract(strategy.NoPhantomSoldOut, "checkConflictEndsBeforeLookup")),
		fromStrategy(onetrip.New(onetrip.Options{SoldOutOnlyIfStillNone: true}),
			"ctl-sold-out-only-if-still-none", "onetrip with one mistake", "new",
			"after an insert refused for want of a unit, SOLD_OUT only when the next statement's reading has no unit either, and an empty answer when a unit was given back in between (outsider round 46's m01)",
			inContract(contract, "checkUnitBackBetweenStatements")),
		fromStrategy(onetrip.New(onetrip.Options{SessionForgetsRefusal: true}),
			"ctl-session-forgets-refusal", "onetrip with one mistake", "new",
			"an attempt held open explains a refused insert from the next statement's reading alone, as if nothing had been tried: a unit given back between the refusal and that reading leaves an empty answer with no error (outsider round 55's m09)",
			inContract(contract, "checkUnitBackBetweenStatements")),
		fromStrategy(onetrip.New(onetrip.Options{SessionAtDefaultIsolation: true}),
			"ctl-session-default-isolation", "onetrip with one mistake", "new",
			"an attempt held open begins at the server's default isolation level, not READ COMMITTED by name: on a database whose default is REPEATABLE READ, its request for a SKU another transaction changed after its first statement fails, and its COMMIT turns into a ROLLBACK (outsider round 55's m10)",
			inContract(strategy.NoOversell, "checkAtDefaultIsolation")),
		fromStrategy(onetrip.New(onetrip.Options{WhyNotFoldsUser: true}),
			"ctl-why-not-folds-user", "onetrip with one mistake", "new",
			"the reading that explains a refused insert finds the user's reservations ignoring case, where the unique index compares exactly: a new user that differs from a holder only in case, on a sold-out SKU, is answered USER_LIMIT (outsider round 46's m23)",
			inContract(contract, "checkDistinctText")),
		fromStrategy(onetrip.New(onetrip.Options{WhyNotFoldsKey: true}),
			"ctl-why-not-folds-key", "onetrip with one mistake", "new",
			"the reading that explains a refused insert finds the key's owner ignoring case, where the primary key compares exactly: a new key that differs from a known one only in case, on a sold-out SKU, is answered KEY_REUSED with a reservation that is not its own (outsider round 46's m24)",
			inContract(contract, "checkDistinctText")),
		fromStrategy(onetrip.New(onetrip.Options{CancelIsSoldOut: true}),
			"ctl-cancel-is-sold-out", "onetrip with one mistake", "new",
			"an insert the server cancelled (a statement_timeout or lock_timeout) is taken for \"no unit left\": a request that waited behind another's attempt, on a role whose statement_timeout a DBA set, is answered SOLD_OUT while the SKU has units",
			inContract(strategy.NoPhantomSoldOut, "checkServerCancelsWait")),
		fromStrategy(onetrip.New(onetrip.Options{WhyNotOutsideSession: true}),
			"ctl-why-not-outside-session", "onetrip with one mistake", "new",
			"an attempt held open reads why its insert was refused from the pool, not its own transaction: its own key sent again, or a new key of a user it holds the SKU for, ends in an error",
			inContract(contract, "checkTwoOfOneSKUInSession")),
		fromStrategy(onetrip.New(onetrip.Options{ExpiryHealsCount: true}),
			"ctl-expiry-heals-count", "onetrip with one mistake", "new",
			"the expiry job then sets each SKU's available to its total less the active reservations it counts (\"available is derived: drift heals within a tick\"): run beside an attempt on the stock row, it keeps the count read before the attempt committed, and the attempt's unit sells twice",
			inContract(strategy.Conserves, "checkExpiryBesideAttempt")),
		fromStrategy(onetrip.New(onetrip.Options{ConfirmGivesUp: true}),
			"ctl-confirm-gives-up", "onetrip with one mistake", "new",
			"Confirm waits at most 2 s for the reservation's row (lock_timeout) and then answers false (\"someone else is moving it\"): a payment is refused for a hold nobody moved",
			inContract(contract, "checkTransitionsWaitForLockedRows")),
		fromStrategy(onetrip.New(onetrip.Options{ConfirmDeadline: true}),
			"ctl-confirm-deadline-false", "onetrip with one mistake", "new",
			"Confirm gives its statement a deadline of 2 s of its own (a context) and answers false when it passes (\"the payment came too late to wait for\"): a payment is refused for a hold nobody moved",
			inContract(contract, "checkMovesOutlastTimeouts")),
	}
}
