package controls

import (
	"github.com/reservebench/reservebench/combine"
	"github.com/reservebench/reservebench/strategy"
)

// combineMistakes are combine with one mistake in how it forms a batch,
// claiming what combine claims.
func combineMistakes() []Control {
	m := combine.New(combine.Options{Mistake: combine.KeysInOneBatch})
	m.Name = "ctl-combine-keys-in-one-batch"
	m.Description = "negative control: combine with one mistake"
	m.Correctness = "none: it claims what it cannot keep"
	return []Control{{
		Meta:   m,
		Case:   "C28-04",
		Breaks: "a batch takes several requests with one key: one key from several users at once on one node is HELD for more than one of them",
		Expect: expect("duplicate-key", strategy.IdempotentKey),
	}}
}
