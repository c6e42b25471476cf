package strategytest

import (
	"context"
	"fmt"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest/internal/pgcontrol"
)

func (t *trial) killPoint() string { return t.in.KillPoints[(t.n-1)%len(t.in.KillPoints)] }

// runKillRelease is C28-09: a separate process runs the expiry job inside a
// transaction and is killed with SIGKILL before it commits. Nothing may come
// back before recovery; rerunning the job returns the units exactly once.
func runKillRelease(ctx context.Context, t *trial) error {
	in, kp := t.in, t.killPoint()
	keys, err := t.holdMany(ctx, in.Held)
	if err != nil {
		return err
	}
	due := keys[:in.FirstDue]
	if err := t.makeDue(ctx, due); err != nil {
		return err
	}
	before, err := t.audit(ctx)
	if err != nil {
		return err
	}
	h, err := t.spawnHelper(ctx, helperArgs{Action: "expire", KillPoint: kp})
	if isUnsupported(err) {
		return notApplicable(err.Error())
	}
	if err != nil {
		return err
	}
	during, err := t.audit(ctx)
	if err != nil {
		_, _ = h.Kill()
		return err
	}
	killed, err := h.Kill()
	if err != nil {
		return err
	}
	if err := pgcontrol.WaitBackendsGone(ctx, t.env.Admin, h.appName); err != nil {
		return err
	}
	after, err := t.audit(ctx)
	if err != nil {
		return err
	}
	count, _, err := t.statuses(ctx, due)
	if err != nil {
		return err
	}
	label := "kill point " + kp
	t.fact(label+": helper", "%s; killed by SIGKILL: %v", h.Stage, killed)
	backDuring, backAfterKill := sumAvailable(during)-sumAvailable(before), sumAvailable(after)-sumAvailable(before)
	t.fact(label+": units back while the helper held its transaction open", "%d", backDuring)
	t.fact(label+": units back after the kill, before the rerun", "%d", backAfterKill)
	t.check(strategy.ReturnOnce, "an uncommitted release gives nothing back", backDuring == 0,
		fmt.Sprintf("the stock rose by %d while the release was uncommitted", backDuring))
	t.check(strategy.ReturnOnce, "a release killed before commit gives nothing back", backAfterKill == 0 && count[strategy.StatusHeld] == len(due),
		fmt.Sprintf("after the kill: stock rose by %d, statuses %v", backAfterKill, count))

	for i, want := range []int{len(due), 0} {
		name := "rerun"
		if i == 1 {
			name = "second rerun"
		}
		var reported, failed int
		back, err := t.returned(ctx, func() { reported, failed = t.expireUntilDone(ctx, name, i) })
		if err != nil {
			return err
		}
		t.fact(label+": "+name, "%d units back", back)
		t.check(strategy.ReturnOnce, name+" after the kill returns each due unit once", back == want && reported == back,
			fmt.Sprintf("want %d back, the stock rose by %d, the job reported %d", want, back, reported))
		t.check(strategy.ReturnOnce, "the expiry job fails only by a conflict abort when no fault is injected", failed == 0,
			fmt.Sprintf("%s: %d runs failed", name, failed))
	}
	return t.thenRequests(ctx)
}

// runKillReserve: a process holding uncommitted reservations (in one
// transaction) is killed; none
// of them may survive, and the units are available again once its backends
// are gone.
func runKillReserve(ctx context.Context, t *trial) error {
	in, kp := t.in, t.killPoint()
	sku := t.sku(in.Stock[0].SKU)
	var reqs []strategy.Request
	var keys []string
	for i := 0; i < in.Held; i++ {
		r := strategy.Request{Key: t.key(fmt.Sprintf("req-dead-%02d", i)), User: t.user(fmt.Sprintf("user-dead-%02d", i)), SKU: sku, TTL: strategy.TTLForever}
		reqs, keys = append(reqs, r), append(keys, r.Key)
	}
	before, err := t.audit(ctx)
	if err != nil {
		return err
	}
	h, err := t.spawnHelper(ctx, helperArgs{Action: "reserve", KillPoint: kp, Requests: reqs})
	if isUnsupported(err) {
		return notApplicable(err.Error())
	}
	if err != nil {
		return err
	}
	visible, err := t.lookupAll(ctx, keys)
	if err != nil {
		_, _ = h.Kill()
		return err
	}
	killed, err := h.Kill()
	if err != nil {
		return err
	}
	if err := pgcontrol.WaitBackendsGone(ctx, t.env.Admin, h.appName); err != nil {
		return err
	}
	survived, err := t.lookupAll(ctx, keys)
	if err != nil {
		return err
	}
	if t.caps.Lock {
		// The killed process held the SKU's lock outside PostgreSQL, and
		// nothing releases it but its lease: until it runs out, every
		// request for the SKU waits for it and answers BUSY at its wait
		// bound. The harness fast-forwards the lease, as Ager.MakeDue
		// fast-forwards expires_at, instead of waiting it out.
		left, err := t.expireLock(ctx, sku)
		if err != nil {
			return err
		}
		t.vary("kill point "+kp+": ms of lease the killed holder's lock had left", int(left.Milliseconds()))
		if left > 0 {
			t.fact("kill point "+kp+": the killed holder's lock", "left behind: the SKU answers BUSY until its lease runs out (fast-forwarded here)")
		} else {
			t.fact("kill point "+kp+": the killed holder's lock", "none held")
		}
	}
	after, err := t.audit(ctx)
	if err != nil {
		return err
	}
	count := func(m map[string]strategy.Reservation) int {
		n := 0
		for _, r := range m {
			if r.Status != strategy.StatusNotFound {
				n++
			}
		}
		return n
	}
	label := "kill point " + kp
	t.fact(label+": helper", "%s; killed by SIGKILL: %v", h.Stage, killed)
	t.fact(label+": reservations visible while held, after the kill", "%d, %d", count(visible), count(survived))
	t.check(Base, "an uncommitted reservation is invisible to others", count(visible) == 0,
		fmt.Sprintf("%d of the helper's uncommitted reservations were visible", count(visible)))
	t.check(Base, "no reservation of a killed process survives", count(survived) == 0,
		fmt.Sprintf("%d of the killed helper's reservations exist", count(survived)))
	t.check(strategy.Conserves, "the units are available again once its backends are gone", sumAvailable(after) == sumAvailable(before),
		fmt.Sprintf("available %d before, %d after", sumAvailable(before), sumAvailable(after)))

	// The units can be sold again, to someone else.
	sold := 0
	for i := range reqs {
		op := t.reserveDefinite(ctx, "c", i, strategy.Request{Key: t.key(fmt.Sprintf("req-after-%02d", i)), User: t.user(fmt.Sprintf("user-after-%02d", i)), SKU: sku, TTL: strategy.TTLForever})
		if op.Outcome == strategy.OutcomeHeld {
			sold++
		}
	}
	t.fact(label+": sold again afterwards", "%d of %d", sold, len(reqs))
	t.check(Base, "the killed process's units can be sold again", sold == len(reqs), fmt.Sprintf("%d of %d", sold, len(reqs)))
	return nil
}
