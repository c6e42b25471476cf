package strategytest

import (
	"context"
	"fmt"
	"strings"
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
// makes it the rule: the harness holds the strategy's tables (EXCLUSIVE
// mode: every write waits, reads go on, so a recount can run), sends one
// request per listed node, waits until each has queued on that lock or
// answered (read from the server's lock waits, as the gate does), restarts,
// and only then lets the requests write.

// restartWaitMax bounds how long the tables stay held once the restart has
// begun. A restart that waits for the requests in flight cannot return
// while they are held, so after this bound they are let go and the restart
// finishes behind them; a restart that does not wait returns in
// milliseconds. It bounds a wait, it orders nothing a check relies on: a
// strategy that waits passes whatever the bound, and one that does not
// has recounted before the bound unless its recount takes longer.
const restartWaitMax = 2 * time.Second

// restartWithInFlight runs a restart phase with one request in flight on
// each node of ph.InFlight. The requests' answers are a varying count: a
// request of a restarted node may commit (its restart waited) or end
// unknown; the audits of the phases after it judge the count.
func (t *trial) restartWithInFlight(ctx context.Context, ph Phase, label string) error {
	tables, err := t.tablesToGate(ctx)
	if err != nil {
		return err
	}
	conn, err := t.env.Admin.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", label, err)
	}
	defer conn.Release()
	locked := len(tables) > 0
	if locked {
		if _, err := conn.Exec(ctx, "BEGIN; SET LOCAL lock_timeout = '10s'; LOCK TABLE "+strings.Join(tables, ", ")+" IN EXCLUSIVE MODE"); err != nil {
			return fmt.Errorf("%s: hold the strategy's tables: %w", label, err)
		}
	}
	release := func() error {
		if !locked {
			return nil
		}
		locked = false
		_, err := conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		return err
	}
	defer release() //nolint:errcheck // released below on every path that gets there
	holder := conn.Conn().PgConn().PID()

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
			n := ph.InFlight[i]
			req := strategy.Request{Key: t.key(fmt.Sprintf("in-flight-%d", i)), User: t.user(fmt.Sprintf("user-in-flight-%d", i)), SKU: sku, TTL: strategy.TTLForever}
			ops[i] = t.reserveDefinite(ctx, "in-flight", n, req)
		})
	}()
	queued, err := t.awaitQueued(ctx, holder, len(ph.InFlight), &finished, requests)
	if err != nil {
		_ = release()
		<-requests
		return fmt.Errorf("%s: %w", label, err)
	}
	t.vary("requests queued on the held tables when the restart began", queued)

	t.restarted = true
	restarted := make(chan error, 1)
	go func() {
		for _, n := range ph.Restart {
			if err := t.dep.(strategy.Restarter).Restart(ctx, n); err != nil {
				restarted <- fmt.Errorf("restart node %d: %w", n, err)
				return
			}
		}
		restarted <- nil
	}()
	bound := time.NewTimer(restartWaitMax)
	defer bound.Stop()
	var restartErr error
	waited := 0
	select {
	case restartErr = <-restarted:
		restarted <- restartErr
	case <-bound.C:
		waited = 1 // it waits for the requests (or is slow): let them go
	}
	t.vary("restarts still waiting when the held tables were let go", waited)
	if err := release(); err != nil {
		<-requests
		<-restarted
		return fmt.Errorf("%s: let the tables go: %w", label, err)
	}
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

// awaitQueued waits until each of n calls has either finished or queued on
// a lock of holder's, and returns how many queued. A call that does neither
// within gateMax is left to run: it waits somewhere else (in the strategy
// or in Redis), which the restart then meets as it finds it.
func (t *trial) awaitQueued(ctx context.Context, holder uint32, n int, finished *atomic.Int64, done <-chan struct{}) (int, error) {
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return 0, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
		var queued int
		if err := t.env.Admin.QueryRow(ctx, sqlQueuedOnGate, holder).Scan(&queued); err != nil {
			return 0, fmt.Errorf("count the requests queued on the held tables: %w", err)
		}
		if queued+int(finished.Load()) >= n || time.Since(start) > gateMax {
			return queued, nil
		}
	}
}
