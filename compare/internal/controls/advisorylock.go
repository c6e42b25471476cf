package controls

import (
	"github.com/reservebench/reservebench/advisorylock"
	"github.com/reservebench/reservebench/strategy"
)

// advisorylockMistakes are advisorylock with one mistake in the lock its
// attempts held open take, claiming what advisorylock claims.
func advisorylockMistakes() []Control {
	return []Control{fromStrategy(advisorylock.New(advisorylock.Options{SessionLockApart: true}),
		"ctl-session-lock-apart", "advisorylock with one mistake", "C28-14",
		"an attempt held open takes the SKU's advisory lock under another key than a plain request: the two never exclude each other, and both take the last unit",
		expect("deployment-contract", strategy.NoOversell))}
}
