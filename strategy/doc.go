// Package strategy is the contract every reservebench strategy implements: how
// N scarce units of a SKU are handed out to concurrent requests without ever
// handing out N+1.
//
// The shape follows database/sql/driver. A strategy registers a [Meta] from its
// package's init function. Meta.Open deploys the strategy over one PostgreSQL
// database as a [Deployment] of one or more nodes; each node is a [Strategy],
// whose core is two methods, Reserve and Lookup. Everything a design may or may
// not support is an optional interface, resolved by a type assertion and
// documented with what the harness does when it is absent:
//
//	Confirmer       HELD -> CONFIRMED                  (confirm scenarios are skipped)
//	Releaser        HELD -> RELEASED, unit back        (release scenarios are skipped)
//	Expirer         due HELD -> EXPIRED, units back    (expiry scenarios are skipped)
//	SessionOpener   an attempt held open, finished later (interleavings and the kill scenarios are skipped)
//	SessionExpirer  the expiry job inside a session    (kill-mid-release is skipped)
//	Ager            make reservations due (on a Deployment; expiry scenarios are skipped)
//
// Config.Attach, which every strategy honours, opens a second process's view
// of stock that is already loaded: the fault scenarios run such a process and
// kill it.
//
// What a strategy promises is stated as [Claims]. The harness (package compare)
// and the conformance kit (package strategytest) judge every observation against
// them: a broken claim is a violation and fails the run; a boundary the strategy
// does not claim is reported as observed.
//
// The five requirements of the reservation contract (SPEC.md) map onto claims:
// requirement 1 is [NoOversell], 2 is [IdempotentKey], 3 is [OneActivePerUser],
// 5 is [ReturnOnce]. Requirement 4, bounded admission, is independent of the
// strategy and lives in package admission, which wraps any Strategy.
package strategy
