package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/pgtest/pgproxy"
	"github.com/reservebench/reservebench/strategy"
)

// checkRestartBesideOrphan: a node restarted while a request it gave up on
// is still committing oversells nothing. The request for a SKU's only unit
// is held at its COMMIT (holdCommitNaming, seen in pg_locks); its client
// gives up and the cancel is lost on the way (the deployment's pool goes
// through a proxy that drops it), so the node answers an error and its
// backend goes on; the node restarts (node 1 of two: orphanNode); then the
// COMMIT goes through. A node that recounts the log at restart without
// waiting for the backends of the requests whose outcome it does not know
// counts the unit free, and sells
// it again once the orphan has committed (memquota-recover until
// 2026-12-06: two active reservations for one unit). Restart may wait for
// the orphan: the hold is let go once Restart has returned, or after
// besideWithin, whichever comes first; the orphan's backend is then waited
// out (pg_stat_activity), and the SKU sold to SOLD_OUT.
func checkRestartBesideOrphan(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	checkBesideOrphan(t, meta, db, admin, rs, "restart-orphan", orphanSuccessor{
		what: "node 1 restarted",
		skip: func(dep strategy.Deployment) string {
			if _, ok := dep.(strategy.Restarter); !ok {
				return "no Restart (strategy.Restarter)"
			}
			return ""
		},
		start: func(ctx context.Context, dep strategy.Deployment, _ strategy.Config) (strategy.Deployment, error) {
			return dep, dep.(strategy.Restarter).Restart(ctx, orphanNode)
		},
	})
}

// checkAttachBesideOrphan: checkRestartBesideOrphan with the node's process
// dead instead of restarted: the request given up on is held at its
// COMMIT, the process that sent it is left for dead (never called again,
// as after a SIGKILL: its backend goes on), and a successor attaches to the
// stock (Meta.Attach, over a pool of its own); then the COMMIT goes
// through, and the SKU is sold to SOLD_OUT through the successor. A
// successor that recounts the log at once, without waiting for the
// requests its predecessor left in flight, counts the unit free and sells
// it again (memquota-recover until 2026-12-06: its restart waited for the
// node's own orphans, its Attach for nobody's). Attach may wait for the
// orphan, as Restart may.
func checkAttachBesideOrphan(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	checkBesideOrphan(t, meta, db, admin, rs, "attach-orphan", orphanSuccessor{
		what: "a successor of the process attached",
		skip: func(strategy.Deployment) string {
			if meta.Attach == nil {
				return "no Meta.Attach"
			}
			return ""
		},
		start: func(ctx context.Context, _ strategy.Deployment, cfg strategy.Config) (strategy.Deployment, error) {
			cfg.DB = db
			return meta.Attach(ctx, cfg)
		},
		opens: true,
	})
}

// orphanNode is the node whose request checkBesideOrphan leaves at its
// COMMIT, and the one restarted: node 1 of two, which holds the SKU's one
// unit, so that a strategy that waits for node 0's requests in flight
// whichever node restarts, or recounts, is seen (outsider round 54's m32 and
// m18, rediscounter-recover: every orphan the kit made was node 0's).
const orphanNode = 1

// openBehindProxyOnNode1 is openBehindProxy with two nodes, node 1 holding
// the SKU's unit where a strategy splits the stock (Stock.Shares).
func openBehindProxyOnNode1(ctx context.Context, t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string, name string) (p *pgproxy.Proxy, dep strategy.Deployment, cfg strategy.Config, closeAll func()) {
	t.Helper()
	p, pool, closeBoth, err := poolThroughProxy(ctx, db, "", 8)
	if err != nil {
		t.Fatalf("%v", err)
	}
	cfg = strategy.Config{Resources: rs, DB: pool, Nodes: 2, Stock: []strategy.Stock{{SKU: kitSKU(name), Total: 1, Shares: []int{0, 1}}}}
	dep, err = meta.Open(ctx, cfg)
	if err != nil {
		closeBoth()
		t.Fatalf("Open: %v", err)
	}
	return p, dep, cfg, func() { dep.Close(); closeBoth() }
}

// orphanSuccessor is what starts while checkBesideOrphan's orphan waits at
// its COMMIT: the deployment that sells the SKU afterwards.
type orphanSuccessor struct {
	what  string                               // for the verdicts
	skip  func(dep strategy.Deployment) string // why the check cannot run, or ""
	start func(ctx context.Context, dep strategy.Deployment, cfg strategy.Config) (strategy.Deployment, error)
	// opens says start returns a deployment of its own, for the check to
	// close: told, not found by comparing the two, since a Deployment may
	// be a value of a type == cannot compare (a struct with a func or a
	// slice in it), and comparing panics.
	opens bool
}

// checkBesideOrphan is checkRestartBesideOrphan and checkAttachBesideOrphan:
// next starts while the request given up on is held at its COMMIT, and
// sells the SKU once the COMMIT has gone through.
func checkBesideOrphan(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string, name string, next orphanSuccessor) {
	t.Helper()
	if !meta.Claims.Has(strategy.SurvivesRestart) {
		t.Skip("survives-restart is not claimed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, dep, cfg, closeAll := openBehindProxyOnNode1(ctx, t, meta, db, rs, name)
	defer closeAll()
	sku := cfg.Stock[0].SKU
	if why := next.skip(dep); why != "" {
		t.Skip(why)
	}
	req := strategy.Request{Key: "kit-orphan-" + sku, User: "kit-orphan-" + sku, SKU: sku, TTL: time.Hour}
	o := orphanAtCommit(ctx, t, p, admin, req.Key, "a request", func(ctx context.Context) answer {
		res, err := dep.Node(orphanNode).Reserve(ctx, req)
		return answer{res, err}
	})
	defer o.hold.removeOrReport(t)
	hold, pid, first := o.hold, o.pid, o.first
	// Cancels stay lost: pgx sends the one for the request given up on in
	// the background, maybe after Reserve has returned.
	type started struct {
		dep strategy.Deployment
		err error
	}
	startDone := make(chan started, 1)
	go func() {
		d, err := next.start(ctx, dep, cfg)
		startDone <- started{d, err}
	}()
	timer := time.NewTimer(besideWithin) // a bound: only says the successor waits for the orphan
	var after started
	waited := false
	select {
	case after = <-startDone:
	case <-timer.C:
		waited = true
	}
	timer.Stop()
	hold.release()
	if waited {
		after = <-startDone
	}
	if after.err != nil {
		t.Fatalf("%s while the request it gave up on (%v) was held at its COMMIT: %v", next.what, first.err, after.err)
	}
	if next.opens {
		defer after.dep.Close()
	}
	if err := awaitBackendDone(ctx, admin, pid); err != nil {
		t.Fatalf("the orphan's backend %d: %v", pid, err)
	}
	node := after.dep.Node(orphanNode)
	orphan, err := node.Lookup(ctx, req.Key)
	if err != nil {
		t.Fatalf("Lookup %q: %v", req.Key, err)
	}
	sold := 0
	if orphan.Status.Active() {
		sold++
	}
	sold += sellAfter(ctx, t, node, sku, "kit-orphan", next.what)
	if sold > 1 {
		t.Errorf("a SKU of 1 unit: %d reservations active after %s while the request node 1 gave up on (answered %v) was held at its COMMIT, which then went through (%s; it waited for the COMMIT: %v); want at most 1",
			sold, next.what, first.err, orphan.Status, waited)
	}
	audit, err := after.dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	for _, st := range audit {
		if st.SKU == sku && (st.Active > st.Total || st.Drift() != 0) {
			t.Errorf("audit after the orphan committed beside %s: total %d, available %d, active %d; want drift 0 and no more active than the total", next.what, st.Total, st.Available, st.Active)
		}
	}
}

// awaitBackendDone waits until backend pid is gone or idle: its
// transaction has ended.
func awaitBackendDone(ctx context.Context, admin *pgxpool.Pool, pid int32) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var busy bool
		if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND state IS DISTINCT FROM 'idle')`, pid).Scan(&busy); err != nil {
			return err
		}
		if !busy {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("still in a transaction: %w", ctx.Err())
		case <-tick.C:
		}
	}
}
