package strategytest

import (
	"context"
	"fmt"

	"github.com/reservebench/reservebench/strategy"
)

// releaseCommandsDropped (redis-restart): on a SKU of its own with one unit,
// a deployment that reaches its Redis through a proxy holds a reservation,
// and the proxy drops every Redis command that names its key (the command
// never runs, its connection closes, a retry meets the same) while the
// holder releases it. Redis keeps everything it had, unlike a stop that
// loses what its persistence does not keep: a design that moved the row
// in PostgreSQL and then failed to give the unit back still owes it, and
// its key is still marked. The release's answer is unknown (an error) or
// its true one; the client sends it again once Redis is reachable, until
// it answers: the resend gives the owed unit back but moved nothing, so it
// says 0 (a design that reports the units it gave back says 1, and the
// audit balances all the same). Then the unit is available once: the audit
// balances, and of two new users one gets it. A strategy that sends Redis
// nothing naming the key while releasing is not applicable.
func (t *trial) releaseCommandsDropped(ctx context.Context) error {
	const what = "release while Redis drops its commands"
	p, err := t.proxiedRelease(ctx, what, "-dropped")
	if p == nil || err != nil {
		return err
	}
	defer p.close()
	dep, sku, node, releaser := p.dep, p.sku, p.node, p.releaser
	key, units, relErr, sent, err := t.releaseDropped(ctx, p, what, "dropped")
	if err != nil {
		return err
	}
	if !sent {
		t.fact(what, "not applicable: the release sent Redis nothing that names the key (%d unit(s), %v)", units, relErr)
		return nil
	}
	first, err := node.Lookup(ctx, key)
	if err != nil {
		return fmt.Errorf("%s: lookup after the release: %w", what, err)
	}
	moved := first.Status == strategy.StatusReleased
	answer := fmt.Sprintf("%d unit(s)", units)
	var wrong string
	switch {
	case relErr == nil && ((units == 1) != moved || units > 1):
		wrong = fmt.Sprintf("the release answered %d unit(s), and the row is %s", units, first.Status)
	case relErr != nil:
		var again int
		var aerr error
		for try := 0; try < resendTries; try++ {
			if again, aerr = releaser.Release(ctx, key); aerr == nil {
				break
			}
		}
		after, err := node.Lookup(ctx, key)
		if err != nil {
			return fmt.Errorf("%s: lookup after the resend: %w", what, err)
		}
		answer = fmt.Sprintf("an error (the row %s), then %d unit(s) sent again", first.Status, again)
		switch {
		case aerr != nil:
			wrong = fmt.Sprintf("sent again %d times once Redis was reachable, still failing: %v", resendTries, aerr)
		case after.Status != strategy.StatusReleased:
			wrong = fmt.Sprintf("sent again it answered %d unit(s), and the row is %s", again, after.Status)
		case moved && again != 0:
			wrong = fmt.Sprintf("sent again it answered %d unit(s), but the release whose Redis commands were dropped had moved the row", again)
		case !moved && again != 1:
			wrong = fmt.Sprintf("sent again it moved the row and answered %d unit(s)", again)
		}
	}
	t.fact(what, "every Redis command naming the key dropped while its holder released it: %s", answer)
	t.check(Base, "a release whose Redis commands are dropped (Redis keeps its data) ends unknown or with its true answer, and sent again once Redis is reachable it moves the row and reports nothing moved when the first had moved it", wrong == "",
		fmt.Sprintf("%s: %s (the first: %d, %v)", t.plain(key), wrong, units, relErr), key)
	a, err := soleAudit(ctx, dep, what)
	if err != nil {
		return err
	}
	t.check(strategy.Conserves, "a release whose Redis commands were dropped, sent again, leaves the unit available once (total - available == active)", a.Drift() == 0,
		fmt.Sprintf("%s: total %d - available %d - active %d = drift %d", t.plain(sku), a.Total, a.Available, a.Active, a.Drift()), key)
	t.twoGetOne(ctx, node, sku, "dropped", "", key)
	return nil
}

// releaseDroppedLeftToJob (redis-restart): releaseCommandsDropped's
// release, on a SKU of its own, but its client gives up on the error and
// never sends it again (a checkout that times out moves on). The row may
// have moved while the unit did not come back; the expiry job is what
// returns a unit owed so, once Redis is reachable: after one run, the unit
// is available (total - available == active). A design that gives an owed
// unit back only when the release is sent again keeps it out for good: a
// Release that did not mark its row's unit owed passed every other check,
// each of which sends the release again (outsider round 32's m12). Not
// applicable without the expiry job, or when the release answers without
// an error (nothing is left owed), or sends Redis nothing naming the key.
func (t *trial) releaseDroppedLeftToJob(ctx context.Context) error {
	const what = "release while Redis drops its commands, left to the expiry job"
	p, err := t.proxiedRelease(ctx, what, "-dropped-job")
	if p == nil || err != nil {
		return err
	}
	defer p.close()
	dep, sku, node := p.dep, p.sku, p.node
	expirer, ok := node.(strategy.Expirer)
	if !ok {
		t.fact(what, "not applicable: needs the expiry job (ExpireDue)")
		return nil
	}
	key, units, relErr, sent, err := t.releaseDropped(ctx, p, what, "dropped-job")
	if err != nil {
		return err
	}
	if !sent {
		t.fact(what, "not applicable: the release sent Redis nothing that names the key")
		return nil
	}
	if relErr == nil {
		t.fact(what, "not applicable: the release answered %d unit(s) while Redis dropped its commands: nothing left owed", units)
		return nil
	}
	first, err := node.Lookup(ctx, key)
	if err != nil {
		return fmt.Errorf("%s: lookup after the release: %w", what, err)
	}
	_, jobErr := expirer.ExpireDue(ctx)
	a, err := soleAudit(ctx, dep, what)
	if err != nil {
		return err
	}
	t.fact(what, "the release answered an error (the row %s) and was not sent again; then the expiry job ran, Redis reachable", first.Status)
	t.check(strategy.Conserves, "a release whose Redis commands were dropped, never sent again, has its unit back once Redis is reachable and the expiry job has run (total - available == active)",
		jobErr == nil && a.Drift() == 0,
		fmt.Sprintf("%s: the release's error left the row %s; the job: %v; then total %d - available %d - active %d = drift %d", t.plain(sku), first.Status, jobErr, a.Total, a.Available, a.Active, a.Drift()), key)
	t.twoGetOne(ctx, node, sku, "dropped-job", "", key)
	return nil
}

// releaseDropped holds a reservation (key req-<name>-0) on p's SKU and
// releases it while p's proxy drops every Redis command naming the key;
// sent says whether the release sent any.
func (t *trial) releaseDropped(ctx context.Context, p *proxiedPart, what, name string) (key string, units int, relErr error, sent bool, err error) {
	key = t.key("req-" + name + "-0")
	res, err := p.node.Reserve(ctx, strategy.Request{Key: key, User: t.user("user-" + name + "-0"), SKU: p.sku, TTL: strategy.TTLForever})
	if err != nil || res.Outcome != strategy.OutcomeHeld {
		return key, 0, nil, false, fmt.Errorf("%s: the reservation to release: %s, %v", what, res.Outcome, err)
	}
	dropped, stop := p.proxy.Drop(key)
	units, relErr = p.releaser.Release(ctx, key)
	stop()
	select {
	case <-dropped:
		sent = true
	default:
	}
	return key, units, relErr, sent, nil
}
