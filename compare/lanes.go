package compare

import (
	"context"
	"sync"
)

// Lanes: every scenario that needs a server of its own (exclusive_server)
// has a lane, named after it, with a server of its own and a lock of its
// own. A lane runs one strategy at a time, as the scenario crashes or fails
// over its server; different lanes run side by side, so a failover of one
// strategy does not wait for a crash of another.

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

var lanes struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

// laneLock is the lock of a lane.
func laneLock(lane string) *sync.Mutex {
	lanes.mu.Lock()
	defer lanes.mu.Unlock()
	if lanes.locks == nil {
		lanes.locks = map[string]*sync.Mutex{}
	}
	if lanes.locks[lane] == nil {
		lanes.locks[lane] = new(sync.Mutex)
	}
	return lanes.locks[lane]
}
