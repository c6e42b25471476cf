package controls

import (
	"github.com/reservebench/reservebench/onetrip"
)

// onetripMistakes are onetrip with one mistake in its sold-out hint,
// claiming what onetrip claims (no phantom sold-out among them).
func onetripMistakes() []Control {
	return []Control{fromStrategy(onetrip.New(onetrip.Options{SoldOutFromMemory: true}),
		"ctl-sold-out-from-memory", "onetrip with one mistake", "C28-14",
		"a node that found its SKU empty answers SOLD_OUT from that memory until its own Release or ExpireDue clears it: a unit given back through another node is never sold by this one",
		expect("deployment-contract", contract))}
}
