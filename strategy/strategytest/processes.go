package strategytest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/reservebench/reservebench/strategy"
)

// The node-process kinds: real processes killed with SIGKILL and started
// again (nodeprocs.go).
const (
	KindProcessRestart = "process-restart" // C28-15 with real processes
	KindProcessRelease = "process-release" // a unit released by another process; requests that die mid-reserve
)

func init() {
	registerKind(KindProcessRestart, kindSpec{
		run:      runProcessRestart,
		req:      requirement{caps: strategy.Capabilities{Attach: true}, helper: true},
		required: []string{"workers"},
		validate: func(in *Scenario) error {
			if in.Nodes < 2 || len(in.Stock) != 1 || in.Workers < 1 || in.Workers > in.Stock[0].Total/in.Nodes {
				return errors.New("need 2 nodes or more, one SKU, and 1 <= workers <= node 0's share")
			}
			return nil
		},
	})
	registerKind(KindProcessRelease, kindSpec{
		run:      runProcessRelease,
		req:      requirement{caps: strategy.Capabilities{Attach: true, Release: true, CrashMidReserve: true}, helper: true},
		required: []string{"held", "release", "crashes"},
		validate: func(in *Scenario) error {
			if in.Nodes < 2 || len(in.Stock) != 1 || in.Release < 1 || in.Release > in.Held || in.Crashes < 1 ||
				in.Held+in.Crashes > in.Stock[0].Total/in.Nodes {
				return errors.New("need 2 nodes or more, one SKU, 1 <= release <= held, crashes >= 1, held + crashes <= node 0's share")
			}
			return nil
		},
	})
}

// runProcessRestart is C28-15 with node processes: every node but node 0
// sells its share; node 0 sells its share less `workers`, then `workers`
// more requests reach it while the harness holds a lock on the strategy's
// tables, and node 0's process is SIGKILLed once the server shows them all
// queued; the lock is released, node 0's process is started again
// (Meta.Attach: from config or from the log, as the strategy restarts), the
// requests that were in flight are resolved and sent again with their
// keys, and node 0 is sent its share once more. A strategy that restarts
// from its configured share sells it again: more active reservations than
// stock.
func runProcessRestart(ctx context.Context, t *trial) error {
	in := t.in
	np, err := t.startNodeProcs(ctx)
	if err != nil {
		return err
	}
	n := t.cfg.NodeCount()
	share0 := t.cfg.Stock[0].Share(n, 0)
	sku := t.sku(in.Stock[0].SKU)
	req := func(prefix string, i int) strategy.Request {
		return strategy.Request{Key: t.key(fmt.Sprintf("%s-%03d", prefix, i)), User: t.user(fmt.Sprintf("user-%s-%03d", prefix, i)), SKU: sku, TTL: strategy.TTLForever}
	}
	var jobs []job
	for node := 0; node < n; node++ {
		count := t.cfg.Stock[0].Share(n, node)
		if node == 0 {
			count -= in.Workers
		}
		for i := 0; i < count; i++ {
			jobs = append(jobs, job{node: node, req: req(fmt.Sprintf("n%d", node), i)})
		}
	}
	ops := make([]Op, len(jobs))
	Together(len(jobs), func(i int) { ops[i] = t.reserveDefinite(ctx, fmt.Sprintf("c%d", i), jobs[i].node, jobs[i].req) })
	for _, op := range ops {
		if op.Outcome != strategy.OutcomeHeld {
			return fmt.Errorf("setup: %s on node %d answered %s %s", t.plain(op.Req.Key), op.Node, op.Outcome, op.Err)
		}
	}

	// Node 0, under load, is killed.
	release, err := holdTables(ctx, t.env.Admin, "ACCESS EXCLUSIVE")
	if err != nil {
		return err
	}
	var finished atomic.Int64
	inFlight := make([]Op, in.Workers)
	var wg sync.WaitGroup
	var box panicBox
	defer box.rethrow()
	wg.Add(in.Workers)
	for i := range inFlight {
		go func() {
			defer wg.Done()
			defer finished.Add(1)
			defer box.catch()
			inFlight[i] = t.reserve(ctx, fmt.Sprintf("q%d", i), 0, req("inflight", i))
		}()
	}
	// A strategy that batches shows one backend per batch: the requests
	// behind it wait in node 0's memory, in flight all the same
	// (waitActivity, queueSettle).
	if _, err := waitActivity(ctx, t.env.Admin, "requests of node 0 queued on the harness's lock", `wait_event_type = 'Lock'`, in.Workers, &finished); err != nil {
		release()
		return err
	}
	killed := np.proc(0).Kill()
	wg.Wait()
	release()
	if err := np.waitGone(ctx, 0); err != nil {
		return err
	}
	t.restarted = true
	unknown := 0
	for _, op := range inFlight {
		if op.Type == OpInfo {
			unknown++
		}
	}
	t.fact("node 0's process", "sold %d, then SIGKILLed (died of the signal: %v) with %d requests in flight, queued on a lock: %d unknown",
		share0-in.Workers, killed, in.Workers, unknown)
	if err := np.start(ctx, 0); err != nil {
		return err
	}
	if err := t.resolveByRetry(ctx, "in flight at the kill", inFlight, nil); err != nil {
		return err
	}

	// Node 0's process, started again, is sent its share once more.
	again := make([]Op, share0)
	Together(share0, func(i int) { again[i] = t.reserveDefinite(ctx, fmt.Sprintf("a%d", i), 0, req("again", i)) })
	held := 0
	for _, op := range again {
		if op.Outcome == strategy.OutcomeHeld {
			held++
		}
	}
	a, err := t.audit(ctx)
	if err != nil {
		return err
	}
	sa := a[sku]
	t.fact("node 0's process started again (Meta.Attach)", "sold %d of %d more requests", held, share0)
	t.fact("end", "%d active for %d units, drift %d", sa.Active, sa.Total, sa.Drift())
	t.check(strategy.SurvivesRestart, "a node process started again oversells nothing", sa.Oversold() == 0 && sa.Drift() == 0,
		fmt.Sprintf("%d active for %d units, drift %d", sa.Active, sa.Total, sa.Drift()))
	return nil
}

// runProcessRelease: node 0's process sells `held`; node 1's process
// releases `release` of them (a strategy that counts in memory gives the
// units back to its own copy of node 0's counter, which node 0's process
// never sees); `crashes` requests die on node 0's process between its
// memory and the database (strategy.ReserveCrasher, inside that process);
// then node 0's process is SIGKILLed, started again, and sent its share
// once more. It must sell exactly what is left of its share.
func runProcessRelease(ctx context.Context, t *trial) error {
	in := t.in
	np, err := t.startNodeProcs(ctx)
	if err != nil {
		return err
	}
	t.restarted = true // what the audit finds from here on is the restart's to answer for (as in node-death)
	n := t.cfg.NodeCount()
	share0 := t.cfg.Stock[0].Share(n, 0)
	sku := t.sku(in.Stock[0].SKU)
	req := func(prefix string, i int) strategy.Request {
		return strategy.Request{Key: t.key(fmt.Sprintf("%s-%03d", prefix, i)), User: t.user(fmt.Sprintf("user-%s-%03d", prefix, i)), SKU: sku, TTL: strategy.TTLForever}
	}
	var keys []string
	for i := 0; i < in.Held; i++ {
		op := t.reserveDefinite(ctx, "c", 0, req("sold", i))
		if op.Outcome != strategy.OutcomeHeld {
			return fmt.Errorf("setup: %s answered %s %s", t.plain(op.Req.Key), op.Outcome, op.Err)
		}
		keys = append(keys, op.Req.Key)
	}
	back := 0
	for _, k := range keys[:in.Release] {
		units, err := t.dep.Node(1).(strategy.Releaser).Release(ctx, k)
		if err != nil {
			return fmt.Errorf("release %s on node 1: %w", t.plain(k), err)
		}
		back += units
	}
	for i := 0; i < in.Crashes; i++ {
		r := req("dies", i)
		op := Op{Process: "dying", Node: 0, Req: r, Invoke: t.hist.Begin()}
		err := np.call(ctx, 0, "crash", r, nil)
		op = reserveOp(op, strategy.Result{}, err)
		if err == nil {
			op.Type, op.Err = OpInfo, "the request did not die"
		}
		t.hist.End(op)
	}
	a, err := t.audit(ctx)
	if err != nil {
		return err
	}
	before := a[sku]
	t.fact("node 0's process sold", "%d; node 1's process released %d of them (%d units back by its count)", in.Held, in.Release, back)
	t.fact("then", "%d requests died on node 0's process between its memory and the database", in.Crashes)
	t.fact("audit before node 0's process restarts", "available %d, active %d, drift %d", before.Available, before.Active, before.Drift())

	killed, err := np.kill(ctx, 0)
	if err != nil {
		return err
	}
	if err := np.start(ctx, 0); err != nil {
		return err
	}
	a, err = t.audit(ctx)
	if err != nil {
		return err
	}
	after := a[sku]
	t.fact("node 0's process SIGKILLed and started again", "killed by SIGKILL: %v; available %d, active %d, drift %d", killed, after.Available, after.Active, after.Drift())
	active0 := 0
	for _, na := range after.Nodes {
		if na.Node == 0 {
			active0 = na.Active
		}
	}
	held := 0
	for i := 0; i < share0; i++ {
		if op := t.reserveDefinite(ctx, "c", 0, req("after", i)); op.Outcome == strategy.OutcomeHeld {
			held++
		}
	}
	t.fact("node 0 sells after its process restarted", "%d (its share %d, %d active before)", held, share0, active0)
	t.check(strategy.SurvivesRestart, "a node process started again sells exactly what is left of its share", held == share0-active0,
		fmt.Sprintf("node 0 sold %d; its share is %d, %d were active", held, share0, active0))
	return nil
}
