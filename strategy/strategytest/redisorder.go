package strategytest

import (
	"context"
	"fmt"
	"maps"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest/internal/redisproxy"
)

// releaseWhileJobGivesBack (redis-restart): on a SKU of its own with one
// unit, a deployment that reaches its Redis through a proxy holds a
// reservation made due. The expiry job runs, and the proxy holds the job's
// first Redis command that names the reservation's key: its give-back,
// sent after its UPDATE committed. While it is held, the reservation's
// client releases it (a cart abandoned as the job ran): the release finds
// the row moved and gives back whatever unit is still owed. Then the job's
// command goes on. The unit must come back once: the audit balances, and
// two new users get one unit between them. A job that gives back a count
// per SKU, whatever the keys' markers say, gives it twice (a release that
// came after the job's give-back found nothing owed; the Redis stall, whose
// held commands Redis runs in an order of its own, could not put the
// release first). A strategy whose job sends Redis nothing that names the
// key is not applicable.
func (t *trial) releaseWhileJobGivesBack(ctx context.Context) error {
	p, err := t.proxiedRelease(ctx, "release while the expiry job gives back", "-order")
	if p == nil || err != nil {
		return err
	}
	defer p.close()
	dep, proxy, sku, node, releaser := p.dep, p.proxy, p.sku, p.node, p.releaser
	expirer, canExpire := node.(strategy.Expirer)
	ager, ages := dep.(strategy.Ager)
	if !canExpire || !ages {
		t.fact("release while the expiry job gives back", "not applicable: needs Release, ExpireDue and MakeDue")
		return nil
	}
	key := t.key("req-order-0")
	res, err := node.Reserve(ctx, strategy.Request{Key: key, User: t.user("user-order-0"), SKU: sku, TTL: strategy.TTLForever})
	if err != nil || res.Outcome != strategy.OutcomeHeld {
		return fmt.Errorf("job order: the reservation to expire: %s, %v", res.Outcome, err)
	}
	if n, err := ager.MakeDue(ctx, []string{key}); err != nil || n != 1 {
		return fmt.Errorf("job order: make due: %d rows, %v", n, err)
	}
	held, letGo := proxy.Hold(key)
	defer letGo()
	type result struct {
		n   int
		err error
	}
	jobDone := make(chan result, 1)
	go func() {
		n, err := expirer.ExpireDue(ctx)
		jobDone <- result{n, err}
	}()
	var job result
	select {
	case <-held:
	case job = <-jobDone:
		t.fact("release while the expiry job gives back", "not applicable: the expiry job sent Redis nothing that names the key (moved %d, %v)", job.n, job.err)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	units, relErr := releaser.Release(ctx, key)
	letGo()
	job = <-jobDone
	t.fact("release while the expiry job gives back", "a hold made due; the expiry job's Redis command about it held by a proxy while its client released it, then let go")
	t.vary("job order: the release's answer (units)", units)
	t.vary("job order: the release failed", map[bool]int{true: 1, false: 0}[relErr != nil])
	t.vary("job order: the job failed (its held command met its client's timeout)", map[bool]int{true: 1, false: 0}[job.err != nil])
	if relErr != nil {
		if !releaseAnswered(ctx, releaser, key) {
			return fmt.Errorf("job order: the release got no answer when sent again: %v", relErr)
		}
	}
	if job.err != nil {
		// Its next run, as a job's next tick would: what the failed run
		// still owed comes back now.
		if _, err := expirer.ExpireDue(ctx); err != nil {
			return fmt.Errorf("job order: the expiry job's next run: %w", err)
		}
	}
	a, err := soleAudit(ctx, dep, "job order")
	if err != nil {
		return err
	}
	t.check(strategy.Conserves, "job order: a release sent while the expiry job's give-back of the same hold is on its way to Redis leaves the unit available once (total - available == active)", a.Drift() == 0,
		fmt.Sprintf("%s: total %d - available %d - active %d = drift %d (the release gave back %d, %v; the job: %d, %v)", t.plain(sku), a.Total, a.Available, a.Active, a.Drift(), units, relErr, job.n, job.err), key)
	t.twoGetOne(ctx, node, sku, "order", "job order: ", key)
	return nil
}

// proxiedPart is what proxiedRelease opens for a part of redis-restart: a
// deployment that reaches the trial's Redis through a redisproxy, on a SKU
// of its own (the first stock's name and suffix) with one unit, and its
// node 0, which can Release.
type proxiedPart struct {
	dep      strategy.Deployment
	proxy    *redisproxy.Proxy
	sku      string
	node     strategy.Strategy
	releaser strategy.Releaser
}

// close closes the deployment, then the proxy.
func (p *proxiedPart) close() {
	p.dep.Close()
	_ = p.proxy.Close()
}

// proxiedRelease opens a proxiedPart for the part named what. It opens
// nothing and returns nil for a strategy without Redis, and for one
// without Release, noting that the part is not applicable.
func (t *trial) proxiedRelease(ctx context.Context, what, suffix string) (*proxiedPart, error) {
	if _, usesRedis := t.cfg.Resources[strategy.Redis]; !usesRedis {
		return nil, nil
	}
	proxy, err := redisproxy.Start(t.cfg.Resources[strategy.Redis])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	rs := maps.Clone(t.cfg.Resources)
	rs[strategy.Redis] = proxy.URL()
	sku := t.sku(t.in.Stock[0].SKU + suffix)
	dep, err := t.env.Meta.Open(ctx, strategy.Config{DB: t.env.DB, Stock: []strategy.Stock{{SKU: sku, Total: 1}}, Resources: rs})
	if err != nil {
		_ = proxy.Close()
		return nil, fmt.Errorf("%s: open the deployment of %s: %w", what, t.plain(sku), err)
	}
	p := &proxiedPart{dep: dep, proxy: proxy, sku: sku, node: dep.Node(0)}
	var canRelease bool
	if p.releaser, canRelease = p.node.(strategy.Releaser); !canRelease {
		p.close()
		t.fact(what, "not applicable: needs Release")
		return nil, nil
	}
	return p, nil
}

// twoGetOne checks that two new users (keys req-<name>-1 and -2) get the
// SKU's one unit between them, not one each.
func (t *trial) twoGetOne(ctx context.Context, node strategy.Strategy, sku, name, label string, keys ...string) {
	held := 0
	for i := 1; i <= 2; i++ {
		r, err := node.Reserve(ctx, strategy.Request{Key: t.key(fmt.Sprintf("req-%s-%d", name, i)), User: t.user(fmt.Sprintf("user-%s-%d", name, i)), SKU: sku, TTL: strategy.TTLForever})
		if err == nil && r.Outcome == strategy.OutcomeHeld {
			held++
		}
	}
	t.check(strategy.NoOversell, label+"then two new users get the SKU's one unit between them, not one each", held <= 1,
		fmt.Sprintf("%s: %d of 2 HELD for 1 unit", t.plain(sku), held), keys...)
}
