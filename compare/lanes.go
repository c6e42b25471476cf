package compare

import (
	"context"
	"fmt"
	"sync"
)

// Lanes: every scenario that needs a server of its own (exclusive_server)
// has a lane, named after it, with a server of its own and a lock of its
// own. A lane runs one strategy at a time, as the scenario crashes or fails
// over its server; different lanes run side by side, so a failover of one
// strategy does not wait for a crash of another, and a scenario may have
// more than one lane (laneServers).

type laneKey struct{}

// withLane tells ExclusiveDatabase which lane's server a database goes on.
func withLane(ctx context.Context, lane string) context.Context {
	return context.WithValue(ctx, laneKey{}, lane)
}

// laneOf is the lane withLane put in ctx, or "".
func laneOf(ctx context.Context) string {
	l, _ := ctx.Value(laneKey{}).(string)
	return l
}

// laneServers is how many servers a scenario's lanes have, where more than
// one: commit-timeout holds a COMMIT past its client's timeout, some 6 s a
// cell, and its one lane ran its 19 cells one after another in 106 s, the
// table's last minute once the other cells ran side by side (2026-12-07).
var laneServers = map[string]int{"commit-timeout": 3}

var lanes struct {
	mu   sync.Mutex
	free map[string]chan string
}

// takeLane waits for a free lane of scenario and returns its name (the
// scenario's, or the scenario's with "#2", "#3" for its other servers) and
// the function that frees it again.
func takeLane(ctx context.Context, scenario string) (name string, free func(), err error) {
	lanes.mu.Lock()
	if lanes.free == nil {
		lanes.free = map[string]chan string{}
	}
	ch := lanes.free[scenario]
	if ch == nil {
		n := max(laneServers[scenario], 1)
		ch = make(chan string, n)
		ch <- scenario
		for i := 2; i <= n; i++ {
			ch <- fmt.Sprintf("%s#%d", scenario, i)
		}
		lanes.free[scenario] = ch
	}
	lanes.mu.Unlock()
	select {
	case name = <-ch:
		return name, func() { ch <- name }, nil
	case <-ctx.Done():
		return "", nil, fmt.Errorf("not run: waiting for a server of its own: %w", context.Cause(ctx))
	}
}
