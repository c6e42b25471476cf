package controls

import (
	"github.com/reservebench/reservebench/slotrows"
)

// slotrowsMistakes are slotrows with one mistake (its session's
// savepoint, its TTL's unit), claiming what slotrows claims.
func slotrowsMistakes() []Control {
	return []Control{fromStrategy(slotrows.New(slotrows.Options{OneSavepoint: true}),
		"ctl-slot-one-savepoint", "slotrows with one mistake", "new",
		"an attempt held open marks its savepoint once, at its first request, and a later request rolls back to it on SOLD_OUT (\"a round trip saved per request\"): the units the attempt answered HELD before are undone, and its commit keeps none of them",
		inContract(contract, "checkTwoOfOneSKUInSession")),
		fromStrategy(slotrows.New(slotrows.Options{TTLInMillis: true}),
			"ctl-slot-ttl-millis", "slotrows with one mistake", "new",
			"a reservation's TTL is kept in whole milliseconds (\"the HTTP API speaks ttl_ms\"): a TTL under a millisecond makes a reservation due when it is made, and every other expires up to 999 µs early",
			inContract(contract, "checkTTLMicroseconds")),
	}
}
