package strategytest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/reservebench/reservebench/strategy"
)

// A node that recovers its count on restart reads what is committed. A
// request of the old node that took its unit and has not committed yet is
// not there to read: unless the restart waits for it (or the count allows
// for it), the new node sells that unit again when the request commits.
// Between phases nothing is in flight, so a restart phase alone never
// shows it; under load it shows in a few restarts in a hundred. Phase.InFlight
// makes it the rule: the harness holds the strategy's tables in SHARE mode
// (every INSERT, UPDATE and DELETE waits; reads, FOR UPDATE ones too, go
// on, so a recount runs without waiting for the harness), sends one
// request per listed node, waits until each has queued on that lock or
// answered (read from the server's lock waits: waitActivity), restarts, and
// only then lets the requests write.

// restartWaitMax bounds how long the tables stay held once the restart has
// begun. A restart that waits for the requests in flight cannot return
// while they are held, so after this bound they are let go and the restart
// finishes behind them; a restart that does not wait returns in
// milliseconds. It bounds a wait, it orders nothing a check relies on: a
// strategy that waits passes whatever the bound, and one that does not
// has recounted before the bound unless its recount takes longer.
const restartWaitMax = 6 * time.Second

// restartWithInFlight runs a restart phase with one request in flight on
// each node of ph.InFlight. The requests' answers are a varying count: a
// request of a restarted node may commit (its restart waited) or end
// unknown; the audits of the phases after it judge the count.
func (t *trial) restartWithInFlight(ctx context.Context, ph Phase, label string) error {
	tables, err := t.tablesToGate(ctx)
	if err != nil {
		return err
	}
	release := func() {}
	if len(tables) > 0 { // else nothing to queue on: the requests run as they will
		if release, err = holdTables(ctx, t.env.Admin, "SHARE"); err != nil {
			return fmt.Errorf("%s: %w", label, err)
		}
	}
	defer func() { release() }()

	sku := t.sku(t.in.Stock[0].SKU)
	ops := make([]Op, len(ph.InFlight))
	var finished atomic.Int64
	requests := make(chan struct{})
	var box panicBox
	defer box.rethrow()
	go func() {
		defer close(requests)
		defer box.catch()
		Together(len(ph.InFlight), func(i int) {
			defer finished.Add(1)
			req := strategy.Request{Key: t.key(fmt.Sprintf("in-flight-%d", i)), User: t.user(fmt.Sprintf("user-in-flight-%d", i)), SKU: sku, TTL: strategy.TTLForever}
			ops[i] = t.reserveDefinite(ctx, "in-flight", ph.InFlight[i], req)
		})
	}()
	if len(tables) > 0 {
		if _, err := waitActivity(ctx, t.env.Admin, "requests in flight queued on the harness's lock", `wait_event_type = 'Lock'`, len(ph.InFlight), &finished); err != nil {
			release()
			<-requests
			return fmt.Errorf("%s: %w", label, err)
		}
	}

	t.restarted = true
	restarted := make(chan error, 1)
	go func() {
		// A Restart that panics is the strategy's panic, as a request's is:
		// box rethrows it in this goroutine's caller.
		err := errors.New("restart panicked")
		defer func() { restarted <- err }()
		defer box.catch()
		for _, n := range ph.Restart {
			if rerr := t.dep.(strategy.Restarter).Restart(ctx, n); rerr != nil {
				err = fmt.Errorf("restart node %d: %w", n, rerr)
				return
			}
		}
		err = nil
	}()
	bound := time.NewTimer(restartWaitMax)
	defer bound.Stop()
	waited := 0
	select {
	case err := <-restarted:
		restarted <- err
	case <-bound.C:
		waited = 1 // it waits for the requests (or is slow): let them go
	}
	t.vary("restarts still waiting when the held tables were let go", waited)
	release()
	release = func() {}
	<-requests
	if err := <-restarted; err != nil {
		return err
	}
	held := 0
	for _, op := range ops {
		if op.Type == OpOK && op.Outcome == strategy.OutcomeHeld {
			held++
		}
	}
	t.vary("requests in flight during the restart answered HELD", held)
	return nil
}
