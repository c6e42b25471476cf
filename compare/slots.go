package compare

import (
	"context"
	"sort"
	"sync"

	"github.com/reservebench/reservebench/strategy/strategytest"
)

// Slots: the cells of the table (one scenario against one strategy) take a
// slot each, a row's cells one at a time but for its long cells, which run
// beside it (compare.go). A freed slot goes to the
// heaviest cell waiting for it, so the long cells of every strategy start
// first and the table's tail is made of short ones, and the negative
// controls (short, many) fill it: with one slot per strategy for its whole
// row, as before, whichever heavy strategy got its slot last set the
// table's wall time, on cores that sat idle meanwhile.
//
// The paced scenarios (Scenario.Paced: their time is the seed's timers,
// not work) have slots of their own, so a cell that waits on a 600 ms
// handler never holds a slot that a cell with work to do could use. So do
// the long ones (Scenario.Work: the deployment contract, redis-restart),
// for the same reason: they are long because they wait, for holds past a
// timeout, for a stalled Redis, for a request to block, and a deployment
// contract uses a tenth of a core over its 25 s alone. While they held
// the work slots, the first 40 s of the table left half the cores idle;
// with slots of their own, the cores are busy from its tenth second to
// its last few (2026-12-07: 124 s to 106 s).
//
// A weighted semaphore (x/sync/semaphore) serves waiters in arrival order;
// the order by weight is the point here, hence this small queue.

// slotPool hands out n slots, heaviest waiter first, then first come.
type slotPool struct {
	mu      sync.Mutex
	free    int
	seq     int
	waiting []*slotWaiter
}

type slotWaiter struct {
	weight int
	seq    int
	ready  chan struct{}
}

// pacedSlots is how many paced cells run at once, beside the work slots.
const pacedSlots = 3

// costWeight puts every strategy's cost run (a few hundred requests at one
// client, compare/cost.go: a second or two) before any cell: a strategy
// asks for its first cell's slot only once its cost run is done, and when
// the cost runs weighed less than duplicate-key, the strategies whose cost
// run came last waited behind the others' middle cells, and started their
// deployment contract, their longest cell, a minute in (2026-12-07).
const costWeight = 1 << 30

func newSlotPool(n int) *slotPool { return &slotPool{free: max(n, 1)} }

// acquire waits for a slot; the caller releases it.
func (p *slotPool) acquire(ctx context.Context, weight int) error {
	p.mu.Lock()
	if p.free > 0 && len(p.waiting) == 0 {
		p.free--
		p.mu.Unlock()
		return nil
	}
	p.seq++
	w := &slotWaiter{weight: weight, seq: p.seq, ready: make(chan struct{})}
	p.waiting = append(p.waiting, w)
	p.mu.Unlock()
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
		p.mu.Lock()
		defer p.mu.Unlock()
		select {
		case <-w.ready: // handed a slot just now: give it to the next one
			p.handOff()
		default:
			p.waiting = removeWaiter(p.waiting, w)
		}
		return ctx.Err()
	}
}

func (p *slotPool) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.handOff()
}

// handOff gives a freed slot to the heaviest waiter, or keeps it free.
func (p *slotPool) handOff() {
	if len(p.waiting) == 0 {
		p.free++
		return
	}
	sort.Slice(p.waiting, func(i, j int) bool {
		a, b := p.waiting[i], p.waiting[j]
		if a.weight != b.weight {
			return a.weight > b.weight
		}
		return a.seq < b.seq
	})
	w := p.waiting[0]
	p.waiting = p.waiting[1:]
	close(w.ready)
}

func removeWaiter(ws []*slotWaiter, w *slotWaiter) []*slotWaiter {
	for i, x := range ws {
		if x == w {
			return append(ws[:i], ws[i+1:]...)
		}
	}
	return ws
}

// slots are the pools of a run: work cells, paced cells, long cells, and
// the rows of negative controls under way. Every strategy's row begins at
// once, so that the heavy cells of all of them come first, whichever row
// they are in; each row keeps its database and warm pools between its
// cells (pgtest.SharedMaxConnections is sized for it). The controls' rows,
// many and short, begin some at a time as slots free up.
type slots struct {
	controlRows, work, paced, long *slotPool
}

func newSlots(work, paced int) *slots {
	return &slots{controlRows: newSlotPool(controlRowsPerWorkSlot * work), work: newSlotPool(work), paced: newSlotPool(paced), long: newSlotPool(int(longSlotsPerWorkSlot * float64(work)))}
}

// longSlotsPerWorkSlot: long cells at once per work slot. With 1.25, the
// strategies' 19 long cells filled them until a minute in, and the
// controls' ones (redis-restart's stall, 10 s each) made the table's tail.
const longSlotsPerWorkSlot = 2.0

// controlRowsPerWorkSlot: controls under way per work slot, enough for a
// freed slot to find one of their cells waiting. A row begins its
// resources (a Redis) at once, and its database with its first cell. With
// 2, the 16 rows under way all waited for work slots, which the
// strategies held until 70 s in, and no control's long cell ran before;
// with 8, the shared server peaked at 859 connections of its 1,000, with
// 4 at 629 (2026-12-07).
const controlRowsPerWorkSlot = 4

// pool is the pool a scenario's cell takes its slot from.
func (s *slots) pool(in *strategytest.Scenario) *slotPool {
	if in.Paced {
		return s.paced
	}
	if in.Work > 0 {
		return s.long
	}
	return s.work
}

// strategyWeight is added to the weight of every strategy's cell, never
// a control's: a control's cell waits until no strategy's cell does.
const strategyWeight = 1 << 40

// weight estimates a scenario's work: the requests it sends over all its
// trials (a gated round costs about as much again in probes), so that
// storm (2,000 requests) starts before a scenario of a few sessions. A
// scenario that says what it costs (Scenario.Work) weighs that: the
// deployment contract sends few requests of its own, yet it is every
// strategy's longest cell (30 to 90 s), and when it was weighed by its
// requests it ran last in every row, the table's tail made of them.
func weight(in *strategytest.Scenario) int {
	if in.Work > 0 {
		return in.Work
	}
	n := in.Requests + in.Held + in.ThenRequests + in.Workers
	for _, ph := range in.Phases {
		for _, g := range ph.Requests {
			n += g.Count * max(g.Groups, 1) * max(ph.Repeat, 1)
		}
	}
	if in.Gate {
		n *= 2
	}
	return max(in.Repetitions, 1) * max(n, 1)
}
