package controls

import (
	"github.com/reservebench/reservebench/slotrows"
)

// slotrowsMistakes are slotrows with one mistake (its session's
// savepoint), claiming what slotrows claims.
func slotrowsMistakes() []Control {
	return []Control{fromStrategy(slotrows.New(slotrows.Options{OneSavepoint: true}),
		"ctl-slot-one-savepoint", "slotrows with one mistake", "new",
		"an attempt held open marks its savepoint once, at its first request, and a later request rolls back to it on SOLD_OUT (\"a round trip saved per request\"): the units the attempt answered HELD before are undone, and its commit keeps none of them",
		expect("deployment-contract", contract)),
	}
}
