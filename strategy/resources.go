package strategy

import (
	"fmt"
	"sort"
	"strings"
)

// Resource names a component besides PostgreSQL that a strategy needs, e.g.
// a Redis server. Whoever deploys a strategy (the conformance kit, the
// harness, the benchmarks, a service) reads Meta.Needs, provides an address
// for each resource in Config.Resources, and never needs to know which
// strategy asked.
type Resource string

// Redis is a Redis server (or anything that speaks its protocol). Its
// address in Config.Resources is a URL go-redis parses:
// "redis://host:port/0" or "unix:///path/to/redis.sock".
const Redis Resource = "redis"

// Need is one resource a strategy needs, and the configuration of that
// resource the strategy relies on.
type Need struct {
	Resource Resource
	// Settings are lines of the resource's own configuration that the
	// strategy's guarantees depend on; for Redis, redis.conf lines such as
	// "appendonly yes" or "appendfsync always". A provider that starts the
	// resource applies them; the strategy checks at Open that the resource
	// it is given has them and refuses with ErrConfig otherwise, so a
	// strategy is never run against a resource that cannot keep its claims.
	Settings []string
}

// ErrMissingResource is matched by the ErrConfig error of a Config that
// lacks a resource the strategy needs.
var ErrMissingResource = fmt.Errorf("%w: missing resource", ErrConfig)

// Resource returns the address of r in c.Resources, or an error matching
// ErrConfig and ErrMissingResource naming what is missing.
func (c Config) Resource(r Resource) (string, error) {
	addr := c.Resources[r]
	if addr == "" {
		have := make([]string, 0, len(c.Resources))
		for k := range c.Resources {
			have = append(have, string(k))
		}
		sort.Strings(have)
		return "", fmt.Errorf("%w %q (Config.Resources has: %s)", ErrMissingResource, r, strings.Join(have, ", "))
	}
	return addr, nil
}

// NeedsOf returns the resources a strategy needs, each once, in the order
// of meta.Needs.
func NeedsOf(meta Meta) []Resource {
	var out []Resource
	seen := map[Resource]bool{}
	for _, n := range meta.Needs {
		if !seen[n.Resource] {
			seen[n.Resource] = true
			out = append(out, n.Resource)
		}
	}
	return out
}

// SettingsOf returns the settings meta needs from resource r, in order.
func SettingsOf(meta Meta, r Resource) []string {
	var out []string
	for _, n := range meta.Needs {
		if n.Resource == r {
			out = append(out, n.Settings...)
		}
	}
	return out
}
