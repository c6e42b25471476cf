package strategytest

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkOrphanReleasedBeforeGone: a request whose client gave up commits
// later, its reservation is released, and only then does its backend go
// away. A node that keeps the unit of a request of unknown outcome in doubt
// until the backend is gone, and then asks the log whether it committed,
// must count a row that committed and was released since as committed:
// the release gave the unit back already. Asking "is its row still
// active?" takes the released row for an insert that never landed and
// gives the unit back a second time (outsider round 38's
// m5mr3settleactiveonly: two reservations of a SKU of one unit).
//
// The request for a SKU's only unit is held at its COMMIT (seen in
// pg_locks); its client gives up, the cancel is lost and so is the close
// (the pool goes through a proxy that keeps the server side of a
// connection its client left: pgproxy.KeepOrphans), so the backend goes on
// and, once the COMMIT is let go, stays idle. Its reservation is released
// through the node (if it is HELD); then the proxy closes the backend's
// connection and the kit waits until it has left pg_stat_activity; then
// new users ask until SOLD_OUT: at most one reservation may be active.
func checkOrphanReleasedBeforeGone(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, dep, cfg, closeAll := openBehindProxy(ctx, t, meta, db, rs, "orphan-released")
	defer closeAll()
	sku := cfg.Stock[0].SKU
	node := dep.Node(0)
	releaser, ok := node.(strategy.Releaser)
	if !ok {
		t.Skip("no Release (strategy.Releaser)")
	}
	req := strategy.Request{Key: "kit-orphan-released-" + sku, User: "kit-orphan-released-" + sku, SKU: sku, TTL: time.Hour}
	p.KeepOrphans(true)
	defer p.EndOrphans()
	o := orphanAtCommit(ctx, t, p, admin, req.Key, "a request", func(ctx context.Context) answer {
		res, err := node.Reserve(ctx, req)
		return answer{res, err}
	})
	defer o.hold.removeOrReport(t)
	hold, pid, first := o.hold, o.pid, o.first
	// The client's connection closes a moment after its answer (pgx
	// closes it once the cancel was sent): the COMMIT is let go only once
	// the proxy keeps that backend's connection.
	// A node whose work outlives its caller (combine's batch, under a
	// deadline of its own) keeps the connection: no orphan.
	leftCtx, leftCancel := context.WithTimeout(ctx, besideWithin)
	defer leftCancel()
	if err := awaitAnswerOr(leftCtx, make(chan answer), func() (bool, error) {
		return slices.Contains(p.Orphans(), uint32(pid)), nil
	}); err != nil {
		// No error text here: it names the key, and a skip's reason goes
		// into table 28-1, which must not change from run to run.
		t.Skip(fmt.Sprintf("the connection of a request given up on was not left by its client within %v: its work outlives its caller, no orphan to make", besideWithin))
	}
	hold.release()
	if err := awaitBackendDone(ctx, admin, pid); err != nil {
		t.Fatalf("the orphan's backend %d: %v", pid, err)
	}
	r, err := node.Lookup(ctx, req.Key)
	if err != nil {
		t.Fatalf("Lookup %q: %v", req.Key, err)
	}
	if r.Status != strategy.StatusHeld {
		t.Skip(fmt.Sprintf("the request given up on is %s once its COMMIT went through: nothing to release", r.Status))
	}
	n, err := releaser.Release(ctx, req.Key)
	if err != nil {
		t.Fatalf("Release %q while its backend is still there: %v", req.Key, err)
	}
	p.EndOrphans()
	if err := awaitBackendGone(ctx, admin, pid); err != nil {
		t.Fatalf("the orphan's backend %d: %v", pid, err)
	}
	held := sellAfter(ctx, t, node, sku, "kit-orphan-released", "the orphan's backend ended")
	if held > 1 {
		audit, _ := dep.Audit(ctx)
		t.Errorf("a SKU of 1 unit: a request given up on (%v) committed, was released (%d units back) while its backend was still there, and the backend then ended: %d new users HELD (audit %v); want at most 1",
			first.err, n, held, audit)
	}
}
