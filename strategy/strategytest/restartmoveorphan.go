package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkRestartBesideMoveOrphan is checkRestartBesideOrphan for a release:
// a node restarted while a Release it gave up on is still committing
// loses no unit. The SKU's only unit is HELD; a Release of it is held at
// its COMMIT (holdCommitNaming: the UPDATE of the row naming the key, seen
// in pg_locks), its client gives up and the cancel is lost (the pool goes
// through a proxy that drops it), so the node answers an error and the
// backend goes on; node 0 restarts; then the COMMIT goes through. A node
// that recounts the log at restart without waiting for the backends of the
// moves whose outcome it does not know counts the row HELD, and when the
// release then commits, nothing gives its unit back (memquota-recover
// until 2026-12-07: its restart waited for the inserts in doubt only, and
// the settling of moves in doubt skips a node restarted since; outsider
// round 38). Restart may wait for the orphan: the hold is let go once
// Restart has returned, or after besideWithin. Then the orphan's backend
// is waited out, the Release sent again (its caller knows nothing) and the
// expiry job run (a strategy may owe the unit until then), and the SKU sold
// to SOLD_OUT: once the release committed, a new user must get the unit.
func checkRestartBesideMoveOrphan(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	if !meta.Claims.Has(strategy.SurvivesRestart) {
		t.Skip("survives-restart is not claimed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, dep, cfg, closeAll := openBehindProxy(ctx, t, meta, db, rs, "restart-move-orphan")
	defer closeAll()
	sku := cfg.Stock[0].SKU
	restarter, ok := dep.(strategy.Restarter)
	if !ok {
		t.Skip("no Restart (strategy.Restarter)")
	}
	if _, ok := dep.Node(0).(strategy.Releaser); !ok {
		t.Skip("no Release (strategy.Releaser)")
	}
	releaser := func() strategy.Releaser { return dep.Node(0).(strategy.Releaser) }
	req := strategy.Request{Key: "kit-move-orphan-" + sku, User: "kit-move-orphan-" + sku, SKU: sku, TTL: time.Hour}
	if res, err := reserveUnlessBusy(ctx, dep.Node(0), req); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("Reserve %q on a SKU of 1 unit: %s, %v; want HELD", req.Key, res.Outcome, err)
	}
	o := orphanAtCommit(ctx, t, p, admin, req.Key, "the Release", func(ctx context.Context) answer {
		_, err := releaser().Release(ctx, req.Key)
		return answer{err: err}
	})
	defer o.hold.removeOrReport(t)
	hold, pid, first := o.hold, o.pid, o.first
	restarted := make(chan error, 1)
	go func() { restarted <- restarter.Restart(ctx, 0) }()
	timer := time.NewTimer(besideWithin) // a bound: only says Restart waits for the orphan
	var rerr error
	waited := false
	select {
	case rerr = <-restarted:
	case <-timer.C:
		waited = true
	}
	timer.Stop()
	hold.release()
	if waited {
		rerr = <-restarted
	}
	if rerr != nil {
		t.Fatalf("node 0 restarted while the Release it gave up on (%v) was held at its COMMIT: %v", first.err, rerr)
	}
	if err := awaitBackendDone(ctx, admin, pid); err != nil {
		t.Fatalf("the orphan's backend %d: %v", pid, err)
	}
	node := dep.Node(0)
	r, err := node.Lookup(ctx, req.Key)
	if err != nil {
		t.Fatalf("Lookup %q: %v", req.Key, err)
	}
	if r.Status.Active() {
		t.Skip(fmt.Sprintf("the Release given up on did not commit (%s): no unit to give back", r.Status))
	}
	// The Release's caller, told nothing, sends it again (it must answer
	// 0 now), and the expiry job runs: a strategy that owes the unit of a
	// move whose give-back did not happen (rediscounter) pays it then.
	if _, err := releaser().Release(ctx, req.Key); err != nil {
		t.Fatalf("Release %q sent again after the restart: %v", req.Key, err)
	}
	if e, ok := node.(strategy.Expirer); ok {
		if _, err := e.ExpireDue(ctx); err != nil {
			t.Fatalf("ExpireDue after the restart: %v", err)
		}
	}
	held := sellAfter(ctx, t, node, sku, "kit-move-orphan", "the restart")
	audit, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	for _, st := range audit {
		if st.SKU == sku && (held != 1 || st.Drift() != 0) {
			t.Errorf("a SKU of 1 unit whose reservation was %s by a Release node 0 gave up on (%v), held at its COMMIT while node 0 restarted (the restart waited for it: %v): %d new users HELD, audit total %d, available %d, active %d; want 1 HELD and drift 0",
				r.Status, first.err, waited, held, st.Total, st.Available, st.Active)
		}
	}
}
