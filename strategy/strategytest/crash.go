package strategytest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/reservebench/reservebench/strategy"
)

// load sends n requests from the workers, request i for SKU i modulo the
// stock's SKUs, each with its own deadline when timeout > 0. It counts
// acknowledged reservations in acked, and stops taking new requests once
// stop is closed.
func (t *trial) load(ctx context.Context, n int, prefix string, timeout time.Duration, stop <-chan struct{}, acked *atomic.Int64, onError func()) {
	queue := make(chan int, n)
	for i := t.loadFrom; i < n; i++ {
		queue <- i
	}
	close(queue)
	var wg sync.WaitGroup
	var box panicBox
	defer box.rethrow()
	for w := 0; w < t.in.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer box.catch()
			for i := range queue {
				select {
				case <-stop:
					return
				default:
				}
				rctx, cancel := ctx, context.CancelFunc(func() {})
				switch {
				case timeout > 0 && t.loadCancelsOdd && i%2 == 1:
					var giveUp context.CancelFunc
					rctx, giveUp = context.WithCancel(ctx)
					timer := time.AfterFunc(timeout, giveUp)
					cancel = func() { timer.Stop(); giveUp() }
				case timeout > 0:
					rctx, cancel = context.WithTimeout(ctx, timeout)
				}
				stock := t.in.Stock
				if t.loadStock != nil {
					stock = t.loadStock
				}
				sku := t.sku(stock[i%len(stock)].SKU)
				op := t.reserve(rctx, fmt.Sprintf("w%d", w), i, strategy.Request{
					Key: t.key(fmt.Sprintf("%s-%04d", prefix, i)), User: t.user(fmt.Sprintf("user-%s-%04d", prefix, i)), SKU: sku, TTL: strategy.TTLForever})
				cancel()
				if op.Type == OpOK && acked != nil {
					acked.Add(1)
				}
				if op.Type == OpInfo && onError != nil {
					onError()
				}
			}
		}()
	}
	wg.Wait()
}

// countTypes counts the reserve operations by type.
func (t *trial) countTypes() (ok, fail, info int) { return t.countTypesOf("") }

// countTypesOf counts by type the reserve operations that t.load sent with
// this key prefix (all of them when it is empty).
func (t *trial) countTypesOf(prefix string) (ok, fail, info int) {
	for _, op := range t.hist.Ops() {
		if op.Kind != "reserve" || (prefix != "" && !strings.HasPrefix(op.Req.Key, prefix+"-")) {
			continue
		}
		switch op.Type {
		case OpOK:
			ok++
		case OpFail:
			fail++
		case OpInfo:
			info++
		}
	}
	return ok, fail, info
}

// resetPools drops every connection of the harness's pools: after a server
// restart they are all dead.
func (t *trial) resetPools() {
	t.env.DB.Reset()
	if t.env.Admin != t.env.DB {
		t.env.Admin.Reset()
	}
}

// runServerCrash stops the server with pg_ctl stop -m immediate while
// reservations run, starts it again on the same data, and checks the history
// against what survived: acknowledged reservations are there, refused ones
// are not, unknown ones are resolved, the audit balances, and the strategy
// serves again.
func runServerCrash(ctx context.Context, t *trial) error {
	in := t.in
	crashAfter := in.CrashAfter[(t.n-1)%len(in.CrashAfter)]
	var acked atomic.Int64
	stop := make(chan struct{})
	var stopOnce sync.Once
	halt := func() { stopOnce.Do(func() { close(stop) }) }
	// Once the crash has begun, the first error means the server is going:
	// the workers finish what is in flight and send nothing more. An error
	// before it (a SERIALIZABLE variant out of retries) is only an unknown
	// outcome, and stopping on it would end the load short of crashAfter.
	var crashing atomic.Bool
	haltIfCrashing := func() {
		if crashing.Load() {
			halt()
		}
	}
	loadDone := make(chan struct{})
	var box panicBox
	defer box.rethrow()
	go func() {
		defer close(loadDone)
		defer box.catch()
		t.load(ctx, in.Requests, "load", 0, stop, &acked, haltIfCrashing)
	}()
	// Crash once crashAfter reservations are acknowledged (counted, not timed).
	tick := time.NewTicker(time.Millisecond)
	for acked.Load() < int64(crashAfter) {
		select {
		case <-loadDone:
			tick.Stop()
			return fmt.Errorf("the load finished before %d acknowledgements", crashAfter)
		case <-tick.C:
		}
	}
	tick.Stop()
	crashing.Store(true)
	if err := t.env.Server.Crash(ctx); err != nil {
		halt()
		<-loadDone
		return fmt.Errorf("crash: %w", err)
	}
	halt()
	<-loadDone
	if err := t.env.Server.Restart(ctx); err != nil {
		return fmt.Errorf("restart after crash: %w", err)
	}
	t.resetPools()
	ok, fail, info := t.countTypes()
	t.fact(fmt.Sprintf("crash after %d acknowledged", crashAfter), "the server was stopped with pg_ctl stop -m immediate and started again")
	t.vary("acknowledged before the crash", ok)
	t.vary("refused before the crash", fail)
	t.vary("outcome unknown at the crash", info)

	// What the crash left: acknowledged reservations must all be there, and
	// the audit right after the restart shows what in-memory counters made
	// of the requests in flight (memquota holds their units in doubt).
	var ackedKeys []string
	for _, op := range t.hist.Ops() {
		if op.Kind == "reserve" && op.Type == OpOK {
			ackedKeys = append(ackedKeys, op.Req.Key)
		}
	}
	present, err := t.lookupAll(ctx, ackedKeys)
	if err != nil {
		return err
	}
	missing := 0
	for _, d := range present {
		if d.Status == strategy.StatusNotFound {
			missing++
		}
	}
	if missing == 0 {
		t.fact("acknowledged before the crash, present after recovery", "all")
	} else {
		t.fact("acknowledged before the crash, present after recovery", "%d missing", missing)
	}
	early, err := t.audit(ctx)
	if err != nil {
		return err
	}
	t.vary("drift right after the restart, before any request", early[t.sku(in.Stock[0].SKU)].Drift())

	// The strategy serves again once the server is back.
	sku := t.sku(in.Stock[0].SKU)
	served := 0
	for i := 0; i < 3; i++ {
		op := t.reserveDefinite(ctx, "after", i, strategy.Request{Key: t.key(fmt.Sprintf("req-after-%d", i)), User: t.user(fmt.Sprintf("user-after-%d", i)), SKU: sku, TTL: strategy.TTLForever})
		if op.Type == OpOK {
			served++
		}
	}
	t.fact("served after restart", "%d of 3", served)
	late, err := t.audit(ctx)
	if err != nil {
		return err
	}
	// A unit a strategy took outside PostgreSQL (a Redis counter) for a
	// request whose insert the crash cut off stays out until the client
	// resends: how many depends on what was in flight, so it is a varying
	// count; the fact is the drift once the client has resent what got no
	// answer (the contract's way of resolving an unknown outcome).
	t.vary("drift once it serves again, before the unknown outcomes are resent", late[sku].Drift())
	t.check(Base, "the strategy serves requests again after the server restarts", served == 3, fmt.Sprintf("%d of 3 requests acknowledged", served))
	if err := t.resendUnknown(ctx); err != nil {
		return err
	}
	settled, err := t.audit(ctx)
	if err != nil {
		return err
	}
	t.fact("drift once the unknown outcomes are resent", "%d", settled[sku].Drift())
	return nil
}
