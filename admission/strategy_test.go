package admission_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reservebench/reservebench/admission"
	_ "github.com/reservebench/reservebench/all"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/resourcetest"
	"github.com/reservebench/reservebench/strategy"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestRealStrategies is seed C28-05 without the HTTP front, over every
// registered strategy on a real PostgreSQL: 120 clients arrive at once for
// 30 units through a gate of limit 4, queue 8, wait 400 ms. A refused client
// backs off and sends the same request (same key) again until it gets a
// definite answer. The strategy never has more than 4 calls in flight (seen
// from a counter between the gate and the strategy, and by the gate), every
// client ends with exactly one definite outcome, exactly 120 calls are
// admitted (a refusal never reached the database), and the stock is 30 HELD,
// 90 SOLD_OUT, drift 0. How many refusals there are depends on scheduling
// and is only logged.
func TestRealStrategies(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL; skipped with -short")
	}
	const clients, stock = 120, 30
	metas := strategy.Registered()
	if len(metas) == 0 {
		t.Fatal("no strategy registered")
	}
	for _, m := range metas {
		t.Run(m.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			db, _ := pgtest.Pools(t)
			res := resourcetest.New(t, m) // what the strategy needs besides PostgreSQL
			dep, err := m.Open(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: "c28-05", Total: stock}}, Resources: res.Addrs()})
			if err != nil {
				t.Fatal(err)
			}
			defer dep.Close()
			probe := &probe{inner: dep.Node(0)}
			g := admission.Wrap(probe, admission.Limits{InFlight: 4, Queue: 8, Wait: 400 * time.Millisecond})

			var mu sync.Mutex
			outcomes := map[strategy.Outcome]int{}
			var refusals atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := 0; i < clients; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					r := strategy.Request{Key: fmt.Sprintf("k%03d", i), User: fmt.Sprintf("u%03d", i), SKU: "c28-05", TTL: strategy.TTLForever}
					for attempt := 1; ; attempt++ {
						res, err := g.Reserve(ctx, r)
						var rej *admission.RejectedError
						if errors.As(err, &rej) {
							refusals.Add(1)
							// The client's back-off after a 503, as in the
							// seed: it orders nothing in this test.
							time.Sleep(time.Duration(attempt)*2*time.Millisecond + rand.N(2*time.Millisecond))
							continue
						}
						if err != nil {
							t.Errorf("%s: %v", r.Key, err)
							return
						}
						mu.Lock()
						outcomes[res.Outcome]++
						mu.Unlock()
						return
					}
				}()
			}
			close(start)
			wg.Wait()

			s := g.Stats()
			t.Logf("outcomes %v, refusals %d, gate %+v", outcomes, refusals.Load(), s)
			if probe.max.Load() > 4 || s.MaxInFlight > 4 {
				t.Errorf("in flight: the strategy saw %d at once, the gate %d; limit 4", probe.max.Load(), s.MaxInFlight)
			}
			if s.MaxWaiting > 8 {
				t.Errorf("waiting: %d, limit 8", s.MaxWaiting)
			}
			if got := s.Admitted + s.AdmittedAfterWait; got != clients || probe.calls.Load() != clients {
				t.Errorf("admitted %d, strategy called %d times; want %d each (one per client)", got, probe.calls.Load(), clients)
			}
			if s.Rejected() != refusals.Load() {
				t.Errorf("gate counted %d refusals, clients saw %d", s.Rejected(), refusals.Load())
			}
			if outcomes[strategy.OutcomeHeld] != stock || outcomes[strategy.OutcomeSoldOut] != clients-stock {
				t.Errorf("outcomes %v, want HELD %d SOLD_OUT %d", outcomes, stock, clients-stock)
			}
			audits, err := dep.Audit(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range audits {
				if a.Drift() != 0 || a.Active != stock {
					t.Errorf("audit %+v: drift %d, active %d", a, a.Drift(), a.Active)
				}
			}
		})
	}
}

// probe sits between the gate and the strategy and counts the calls that
// are inside the strategy at once.
type probe struct {
	inner           strategy.Strategy
	now, max, calls atomic.Int64
}

func (p *probe) enter() func() {
	n := p.now.Add(1)
	p.calls.Add(1)
	for m := p.max.Load(); n > m && !p.max.CompareAndSwap(m, n); m = p.max.Load() {
	}
	return func() { p.now.Add(-1) }
}

func (p *probe) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	defer p.enter()()
	return p.inner.Reserve(ctx, req)
}

func (p *probe) Lookup(ctx context.Context, key string) (strategy.Reservation, error) {
	defer p.enter()()
	return p.inner.Lookup(ctx, key)
}
