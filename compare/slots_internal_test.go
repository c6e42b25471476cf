package compare

import (
	"context"
	"runtime"
	"testing"
)

// TestSlotsHeaviestFirst: a freed slot goes to the heaviest waiter, ties
// to the first come; a waiter whose context ends leaves the queue.
func TestSlotsHeaviestFirst(t *testing.T) {
	p := newSlotPool(1)
	ctx := context.Background()
	if err := p.acquire(ctx, 0); err != nil {
		t.Fatal(err)
	}
	queued := func(n int) {
		for {
			p.mu.Lock()
			l := len(p.waiting)
			p.mu.Unlock()
			if l == n {
				return
			}
			runtime.Gosched()
		}
	}
	got := make(chan int, 4)
	gone, cancel := context.WithCancel(ctx)
	for i, w := range []int{1, 5, 3, 5} {
		c := ctx
		if i == 0 {
			c = gone
		}
		go func() {
			if p.acquire(c, w) != nil {
				return
			}
			got <- i
			p.release()
		}()
		queued(i + 1)
	}
	cancel()
	queued(3)
	p.release()
	want := []int{1, 3, 2} // weight 5 (first come), weight 5, weight 3; the cancelled one never runs
	for _, w := range want {
		if g := <-got; g != w {
			t.Fatalf("slot went to waiter %d, want %d (order %v)", g, w, want)
		}
	}
	if err := p.acquire(ctx, 0); err != nil || p.free != 0 {
		t.Fatalf("the slot is not free again after every waiter: %v, free %d", err, p.free)
	}
}
