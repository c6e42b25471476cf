package admission_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reservebench/reservebench/admission"
	"github.com/reservebench/reservebench/strategy"
)

// gated is a fake strategy whose calls block until the test lets them go,
// and which counts how many run at once.
type gated struct {
	entered chan string   // receives the key of every call that got inside
	proceed chan struct{} // one receive lets one call return

	now, max atomic.Int64
}

func newGated() *gated {
	return &gated{entered: make(chan string, 16), proceed: make(chan struct{})}
}

func (f *gated) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	n := f.now.Add(1)
	defer f.now.Add(-1)
	for m := f.max.Load(); n > m && !f.max.CompareAndSwap(m, n); m = f.max.Load() {
	}
	f.entered <- req.Key
	<-f.proceed
	return strategy.Result{Outcome: strategy.OutcomeHeld}, nil
}

func (f *gated) Lookup(context.Context, string) (strategy.Reservation, error) {
	return strategy.Reservation{Status: strategy.StatusNotFound}, nil
}

func req(key string) strategy.Request {
	return strategy.Request{Key: key, User: key, SKU: "sku", TTL: time.Minute}
}

// fakeTimers makes every wait deadline a channel the test fires by hand.
type fakeTimers struct {
	t    *testing.T
	want time.Duration
	made chan chan time.Time
}

func (ft *fakeTimers) timer(d time.Duration) (<-chan time.Time, func() bool) {
	if d != ft.want {
		ft.t.Errorf("wait deadline %v, want %v", d, ft.want)
	}
	c := make(chan time.Time, 1)
	ft.made <- c
	return c, func() bool { return true }
}

func rejection(t *testing.T, err error) admission.Reason {
	t.Helper()
	var rej *admission.RejectedError
	if !errors.As(err, &rej) || !errors.Is(err, admission.ErrRejected) {
		t.Fatalf("err = %v, want a *admission.RejectedError matching ErrRejected", err)
	}
	return rej.Reason
}

// TestC28_02 is seed 000's deterministic case: limit 2, queue 1, wait
// 300 ms. Two requests hold both slots; a third waits; the fourth is
// QUEUE_FULL; the waiter times out (WAIT_TIMEOUT) while nothing is
// released; after a release a new waiter is ADMITTED_AFTER_WAIT. Every step
// is ordered by channels: the gate's onWait hook says a waiter is in place,
// and the wait deadline is a timer the test fires.
func TestC28_02(t *testing.T) {
	ctx := context.Background()
	inner := newGated()
	g := admission.Wrap(inner, admission.Limits{InFlight: 2, Queue: 1, Wait: 300 * time.Millisecond})
	ft := &fakeTimers{t: t, want: 300 * time.Millisecond, made: make(chan chan time.Time, 4)}
	g.SetTimer(ft.timer)
	inPlace := make(chan struct{}, 4)
	g.SetOnWait(func() { inPlace <- struct{}{} })

	type answer struct {
		key string
		err error
	}
	answers := make(chan answer, 8)
	send := func(key string) {
		go func() {
			_, err := g.Reserve(ctx, req(key))
			answers <- answer{key, err}
		}()
	}

	// Requests 1 and 2 take both slots and stay inside the strategy.
	send("r1")
	send("r2")
	<-inner.entered
	<-inner.entered
	// Request 3 waits; the hook says when it is in place.
	send("r3")
	<-inPlace
	deadline3 := <-ft.made
	// Request 4 finds both slots taken and the one queue place used.
	_, err := g.Reserve(ctx, req("r4"))
	if r := rejection(t, err); r != admission.QueueFull {
		t.Fatalf("request 4: %v, want QUEUE_FULL", r)
	}
	// Nothing is released; request 3's deadline passes.
	deadline3 <- time.Now()
	if a := <-answers; a.key != "r3" || rejection(t, a.err) != admission.WaitTimeout {
		t.Fatalf("request 3: %v %v, want WAIT_TIMEOUT", a.key, a.err)
	}
	// Request 5 waits; one slot is released; request 5 gets it.
	send("r5")
	<-inPlace
	<-ft.made // its deadline never fires
	inner.proceed <- struct{}{}
	if a := <-answers; a.err != nil {
		t.Fatalf("released request %s: %v", a.key, a.err)
	}
	if key := <-inner.entered; key != "r5" {
		t.Fatalf("entered after the release: %s, want r5", key)
	}
	inner.proceed <- struct{}{}
	inner.proceed <- struct{}{}
	for i := 0; i < 2; i++ {
		if a := <-answers; a.err != nil {
			t.Fatalf("%s: %v", a.key, a.err)
		}
	}

	want := admission.Stats{Admitted: 2, AdmittedAfterWait: 1, RejectedQueueFull: 1, RejectedTimeout: 1, MaxInFlight: 2, MaxWaiting: 1}
	if got := g.Stats(); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
	if inner.max.Load() != 2 {
		t.Errorf("the strategy saw %d calls at once, want 2", inner.max.Load())
	}
}

// TestWaitTimeoutRealTimer checks that the default timer bounds the wait.
func TestWaitTimeoutRealTimer(t *testing.T) {
	inner := newGated()
	g := admission.Wrap(inner, admission.Limits{InFlight: 1, Queue: 1, Wait: 20 * time.Millisecond})
	done := make(chan error, 1)
	go func() {
		_, err := g.Reserve(context.Background(), req("holder"))
		done <- err
	}()
	<-inner.entered
	start := time.Now()
	_, err := g.Reserve(context.Background(), req("waiter"))
	if r := rejection(t, err); r != admission.WaitTimeout {
		t.Fatalf("%v, want WAIT_TIMEOUT", r)
	}
	if waited := time.Since(start); waited < 20*time.Millisecond {
		t.Errorf("refused after %v, before the 20ms wait", waited)
	}
	inner.proceed <- struct{}{}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestCanceled: a waiter whose context ends is refused with CANCELED and
// the context's error; a call whose context has already ended never enters.
func TestCanceled(t *testing.T) {
	inner := newGated()
	g := admission.Wrap(inner, admission.Limits{InFlight: 1, Queue: 1, Wait: time.Hour})
	inPlace := make(chan struct{}, 1)
	g.SetOnWait(func() { inPlace <- struct{}{} })
	done := make(chan error, 1)
	go func() {
		_, err := g.Reserve(context.Background(), req("holder"))
		done <- err
	}()
	<-inner.entered

	ctx, cancel := context.WithCancel(context.Background())
	waiter := make(chan error, 1)
	go func() {
		_, err := g.Lookup(ctx, "k")
		waiter <- err
	}()
	<-inPlace
	cancel()
	err := <-waiter
	if r := rejection(t, err); r != admission.Canceled || !errors.Is(err, context.Canceled) {
		t.Fatalf("%v (%v), want CANCELED matching context.Canceled", r, err)
	}
	if _, err := g.Reserve(ctx, req("late")); rejection(t, err) != admission.Canceled {
		t.Fatalf("a call with an ended context: %v", err)
	}
	inner.proceed <- struct{}{}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := g.Stats(); s.RejectedCanceled != 2 || s.Admitted != 1 {
		t.Errorf("stats %+v", s)
	}
}

func TestNoQueueRefusesAtOnce(t *testing.T) {
	inner := newGated()
	g := admission.Wrap(inner, admission.Limits{InFlight: 1})
	done := make(chan error, 1)
	go func() {
		done <- g.Do(context.Background(), func(ctx context.Context) error {
			_, err := inner.Reserve(ctx, req("inside Do"))
			return err
		})
	}()
	<-inner.entered
	_, err := g.Reserve(context.Background(), req("second"))
	var rej *admission.RejectedError
	if !errors.As(err, &rej) || rej.Reason != admission.QueueFull || rej.RetryAfter() != time.Second {
		t.Fatalf("err %v, want QUEUE_FULL with the default Retry-After of 1s", err)
	}
	inner.proceed <- struct{}{}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestInvalidLimits(t *testing.T) {
	for _, l := range []admission.Limits{
		{InFlight: 0},
		{InFlight: 1, Queue: -1},
		{InFlight: 1, Queue: 2},
		{InFlight: 1, Wait: -time.Second},
	} {
		if _, err := admission.New(newGated(), l); err == nil {
			t.Errorf("New(%+v) accepted", l)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("Wrap with InFlight 0 did not panic")
		}
	}()
	admission.Wrap(newGated(), admission.Limits{})
}

// counting is a fake strategy that only counts concurrency.
type counting struct{ now, max, calls atomic.Int64 }

func (c *counting) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	n := c.now.Add(1)
	for m := c.max.Load(); n > m && !c.max.CompareAndSwap(m, n); m = c.max.Load() {
	}
	c.calls.Add(1)
	runtime.Gosched() // let others pile up while this one is inside
	c.now.Add(-1)
	return strategy.Result{Outcome: strategy.OutcomeHeld}, nil
}

func (c *counting) Lookup(context.Context, string) (strategy.Reservation, error) {
	return strategy.Reservation{}, nil
}

// TestPropertyInFlightBound sends thousands of concurrent calls through
// gates of several shapes: the strategy never sees more than InFlight at
// once, the queue never holds more than Queue, and every call is either
// admitted or refused, the counters adding up exactly. Run it with -race.
func TestPropertyInFlightBound(t *testing.T) {
	const calls = 4000
	for _, l := range []admission.Limits{
		{InFlight: 1, Queue: 0},
		{InFlight: 3, Queue: 5, Wait: time.Millisecond},
		{InFlight: 4, Queue: calls, Wait: time.Minute}, // everyone waits, nobody is refused
		{InFlight: 16, Queue: 64, Wait: 50 * time.Microsecond},
	} {
		t.Run(fmt.Sprintf("inflight=%d/queue=%d", l.InFlight, l.Queue), func(t *testing.T) {
			inner := &counting{}
			g := admission.Wrap(inner, l)
			var wg sync.WaitGroup
			var ok, refused, other atomic.Int64
			start := make(chan struct{})
			for i := 0; i < calls; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					_, err := g.Reserve(context.Background(), req(fmt.Sprint(i)))
					switch {
					case err == nil:
						ok.Add(1)
					case errors.Is(err, admission.ErrRejected):
						refused.Add(1)
					default:
						other.Add(1)
					}
				}()
			}
			close(start)
			wg.Wait()
			s := g.Stats()
			if inner.max.Load() > int64(l.InFlight) || s.MaxInFlight > int64(l.InFlight) {
				t.Errorf("in flight: strategy saw %d, gate saw %d, limit %d", inner.max.Load(), s.MaxInFlight, l.InFlight)
			}
			if s.MaxWaiting > int64(l.Queue) {
				t.Errorf("waiting: %d, limit %d", s.MaxWaiting, l.Queue)
			}
			if other.Load() != 0 || ok.Load()+refused.Load() != calls {
				t.Errorf("ok %d + refused %d + other %d != %d", ok.Load(), refused.Load(), other.Load(), calls)
			}
			if s.Admitted+s.AdmittedAfterWait != ok.Load() || inner.calls.Load() != ok.Load() || s.Rejected() != refused.Load() {
				t.Errorf("counters %+v disagree with ok %d refused %d (strategy called %d times)", s, ok.Load(), refused.Load(), inner.calls.Load())
			}
			if l.Queue == calls && refused.Load() != 0 {
				t.Errorf("a queue as large as the load refused %d calls", refused.Load())
			}
			if g.InFlight() != 0 || g.Waiting() != 0 {
				t.Errorf("after the storm: %d in flight, %d waiting", g.InFlight(), g.Waiting())
			}
		})
	}
}
