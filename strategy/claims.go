package strategy

import (
	"math/bits"
	"strings"
)

// Claims is the set of guarantees a strategy states. The harness judges every
// scenario against them: a claimed guarantee that breaks is a violation (the
// run fails); an unclaimed one that breaks is an observed boundary (reported
// with its counts).
type Claims uint64

// The claims a strategy can make. Each names the scenario that checks it.
const (
	// NoOversell: active reservations never exceed the stock (requirement 1),
	// checked by every scenario's audit, the contention storms among them.
	NoOversell Claims = 1 << iota
	// IdempotentKey: one request key yields at most one reservation, also when
	// sent concurrently; another user or SKU on a known key is KEY_REUSED
	// (requirement 2; duplicate-key scenario).
	IdempotentKey
	// OneActivePerUser: a user holds at most one active reservation per SKU
	// (requirement 3; user-limit scenario).
	OneActivePerUser
	// ReturnOnce: an expired or released unit goes back exactly once, however
	// often or concurrently the release runs (requirement 5; expiry replay,
	// confirm vs expire).
	ReturnOnce
	// Conserves: total - available == active (drift 0) after every case.
	Conserves
	// NoPhantomSoldOut: SOLD_OUT is never answered while a unit would be free
	// once the attempts in flight finish; the strategy may wait instead
	// (phantom sold-out scenario).
	NoPhantomSoldOut
	// NoWait: a reservation never waits for another attempt's uncommitted
	// work when the two compete only for stock (phantom sold-out scenario:
	// the third request is never blocked). A repeated key or user may wait
	// for the attempt that holds it: its answer depends on that commit.
	NoWait
	// SurvivesRestart: restarting a node loses nothing and oversells nothing
	// (restart-oversell scenario).
	SurvivesRestart
	// LeastPrivilege: the strategy serves as a runtime role that owns
	// nothing and cannot DROP, ALTER, TRUNCATE or DELETE from its tables, nor
	// create any; it may grant none of its privileges on, and holds none it
	// never uses; its schema is created by an owner role (Meta.Setup). The
	// least-privilege scenario checks it (SQLSTATE 42501 for each; each
	// privilege taken away in turn must change a workload's answers).
	LeastPrivilege
	// SurvivesFailover: an acknowledged reservation survives a failover to
	// a standby that had fallen behind (asynchronous replication), and the
	// audit balances on the promoted standby. A strategy that commits on
	// the primary alone cannot keep it; failover-async shows what it costs
	// each design instead. With synchronous replication nothing
	// acknowledged may be lost by any strategy (a contract check of
	// failover-sync).
	SurvivesFailover
)

// ClaimsAll is every claim. A strategy that answers HELD before its commit
// cannot keep both NoPhantomSoldOut and NoWait (seed 000, C28-14): an
// attempt held open either makes the next one wait or makes it see one unit
// fewer. One that answers only after COMMIT succeeds (SERIALIZABLE
// count-then-insert, examples/outoftree) can keep both, and pays in
// aborted attempts instead.
const ClaimsAll = NoOversell | IdempotentKey | OneActivePerUser | ReturnOnce | Conserves | NoPhantomSoldOut | NoWait | SurvivesRestart |
	LeastPrivilege | SurvivesFailover

var claimNames = map[Claims]string{
	NoOversell:       "no-oversell",
	IdempotentKey:    "idempotent-key",
	OneActivePerUser: "one-active-per-user",
	ReturnOnce:       "return-once",
	Conserves:        "conserves",
	NoPhantomSoldOut: "no-phantom-sold-out",
	NoWait:           "no-wait",
	SurvivesRestart:  "survives-restart",
	LeastPrivilege:   "least-privilege",
	SurvivesFailover: "survives-failover",
}

// Has reports whether every claim in x is in c.
func (c Claims) Has(x Claims) bool { return c&x == x }

// List returns the single claims in c, lowest bit first.
func (c Claims) List() []Claims {
	var out []Claims
	for rest := uint64(c); rest != 0; rest &= rest - 1 {
		out = append(out, Claims(1)<<bits.TrailingZeros64(rest))
	}
	return out
}

// String lists the claim names joined by "+", e.g. "no-oversell+conserves".
func (c Claims) String() string {
	if c == 0 {
		return "none"
	}
	var names []string
	for _, one := range c.List() {
		name, ok := claimNames[one]
		if !ok {
			name = "unknown"
		}
		names = append(names, name)
	}
	return strings.Join(names, "+")
}
