package strategytest

import (
	"context"
	"fmt"
	"github.com/jackc/pgx/v5"
	"strings"

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
	beside, err := t.besideOtherProcess(ctx, kp, h, sku)
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
	// The request beside the helper has its answer now that the helper is
	// gone: a unit, perhaps, one of those the helper gave back.
	besideHeld := 0
	if beside != nil {
		a := <-beside
		t.hist.End(reserveOp(a.op, a.res, a.err))
		if a.err == nil && a.res.Outcome == strategy.OutcomeHeld {
			besideHeld = 1
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
	t.check(strategy.Conserves, "the units are available again once its backends are gone", sumAvailable(after)+besideHeld == sumAvailable(before),
		fmt.Sprintf("available %d before, %d after (%d taken since by the request that waited beside the helper)", sumAvailable(before), sumAvailable(after), besideHeld))

	// The units can be sold again, to someone else: one of them, perhaps,
	// to the request that waited beside the helper.
	sold := besideHeld
	for i := sold; i < len(reqs); i++ {
		op := t.reserveDefinite(ctx, "c", i, strategy.Request{Key: t.key(fmt.Sprintf("req-after-%02d", i)), User: t.user(fmt.Sprintf("user-after-%02d", i)), SKU: sku, TTL: strategy.TTLForever})
		if op.Outcome == strategy.OutcomeHeld {
			sold++
		}
	}
	t.fact(label+": sold again afterwards", "%d of %d", sold, len(reqs))
	t.check(Base, "the killed process's units can be sold again", sold == len(reqs), fmt.Sprintf("%d of %d", sold, len(reqs)))
	return nil
}

// besideOtherProcess, at kill point "uncommitted", sends a plain request
// for sku from this process while the helper, another OS process attached
// to the deployment, holds every unit of it in a transaction held open. It
// must wait (for the helper's backend, in pg_blocking_pids, or for a lock
// outside PostgreSQL) or answer without a unit: a HELD here is a unit the
// helper's commit would sell twice. Every other race of the kit is between
// nodes of one process, which lock alike even where the lock's id comes
// from something of the process's own (outsider round 49's m01: an
// advisory lock id hashed with a seed per process). The answer arrives on
// the channel once the helper is gone (nil: not sent), with the op to
// record in the history.
func (t *trial) besideOtherProcess(ctx context.Context, kp string, h *helper, sku string) (chan besideAnswer, error) {
	if kp != KillUncommitted || strings.Count(h.Stage, string(strategy.OutcomeHeld)) < t.in.Stock[0].Total {
		return nil, nil // the helper does not hold every unit
	}
	if t.caps.CrashMidReserve {
		// A node that counts its share in memory (memquota) is one
		// process's: the helper serves node 0 too, so both would count
		// node 0's share, a deployment no service runs.
		return nil, nil
	}
	rows, err := t.env.Admin.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, h.appName)
	if err != nil {
		return nil, fmt.Errorf("the helper's backends: %w", err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, fmt.Errorf("the helper's backends: %w", err)
	}
	holders := make([]uint32, len(pids))
	for i, p := range pids {
		holders[i] = uint32(p)
	}
	var box panicBox
	req := strategy.Request{Key: t.key("req-beside-helper"), User: t.user("user-beside-helper"), SKU: sku, TTL: strategy.TTLForever}
	op := Op{Process: "b", Req: req, Invoke: t.hist.Begin()}
	done := reserveAsync(ctx, &box, t.node(0), req)
	waited, err := awaitAnswerOrBlockedByAny(ctx, t.env.Admin, holders, done)
	if err != nil {
		return nil, fmt.Errorf("read the lock waits behind the helper: %w", err)
	}
	box.rethrow()
	out := make(chan besideAnswer, 1)
	if !waited {
		a := <-done
		t.check(strategy.NoOversell, "a request from this process, while another process attached to the deployment holds every unit of its SKU in a transaction held open, waits or is refused",
			a.err != nil || a.res.Outcome != strategy.OutcomeHeld, fmt.Sprintf("HELD at once (%s): the other process's commit would sell the unit twice", t.plain(sku)))
		out <- besideAnswer{a, op}
		return out, nil
	}
	go func() { out <- besideAnswer{<-done, op} }()
	return out, nil
}

// besideAnswer is besideOtherProcess's answer and the op it records.
type besideAnswer struct {
	answer
	op Op
}
