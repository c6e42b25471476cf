package strategy

import (
	"fmt"
	"regexp"
	"sort"
	"sync"
)

var (
	registryMu sync.RWMutex
	registry   = map[string]Meta{}
	validName  = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)
)

// Register makes a strategy available to the harness and the benchmarks. Call
// it from the strategy package's init. It panics if the name is taken or
// invalid, or if Open is nil, like database/sql.Register.
func Register(m Meta) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if !validName.MatchString(m.Name) {
		panic(fmt.Sprintf("strategy: Register: invalid name %q (want %s)", m.Name, validName))
	}
	if m.Open == nil {
		panic("strategy: Register: Open is nil for " + m.Name)
	}
	if _, dup := registry[m.Name]; dup {
		panic("strategy: Register called twice for " + m.Name)
	}
	registry[m.Name] = m
}

// Registered returns every registered strategy, sorted by name.
func Registered() []Meta {
	registryMu.RLock()
	defer registryMu.RUnlock()
	out := make([]Meta, 0, len(registry))
	for _, m := range registry {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Lookup returns the registered strategy with this name.
func Lookup(name string) (Meta, bool) {
	registryMu.RLock()
	defer registryMu.RUnlock()
	m, ok := registry[name]
	return m, ok
}
