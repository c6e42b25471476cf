package bench_test

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reservebench/reservebench/admission"
	"github.com/reservebench/reservebench/bench"
	"github.com/reservebench/reservebench/strategy"
)

// These tests check what the load generator counts, never how fast
// anything is: every assertion holds on any machine.

// fakeStock answers HELD for the first units requests and SOLD_OUT after.
type fakeStock struct {
	units atomic.Int64
	delay time.Duration
	keys  chan string
}

func (f *fakeStock) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if f.keys != nil {
		select {
		case f.keys <- req.Key:
		default:
		}
	}
	if f.delay > 0 {
		time.Sleep(f.delay) // the fake's service time, not a synchronisation
	}
	if f.units.Add(-1) >= 0 {
		return strategy.Result{Outcome: strategy.OutcomeHeld}, nil
	}
	return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil
}

func (f *fakeStock) Lookup(context.Context, string) (strategy.Reservation, error) {
	return strategy.Reservation{}, nil
}

func TestDriveNCountsEveryAnswer(t *testing.T) {
	f := &fakeStock{}
	f.units.Store(70)
	run := bench.DriveN(context.Background(), f, bench.Load{Clients: 4, SKU: "s"}, 100)
	if run.Held != 70 || run.Refused != 30 || run.Errors != 0 || run.Shed != 0 {
		t.Fatalf("held %d refused %d errors %d shed %d, want 70 30 0 0", run.Held, run.Refused, run.Errors, run.Shed)
	}
	if run.Outcomes["HELD"] != 70 || run.Outcomes["SOLD_OUT"] != 30 {
		t.Errorf("outcomes %v", run.Outcomes)
	}
	if run.HeldLatency.N != 70 || run.RefusedLatency.N != 30 {
		t.Errorf("histograms hold %d and %d values, want 70 and 30", run.HeldLatency.N, run.RefusedLatency.N)
	}
	q := run.HeldLatency
	if !(q.P50 <= q.P90 && q.P90 <= q.P99 && q.P99 <= q.Max) {
		t.Errorf("quantiles out of order: %+v", q)
	}
}

func TestKeysAreUniqueAndShapedLikePgbench(t *testing.T) {
	l := bench.Load{KeyBase: 7 * 10_000 * bench.KeyStride}
	if got, want := l.Key(3, 12), "70003000000012"; got != want {
		t.Errorf("Key(3, 12) = %s, want %s (base + client*1e9 + n, as the pgbench prologue)", got, want)
	}
	f := &fakeStock{keys: make(chan string, 1000)}
	f.units.Store(1 << 40)
	bench.DriveN(context.Background(), f, bench.Load{Clients: 8, SKU: "s"}, 500)
	close(f.keys)
	seen := map[string]bool{}
	for k := range f.keys {
		if seen[k] {
			t.Fatalf("key %s sent twice", k)
		}
		seen[k] = true
	}
	if len(seen) != 500 {
		t.Errorf("%d distinct keys, want 500", len(seen))
	}
}

// TestDriveClosedWindow: a fixed window; whatever is answered inside it is
// counted once, by class, and the stragglers separately.
func TestDriveClosedWindow(t *testing.T) {
	f := &fakeStock{delay: time.Millisecond}
	f.units.Store(25)
	run := bench.Drive(context.Background(), f, bench.Load{Clients: 3, SKU: "s", Duration: 100 * time.Millisecond})
	answers := run.Held + run.Refused + run.Shed + run.Errors
	if run.Outcomes["HELD"]+run.Outcomes["SOLD_OUT"] != answers || run.Held > 25 || run.HeldTotal < run.Held {
		t.Fatalf("held %d (total %d), answers %d, outcomes %v", run.Held, run.HeldTotal, answers, run.Outcomes)
	}
	if run.Loop != "closed" || run.Window != 0.1 {
		t.Errorf("loop %s window %v", run.Loop, run.Window)
	}
	if math.Abs(run.Goodput-float64(run.Held)/run.Window) > 1e-9 {
		t.Errorf("goodput %v != held/window", run.Goodput)
	}
}

// TestDriveOpenLoop: arrivals do not wait for answers. A service of 2 ms
// at 2000 requests a second keeps several requests in flight, and every
// planned request is sent; with the cap at one in flight the schedule still
// runs on, and the requests it could not send are counted as dropped.
// Either way every planned request is accounted for, and latency is
// measured from the planned time.
func TestDriveOpenLoop(t *testing.T) {
	for _, limit := range []int{0, 1} {
		f := &fakeStock{delay: 2 * time.Millisecond}
		f.units.Store(1 << 40)
		run := bench.Drive(context.Background(), f, bench.Load{SKU: "s", Duration: 200 * time.Millisecond,
			Rate: 2000, MaxInFlight: limit, Seed: 1})
		if run.Loop != "open" {
			t.Fatalf("loop %s", run.Loop)
		}
		if run.Planned != run.Sent+run.Skipped+run.NeverSent+run.Dropped {
			t.Errorf("cap %d: planned %d != sent %d + skipped %d + never sent %d + dropped %d", limit, run.Planned, run.Sent, run.Skipped, run.NeverSent, run.Dropped)
		}
		if run.Lag.N != run.Sent || run.Sent == 0 {
			t.Errorf("cap %d: lag recorded for %d of %d sent requests", limit, run.Lag.N, run.Sent)
		}
		if run.HeldLatency.P50 < 2 {
			t.Errorf("cap %d: median latency %.3f ms, below the service's 2 ms", limit, run.HeldLatency.P50)
		}
		switch limit {
		case 0:
			if run.InFlightCap != bench.DefaultMaxInFlight || run.MaxInFlight < 2 || run.Dropped != 0 {
				t.Errorf("no cap to speak of: %d in flight at most (cap %d), %d dropped; want several and none", run.MaxInFlight, run.InFlightCap, run.Dropped)
			}
		case 1:
			if run.MaxInFlight != 1 || run.Dropped == 0 {
				t.Errorf("cap 1: %d in flight at most, %d dropped; want 1 and some", run.MaxInFlight, run.Dropped)
			}
		}
	}
}

// waitForCancel answers nothing until its request's context is cancelled:
// a strategy so far behind that every request outlives the window.
type waitForCancel struct{}

func (waitForCancel) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	<-ctx.Done()
	return strategy.Result{}, ctx.Err()
}

func (waitForCancel) Lookup(context.Context, string) (strategy.Reservation, error) {
	return strategy.Reservation{}, nil
}

// TestDriveOpenInterruptsAfterTheGrace: the open loop cancels what is still
// in flight bench.OpenGrace after its window and counts it as interrupted,
// not as an error; a request answered in time is never interrupted.
func TestDriveOpenInterruptsAfterTheGrace(t *testing.T) {
	run := bench.Drive(context.Background(), waitForCancel{}, bench.Load{SKU: "s", Duration: 100 * time.Millisecond, Rate: 500, Seed: 1})
	if run.Sent == 0 || run.Interrupted != run.Sent || run.Errors != 0 || run.AfterWindow != 0 {
		t.Errorf("every request outlived the grace: sent %d, interrupted %d, errors %d, after the window %d; want interrupted = sent, no errors", run.Sent, run.Interrupted, run.Errors, run.AfterWindow)
	}
	f := &fakeStock{delay: 2 * time.Millisecond}
	f.units.Store(1 << 40)
	run = bench.Drive(context.Background(), f, bench.Load{SKU: "s", Duration: 100 * time.Millisecond, Rate: 500, Seed: 1})
	if run.Interrupted != 0 || run.Held == 0 {
		t.Errorf("2 ms requests: %d interrupted, %d held; want none interrupted", run.Interrupted, run.Held)
	}
}

// TestZipfSKUs: requests spread over the SKUs with the most popular first,
// and ZipfShares sums to one.
func TestZipfSKUs(t *testing.T) {
	skus := []string{"a", "b", "c", "d"}
	f := &fakeStock{keys: make(chan string, 1)}
	f.units.Store(1 << 40)
	count := map[string]int{}
	var mu sync.Mutex
	counting := countingStrategy{fakeStock: f, count: count, mu: &mu}
	bench.DriveN(context.Background(), counting, bench.Load{Clients: 2, SKUs: skus, Zipf: 1.5, Seed: 3}, 2000)
	if len(count) != 4 || !(count["a"] > count["b"] && count["b"] > count["d"]) {
		t.Errorf("counts per SKU %v: want every SKU, the first most often", count)
	}
	sum := 0.0
	for _, p := range bench.ZipfShares(1000, 1.1) {
		sum += p
	}
	if math.Abs(sum-1) > 1e-9 {
		t.Errorf("shares sum to %v", sum)
	}
}

type countingStrategy struct {
	*fakeStock
	count map[string]int
	mu    *sync.Mutex
}

func (c countingStrategy) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	c.mu.Lock()
	c.count[req.SKU]++
	c.mu.Unlock()
	return c.fakeStock.Reserve(ctx, req)
}

// TestDriveShed: refusals of an admission gate are their own class, with
// their own histogram, and a closed-loop client sends the same request
// again after the Retry-After.
func TestDriveShed(t *testing.T) {
	f := &fakeStock{delay: 5 * time.Millisecond}
	f.units.Store(1 << 40)
	g := admission.Wrap(f, admission.Limits{InFlight: 1, RetryAfter: time.Millisecond})
	run := bench.Drive(context.Background(), g, bench.Load{Clients: 4, SKU: "s", Duration: 100 * time.Millisecond})
	if run.Shed == 0 || run.ShedLatency.N != run.Shed || run.Outcomes["SHED:QUEUE_FULL"] != run.Shed {
		t.Fatalf("shed %d, histogram %d, outcomes %v", run.Shed, run.ShedLatency.N, run.Outcomes)
	}
	if st := g.Stats(); st.MaxInFlight != 1 {
		t.Errorf("gate let %d in at once", st.MaxInFlight)
	}
}

func TestSummarizeUsesStudentsT(t *testing.T) {
	s := bench.Summarize([]float64{1, 2, 3, 4, 5, math.NaN()})
	if s.N != 5 || s.Median != 3 || s.Mean != 3 || s.Min != 1 || s.Max != 5 {
		t.Fatalf("%+v", s)
	}
	// sd = 1.5811, t(0.975, 4 df) = 2.7764: half width 1.9632 (1.96·σ/√n would give 1.386).
	if half := (s.Hi - s.Lo) / 2; math.Abs(half-1.9632) > 1e-3 {
		t.Errorf("half width %.4f, want 1.9632", half)
	}
	if one := bench.Summarize([]float64{7}); one.Lo != 7 || one.Hi != 7 {
		t.Errorf("one value: %+v", one)
	}
	if even := bench.Summarize([]float64{4, 1, 3, 2}); even.Median != 2.5 {
		t.Errorf("median of 1..4: %v", even.Median)
	}
	if none := bench.Summarize(nil); none.N != 0 || none.Median != 0 {
		t.Errorf("no value: %+v", none)
	}
}
