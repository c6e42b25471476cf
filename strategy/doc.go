// Package strategy is the contract every reservebench strategy implements: how
// N scarce units of a SKU are handed out to concurrent requests without ever
// handing out N+1.
//
// The shape follows database/sql/driver. A strategy registers a [Meta] from its
// package's init function. Meta.Open deploys the strategy over one PostgreSQL
// database as a [Deployment] of one or more nodes; each node is a [Strategy],
// whose core is two methods, Reserve and Lookup. Everything a design may or may
// not support is optional, resolved once per deployment by [Probe] and
// documented with what the harness does when it is absent:
//
//	Confirmer            HELD -> CONFIRMED                 (confirm scenarios: n/a)
//	Releaser             HELD -> RELEASED, unit back       (release scenarios: n/a)
//	Expirer              due HELD -> EXPIRED, units back   (expiry scenarios: n/a)
//	SessionOpener        an attempt held open              (interleavings, kill-reserve: n/a)
//	ExpirySessionOpener  the expiry job held open          (kill-release: n/a)
//	Ager                 make reservations due (Deployment; expiry scenarios: n/a)
//	Restarter            restart a node in place (Deployment; restart, node-death: n/a)
//	ReserveCrasher       a request that dies mid-reserve (Deployment; node-death: n/a)
//	Meta.Attach          a second process over the same stock (kill-release, kill-reserve: n/a)
//	LockTaker            a lock outside PostgreSQL, LockedSession (lock-fault scenarios: n/a)
//	Meta.Setup           the schema created by an owner role, served by a runtime role (least-privilege: n/a)
//
// A strategy that needs more than PostgreSQL (a Redis server) says so in
// Meta.Needs, and whoever deploys it provides each [Resource] in
// Config.Resources. A definite "busy, try again" refusal (a lock not granted
// in time, Redis down) is [OutcomeBusy]: nothing was written, like SOLD_OUT.
//
// What a strategy promises is stated as [Claims]. The harness (package compare)
// and the conformance kit (package strategytest) judge every observation against
// them: a broken claim is a violation and fails the run; a boundary the strategy
// does not claim is reported as observed.
//
// The five requirements of the reservation contract map onto claims:
// requirement 1 (never more active reservations than stock) is [NoOversell],
// 2 (one reservation per request key) is [IdempotentKey], 3 (one active
// reservation per user and SKU) is [OneActivePerUser], 5 (a unit comes back
// exactly once) is [ReturnOnce]. Requirement 4, bounded admission, is
// independent of the strategy and lives in package admission, which wraps any
// Strategy.
package strategy
