package memquota

import (
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// PgbenchScript is bench.PgbenchScripter's (implemented without importing
// bench), for the database part of a reservation only: the node's in-memory
// counter, which decides whether a unit is left, is not in PostgreSQL at
// all. What a reservation sends when its node has a unit is one statement in autocommit,
// insertSQL, and that is the script:
//
//	\set node 0, \set lock hash_fnv1a(:key), \set attempt random(...)
//	insertSQL   (:key, :user, :sku, :node, :ttl_us, :lock, :attempt)
//
// The advisory-lock id and the attempt number are computed on the client in
// Go (FNV of the key's text, a random int64); the script computes values of
// the same kind from the integer key. pgbench never decrements a counter, so
// its rows are not counted by the node: a deployment pgbench wrote to fails
// its audit by construction (drift = -rows written). Use a fresh one.
func (d *Deployment) PgbenchScript(sku string) (string, error) {
	if err := d.known.CheckSKU(sku); err != nil {
		return "", err
	}
	return pgstrategy.PgbenchScript(
		`\set node 0`,
		`\set lock hash_fnv1a(:key)`,
		`\set attempt random(1, 1000000000000000)`,
		pgstrategy.PgbenchSQL(insertSQL, "key", "user", "sku", "node", "ttl_us", "lock", "attempt"),
	), nil
}

// PgbenchLeavesOut is bench.PgbenchPartial's: the script is the sales log's
// insert only.
func (d *Deployment) PgbenchLeavesOut() string {
	return "the node's in-memory counter that decides first"
}
