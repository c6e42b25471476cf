package strategytest

import (
	"context"
	"fmt"

	"github.com/reservebench/reservebench/strategy"
)

// runNodeDeath: node 0 sells some units, then requests die on it between
// the in-memory decrement and the durable write. The lost units are counted
// from the audit; then node 0 restarts and sells again, and the final audit
// shows whether the restart restored exactly the right count.
func runNodeDeath(ctx context.Context, t *trial) error {
	in := t.in
	sku := t.sku(in.Stock[0].SKU)
	req := func(prefix string, i int) strategy.Request {
		return strategy.Request{Key: t.key(fmt.Sprintf("%s-%03d", prefix, i)), User: t.user(fmt.Sprintf("user-%s-%03d", prefix, i)), SKU: sku, TTL: strategy.TTLForever}
	}
	for i := 0; i < in.Held; i++ {
		if op := t.reserveDefinite(ctx, "c", 0, req("sold", i)); op.Outcome != strategy.OutcomeHeld {
			return fmt.Errorf("setup: %s answered %s %s", op.Req.Key, op.Outcome, op.Err)
		}
	}
	// From the first death on, what the audit finds is the restart's to answer for.
	t.restarted = true
	crasher := t.dep.(strategy.ReserveCrasher) // probed: node-death needs it
	for i := 0; i < in.Crashes; i++ {
		r := req("dies", i)
		op := Op{Process: "dying", Node: 0, Req: r, Invoke: t.hist.Begin()}
		err := crasher.CrashMidReserve(ctx, 0, r)
		op = reserveOp(op, strategy.Result{}, err)
		if err == nil {
			op.Type, op.Err = OpInfo, "the request did not die"
		}
		t.hist.End(op)
	}
	lost, err := t.audit(ctx)
	if err != nil {
		return err
	}
	a := lost[sku]
	t.fact("units lost while node 0 runs on (drift)", "%d after %d requests died mid-reserve", a.Drift(), in.Crashes)
	if err := t.dep.(strategy.Restarter).Restart(ctx, 0); err != nil {
		return fmt.Errorf("restart node 0: %w", err)
	}
	back, err := t.audit(ctx)
	if err != nil {
		return err
	}
	t.fact("after restarting node 0", "available %d, active %d, drift %d", back[sku].Available, back[sku].Active, back[sku].Drift())
	held := 0
	for i := 0; i < in.Requests; i++ {
		if op := t.reserveDefinite(ctx, "c", 0, req("after", i)); op.Outcome == strategy.OutcomeHeld {
			held++
		}
	}
	t.check(strategy.SurvivesRestart, "after the restart the audit balances (drift 0)", back[sku].Drift() == 0,
		fmt.Sprintf("available %d, active %d, drift %d after %d requests died", back[sku].Available, back[sku].Active, back[sku].Drift(), in.Crashes))
	if len(back[sku].Nodes) == 0 {
		// One counter for all nodes: what is left of the whole stock.
		want := min(in.Requests, t.cfg.Stock[0].Total-in.Held)
		t.fact("node 0 sells after the restart", "%d (%d left of %d, %d requests)", held, t.cfg.Stock[0].Total-in.Held, t.cfg.Stock[0].Total, in.Requests)
		t.check(strategy.SurvivesRestart, "a restarted node sells exactly what is left of the stock", held == want,
			fmt.Sprintf("node 0 sold %d after the restart, want %d", held, want))
		return nil
	}
	share := t.cfg.Stock[0].Share(t.cfg.NodeCount(), 0)
	t.fact("node 0 sells after the restart", "%d (its share %d, %d sold before)", held, share, in.Held)
	t.check(strategy.SurvivesRestart, "a restarted node sells exactly what is left of its share", held == share-in.Held,
		fmt.Sprintf("node 0 sold %d after the restart; %d of its %d were sold before", held, in.Held, share))
	return nil
}
