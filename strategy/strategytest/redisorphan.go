package strategytest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/reservebench/reservebench/resourcetest"
	"github.com/reservebench/reservebench/strategy"
)

// orphanAcrossWipe: Redis restarts empty while a request whose client gave
// up is still committing; a design that rebuilds its counter from the rows
// must not count that request's unit free. On a deployment of its own,
// through a proxy that loses cancels, a request for the SKU's only unit is
// held at its COMMIT (holdCommitNaming, seen in pg_locks); its client
// gives up (the node answers an error, the backend goes on); Redis is
// killed, wiped and started again; another request for the SKU makes the
// node rebuild its counter. It may wait for the orphan: the COMMIT is let
// go once it has answered, or after besideWithin. Once the orphan's
// backend is done (pg_stat_activity) and three more requests have come,
// the SKU must have at most one active reservation and the audit must
// balance (rediscounter-recover until 2026-12-06: two active for one
// unit; checkRestartBesideOrphan is the same for a node's restart).
func (t *trial) orphanAcrossWipe(ctx context.Context, srv resourcetest.Server) error {
	plain := "orphan-wipe"
	p, pool, closeBoth, err := poolThroughProxy(ctx, t.env.DB, "", 8)
	if err != nil {
		return err
	}
	defer closeBoth()
	sku := t.sku(plain)
	// Two nodes, the orphan node 1's and the recount node 0's (outsider
	// round 54's m18: a recount that waited for node 0's orphans alone).
	dep, err := t.env.Meta.Open(ctx, strategy.Config{DB: pool, Nodes: 2, Stock: []strategy.Stock{{SKU: sku, Total: 1, Shares: []int{0, 1}}}, Resources: t.cfg.Resources})
	if err != nil {
		return fmt.Errorf("open the deployment of %s: %w", plain, err)
	}
	defer dep.Close()
	key := t.key("orphan-wipe-first")
	hold, err := holdCommitNaming(ctx, t.env.Admin, key)
	if errors.Is(err, errNoTables) {
		t.fact("orphan across an empty restart", "not applicable: no tables in PostgreSQL")
		return nil
	} else if err != nil {
		return err
	}
	defer func() { _ = hold.remove() }()
	p.LoseCancels(true) // for good: pgx may send the cancel after Reserve has returned
	reqCtx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	var box panicBox
	first := reserveAsync(reqCtx, &box, dep.Node(1), strategy.Request{Key: key, User: t.user("orphan-wipe-first"), SKU: sku, TTL: strategy.TTLForever})
	pid, err := awaitWaiter(ctx, hold, first, besideWithin)
	if err != nil {
		return fmt.Errorf("the first request held at its COMMIT: %w", err)
	}
	if pid == 0 {
		a := <-first
		box.rethrow()
		t.fact("orphan across an empty restart", "not applicable: the request answered (%s, %v) without being seen at its COMMIT", a.res.Outcome, a.err)
		return nil
	}
	giveUp()
	<-first // an error, or a late answer: the unit's fate is the orphan's
	box.rethrow()
	if err := srv.Kill(ctx); err != nil {
		return err
	}
	if err := srv.Wipe(); err != nil {
		return err
	}
	if err := srv.Restart(ctx); err != nil {
		return err
	}
	after := func(i int) strategy.Request {
		return strategy.Request{Key: t.key(fmt.Sprintf("orphan-wipe-after-%d", i)), User: t.user(fmt.Sprintf("orphan-wipe-after-%d", i)), SKU: sku, TTL: strategy.TTLForever}
	}
	reload := reserveAsync(ctx, &box, dep.Node(0), after(0))
	timer := time.NewTimer(besideWithin) // a bound: only says the rebuild waits for the orphan
	select {
	case r := <-reload:
		reload <- r
	case <-timer.C:
	}
	timer.Stop()
	hold.release()
	answers := []answer{<-reload}
	box.rethrow()
	if err := awaitBackendDone(ctx, t.env.Admin, pid); err != nil {
		return fmt.Errorf("the orphan's backend %d: %w", pid, err)
	}
	for i := 1; i <= 3; i++ {
		res, err := dep.Node(0).Reserve(ctx, after(i))
		answers = append(answers, answer{res: res, err: err})
	}
	orphan, err := dep.Node(0).Lookup(ctx, key)
	if err != nil {
		return err
	}
	held := 0
	for _, x := range answers {
		if x.err == nil && x.res.Outcome == strategy.OutcomeHeld {
			held++
		}
	}
	active := held
	if orphan.Status.Active() {
		active++
	}
	audit, err := soleAudit(ctx, dep, plain)
	if err != nil {
		return err
	}
	// The table keeps these words: nothing in them may vary between runs
	// (the request's error names the trial's key).
	what := "a request whose client gave up (answered an error) committed after Redis restarted empty and the counter was rebuilt"
	t.check(strategy.SurvivesRestart, "orphan across an empty restart: at most one active reservation for one unit", active <= 1 && audit.Active <= 1,
		fmt.Sprintf("%s: %d HELD answers after it, the orphan %s; audit: %d active of %d", what, held, orphan.Status, audit.Active, audit.Total))
	t.check(strategy.SurvivesRestart, "orphan across an empty restart: total - available == active (drift 0)", audit.Drift() == 0,
		fmt.Sprintf("%s: total %d - available %d - active %d = drift %d", what, audit.Total, audit.Available, audit.Active, audit.Drift()))
	return nil
}
