package controls

import (
	"github.com/reservebench/reservebench/rediscounter"
	"github.com/reservebench/reservebench/strategy"
)

// counterMistakes are rediscounter with one mistake in its give-back,
// claiming what rediscounter claims.
func counterMistakes() []Control {
	m := rediscounter.New(rediscounter.Options{Mistake: rediscounter.KeepUnitOnUserLimit})
	m.Name = "ctl-counter-keeps-limit-unit"
	m.Description = "negative control: rediscounter with one mistake"
	m.Correctness = "none: it claims what it cannot keep"
	return []Control{{
		Meta:   m,
		Case:   "seed 002",
		Breaks: "a request the per-user index refuses (its user holds a unit Redis forgot) keeps the unit the script took",
		Expect: expect("redis-restart", strategy.Conserves),
	}}
}
