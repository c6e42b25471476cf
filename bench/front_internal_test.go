package bench

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/reservebench/reservebench/service"
	"github.com/reservebench/reservebench/strategy"
)

// deadlineNode answers SOLD_OUT and remembers the deadline of the context
// the service called it with.
type deadlineNode struct {
	mu       sync.Mutex
	deadline time.Time
	has      bool
}

func (n *deadlineNode) Reserve(ctx context.Context, _ strategy.Request) (strategy.Result, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.deadline, n.has = ctx.Deadline()
	return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil
}

func (n *deadlineNode) Lookup(_ context.Context, key string) (strategy.Reservation, error) {
	return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, nil
}

// TestOpenLoopHTTPWorkIsBounded: an open-loop HTTP trial's service bounds
// each strategy call by the window plus OpenGrace (what nothing counts
// goes), a closed-loop one by the service's default. It reads the deadline
// the service gave the call, over a real socket: no timing is assumed.
func TestOpenLoopHTTPWorkIsBounded(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		rate float64
		want time.Duration
	}{
		{"closed loop", 0, service.DefaultWorkTimeout},
		{"open loop", 100, time.Second + OpenGrace},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := &deadlineNode{}
			spec := Spec{Meta: strategy.Meta{Name: "deadline"}, Clients: 1, Duration: time.Second, Rate: tc.rate, MaxInFlight: 2}
			front, err := startFront(ctx, spec, node)
			if err != nil {
				t.Fatal(err)
			}
			defer front.Close()
			before := time.Now()
			res, err := front.Node().Reserve(ctx, strategy.Request{Key: "k", User: "u", SKU: "s", TTL: time.Hour})
			took := time.Since(before)
			if err != nil || res.Outcome != strategy.OutcomeSoldOut {
				t.Fatalf("Reserve through HTTP: %s, %v", res.Outcome, err)
			}
			node.mu.Lock()
			deadline, has := node.deadline, node.has
			node.mu.Unlock()
			if !has {
				t.Fatal("the service called the strategy without a deadline")
			}
			// The service set deadline = its now + WorkTimeout, its now
			// within [before, before+took].
			if left := deadline.Sub(before); left < tc.want || left > tc.want+took {
				t.Errorf("the strategy call's deadline is %v after the request, want %v (+ at most %v)", left, tc.want, took)
			}
		})
	}
}
