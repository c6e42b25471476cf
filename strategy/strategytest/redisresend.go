package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/reservebench/reservebench/strategy"
)

// resendAfterRelease (redis-restart): on a SKU of its own with one unit, a
// deployment that reaches its Redis through a proxy gets one request twice
// (a client that sent it again). The proxy holds the first copy's first
// Redis command that names the key, so that copy has looked for its key
// and found nothing. Meanwhile the second copy holds the unit and its
// client releases it. Then the held command goes on: the first copy meets
// a key whose reservation has ended. It must answer that reservation
// (REPLAY: the key is known) and keep nothing for it: the audit balances,
// the user, who holds nothing now, gets the unit with a new key, and of
// two new users none gets a second one. A design that marks a key in Redis
// when it takes a unit for it, and reads its insert's conflict on the key
// as "my earlier copy's row holds my unit", keeps a unit out of the
// counter and in no row, and the user marked as a holder, until some
// sweep finds it (outsider round 24 suspected this of rediscounter; no
// scenario had a copy wait between its lookup and its take while the
// other copy's reservation began and ended). A strategy that sends Redis
// nothing naming the key is not applicable.
//
// It runs twice: with the second copy's reservation released, and with it
// made due and expired by the job (outsider round 54's m20, a rediscounter
// whose late copy counted only a RELEASED row as ended, kept the fresh unit
// it took beside an EXPIRED one).
func (t *trial) resendAfterRelease(ctx context.Context) error {
	if err := t.resendAfterEnd(ctx, false); err != nil {
		return err
	}
	return t.resendAfterEnd(ctx, true)
}

// resendAfterEnd is resendAfterRelease with the second copy's reservation
// released, or, byJob, made due and expired by the expiry job.
func (t *trial) resendAfterEnd(ctx context.Context, byJob bool) error {
	what, tag, ends := "a copy held on its way to Redis while the other holds and releases", "resent", "released"
	if byJob {
		what, tag, ends = "a copy held on its way to Redis while the other holds and expires", "resent-expired", "expired by the job"
	}
	p, err := t.proxiedRelease(ctx, what, "-"+tag)
	if p == nil || err != nil {
		return err
	}
	defer p.close()
	dep, proxy, sku, node, releaser := p.dep, p.proxy, p.sku, p.node, p.releaser
	ager, canAge := dep.(strategy.Ager)
	expirer, canExpire := node.(strategy.Expirer)
	if byJob && (!canAge || !canExpire) {
		t.fact(what, "not applicable: needs the expiry job and MakeDue")
		return nil
	}
	end := func(key string) (int, error) {
		if !byJob {
			return releaser.Release(ctx, key)
		}
		if n, err := ager.MakeDue(ctx, []string{key}); err != nil || n != 1 {
			return 0, fmt.Errorf("MakeDue: %d, %w", n, err)
		}
		return expirer.ExpireDue(ctx)
	}
	key, user := t.key("req-"+tag+"-0"), t.user("user-"+tag+"-0")
	req := strategy.Request{Key: key, User: user, SKU: sku, TTL: strategy.TTLForever}
	held, letGo := proxy.Hold(key)
	defer letGo()
	firstDone := make(chan answer, 1)
	go func() {
		res, err := node.Reserve(ctx, req)
		firstDone <- answer{res, err}
	}()
	select {
	case <-held:
	case a := <-firstDone:
		t.fact(what, "not applicable: the request sent Redis nothing that names its key (%s, %v)", a.res.Outcome, a.err)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	// The second copy runs while the first's command is held. A design
	// whose second copy waits for the first (a lock of the key outside the
	// proxy's view) is given a bound, then the first is let go: the case
	// this part is about cannot happen there.
	secondDone := make(chan answer, 1)
	go func() {
		res, err := node.Reserve(ctx, req)
		secondDone <- answer{res, err}
	}()
	var second answer
	select {
	case second = <-secondDone:
	case <-time.After(10 * time.Second):
		letGo()
		<-firstDone
		<-secondDone
		t.fact(what, "not applicable: the second copy waited for the first, held on its way to Redis")
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	if second.err != nil || second.res.Outcome != strategy.OutcomeHeld {
		letGo()
		<-firstDone
		return fmt.Errorf("%s: the second copy, with the first held on its way to Redis and the SKU's one unit free: %s, %v; want HELD", what, second.res.Outcome, second.err)
	}
	units, relErr := end(key)
	if relErr != nil && (byJob || !releaseAnswered(ctx, releaser, key)) {
		letGo()
		<-firstDone
		return fmt.Errorf("%s: the second copy's hold, %s, got no answer: %v", what, ends, relErr)
	}
	letGo()
	first := <-firstDone
	answered := fmt.Sprintf("%s, %v", first.res.Outcome, first.err)
	if first.err != nil {
		// Unknown: the client sends it again until it is answered, and the
		// expiry job runs once, as its next tick would, for whatever the
		// failed copy left to sweep.
		again, err := reserveUntilAnswered(ctx, node, req)
		if err != nil {
			return fmt.Errorf("%s: the held copy failed (%v) and sent again: %w", what, first.err, err)
		}
		first.res = again
		answered = fmt.Sprintf("an error (%v), then %s sent again", first.err, again.Outcome)
		if e, ok := node.(strategy.Expirer); ok {
			if _, err := e.ExpireDue(ctx); err != nil {
				return fmt.Errorf("%s: the expiry job after the failed copy: %w", what, err)
			}
		}
	}
	t.fact(what, "the first copy's Redis command naming its key held while the second held the unit and was %s (%d unit(s), %v), then let go: %s", ends, units, relErr, answered)
	t.check(Base, "a copy of a request that found its key unknown, then meets its key's reservation held and ended (released, or expired by the job) by another copy, answers that reservation (REPLAY, a known key first)",
		first.res.Outcome == strategy.OutcomeReplay && first.res.Reservation.Key == key,
		fmt.Sprintf("%s: %s about key %q (status %s); want REPLAY of its own reservation, %s", t.plain(key), answered, first.res.Reservation.Key, first.res.Reservation.Status, ends), key)
	a, err := soleAudit(ctx, dep, what)
	if err != nil {
		return err
	}
	t.check(strategy.Conserves, "a copy that meets its key's reservation ended by another copy keeps no unit for it (total - available == active)", a.Drift() == 0,
		fmt.Sprintf("%s: total %d - available %d - active %d = drift %d (the copy: %s)", t.plain(sku), a.Total, a.Available, a.Active, a.Drift(), answered), key)
	again := strategy.Request{Key: t.key("req-" + tag + "-again"), User: user, SKU: sku, TTL: strategy.TTLForever}
	res, err := reserveUnlessBusy(ctx, node, again)
	t.check(Base, "then the user, whose only reservation of the SKU ended, gets its free unit with a new key",
		err == nil && (res.Outcome == strategy.OutcomeHeld || res.Outcome == strategy.OutcomeBusy),
		fmt.Sprintf("%s: %s, %v; want HELD (the SKU's one unit is free and the user holds nothing)", t.plain(again.Key), res.Outcome, err), key, again.Key)
	t.twoGetOne(ctx, node, sku, tag, "", key, again.Key)
	return nil
}
