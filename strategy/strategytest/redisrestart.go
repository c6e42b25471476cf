package strategytest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/reservebench/reservebench/resourcetest"
	"github.com/reservebench/reservebench/strategy"
)

// runRedisRestart sends batches of requests with the strategy's Redis
// going down between them, no request in flight at each fault (so the
// counts are the design's, not the scheduler's), then once with requests
// in flight:
//
//	before            requests with Redis up; half of them confirmed
//	after SIGKILL     Redis SIGKILLed and restarted on its files: it keeps
//	                  what its persistence settings keep
//	while stopped     Redis shut down: every answer must be a definite
//	                  refusal (BUSY) or an unknown outcome the durable state
//	                  resolves; nothing may be sold twice; two releases
//	                  sent, and sent again once it is back
//	                  (releaseAcrossStop)
//	after restart     started again on its files
//	after empty       SIGKILLed and restarted with no data (a replacement
//	                  instance): then_requests more, enough to sell out
//	in flight         kill_in_flight: on a SKU of its own, SIGKILLed while
//	                  requests are in flight (killInFlight); then a pause
//	                  (stallInFlight), a release beside the expiry job's
//	                  give-back (releaseWhileJobGivesBack), a release
//	                  whose Redis commands are dropped, sent again
//	                  (releaseCommandsDropped) and left to the expiry job
//	                  (releaseDroppedLeftToJob), and a copy of a request
//	                  held on its way to Redis while the other copy holds
//	                  and releases (resendAfterRelease), each on a SKU of
//	                  its own
//
// The audit after each batch is charged to NoOversell and Conserves before
// the first fault, to SurvivesRestart after it: a design that keeps its
// stock in Redis claims only what its persistence keeps.
func runRedisRestart(ctx context.Context, t *trial) error {
	in := t.in
	srv := t.env.Resources[strategy.Redis]
	sku := t.sku(in.Stock[0].SKU)
	batch := 0
	// Whatever happens, the next scenario finds its Redis up.
	defer func() {
		if !srv.Running() {
			_ = srv.Restart(context.WithoutCancel(ctx))
		}
	}()
	// before runs between the batch and its audit (Redis must be up to
	// read a counter it keeps).
	send := func(label string, n int, before func() error) (map[strategy.Outcome]int, int, error) {
		batch++
		ops := make([]Op, n)
		reserve := t.reserveDefinite
		if before != nil { // Redis is down: BUSY is the answer, not worth resending now
			reserve = t.reserve
		}
		Together(n, func(i int) {
			ops[i] = reserve(ctx, fmt.Sprintf("b%d-c%d", batch, i), i, strategy.Request{
				Key: t.key(fmt.Sprintf("req-b%d-%03d", batch, i)), User: t.user(fmt.Sprintf("user-b%d-%03d", batch, i)), SKU: sku, TTL: strategy.TTLForever})
		})
		out, unknown := map[strategy.Outcome]int{}, 0
		for _, op := range ops {
			if op.Type == OpInfo {
				unknown++
				continue
			}
			out[op.Outcome]++
		}
		if before != nil {
			if err := before(); err != nil {
				return nil, 0, err
			}
		}
		audit, err := t.audit(ctx)
		if err != nil {
			return nil, 0, err
		}
		a := audit[sku]
		t.fact(label, "%s%s; active %d of %d, available %d", formatOutcomes(out), unknownNote(unknown), a.Active, a.Total, a.Available)
		claim := strategy.NoOversell
		if t.restarted {
			claim = strategy.SurvivesRestart
		}
		t.check(claim, label+": active reservations never exceed the stock", a.Oversold() == 0,
			fmt.Sprintf("%d active for %d units (oversold by %d)", a.Active, a.Total, a.Oversold()))
		claim = strategy.Conserves
		if t.restarted {
			claim = strategy.SurvivesRestart
		}
		t.check(claim, label+": total - available == active (drift 0)", a.Drift() == 0,
			fmt.Sprintf("total %d - available %d - active %d = drift %d", a.Total, a.Available, a.Active, a.Drift()))
		return out, unknown, nil
	}
	fault := func(what string, f func() error) error {
		t.restarted = true
		if err := f(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}

	if _, _, err := send("before: Redis up", in.Requests, nil); err != nil {
		return err
	}
	if _, ok := t.node(0).(strategy.Confirmer); ok {
		// A confirmed reservation is active too: a counter rebuilt from
		// the HELD rows alone sells its unit again after the faults.
		for i := 0; i < in.Requests/2; i++ {
			if _, err := t.confirm(ctx, "confirm", i, t.key(fmt.Sprintf("req-b1-%03d", i)), strategy.ConfirmUntilExpired); err != nil {
				return fmt.Errorf("confirm before the faults: %w", err)
			}
		}
	}
	if err := fault("SIGKILL and restart", func() error {
		if err := srv.Kill(ctx); err != nil {
			return err
		}
		return srv.Restart(ctx)
	}); err != nil {
		return err
	}
	if _, _, err := send("after SIGKILL, restarted on its files", in.Requests, nil); err != nil {
		return err
	}
	// Two reservations of the batch before (returnAfterWipe takes its
	// first four) are released while Redis is stopped, and again once it
	// is back, before the audit.
	var released releaseAcrossStop
	if in.Requests > 5 {
		if err := released.pick(ctx, t, []string{t.key("req-b2-004"), t.key("req-b2-005")}); err != nil {
			return err
		}
	}
	if err := fault("stop", func() error { return srv.Stop(ctx) }); err != nil {
		return err
	}
	released.whileStopped(ctx, t)
	down, unknown, err := send("while Redis is stopped (audited once it is back)", in.Requests, func() error {
		if err := fault("restart after stop", func() error { return srv.Restart(ctx) }); err != nil {
			return err
		}
		return released.onceBack(ctx, t)
	})
	if err != nil {
		return err
	}
	sold := down[strategy.OutcomeHeld] + down[strategy.OutcomeReplay]
	t.fact("while Redis is stopped: answers", "%d sold, %d refused, %d unknown (resolved from the database below)",
		sold, in.Requests-sold-unknown, unknown)
	// A store that is down is BUSY (or an unknown outcome), not SOLD_OUT:
	// a client told SOLD_OUT stops asking while units are free (outsider
	// round 54's m11, rediscounter answering SOLD_OUT with Redis down,
	// passed: both answers counted as refused).
	back, err := t.audit(ctx)
	if err != nil {
		return err
	}
	free := back[sku].Total - back[sku].Active
	t.check(Base, "while Redis is stopped, a SKU with units free is never SOLD_OUT: a store that is down is BUSY, or an unknown outcome",
		down[strategy.OutcomeSoldOut] == 0 || free <= 0,
		fmt.Sprintf("%d requests answered SOLD_OUT while Redis was stopped; the database shows %d of %d units free", down[strategy.OutcomeSoldOut], free, back[sku].Total))
	if _, _, err := send("after a graceful stop and restart", in.Requests, nil); err != nil {
		return err
	}
	if err := fault("restart empty", func() error {
		if err := srv.Kill(ctx); err != nil {
			return err
		}
		if err := srv.Wipe(); err != nil {
			return err
		}
		return srv.Restart(ctx)
	}); err != nil {
		return err
	}
	// Its own SKU and deployment, and one more empty restart before this
	// deployment has sent anything since the last: the steps below find
	// Redis as they would have.
	if err := t.orphanAcrossWipe(ctx, srv); err != nil {
		return err
	}
	if err := t.limitTakesNothing(ctx, sku); err != nil {
		return err
	}
	if err := t.returnAfterWipe(ctx, sku); err != nil {
		return err
	}
	if _, _, err := send("after a restart empty", in.ThenRequests, nil); err != nil {
		return err
	}
	if in.KillInFlight {
		if err := t.killInFlight(ctx, srv); err != nil {
			return err
		}
		if err := t.stallInFlight(ctx); err != nil {
			return err
		}
		if err := t.releaseWhileJobGivesBack(ctx); err != nil {
			return err
		}
		if err := t.releaseCommandsDropped(ctx); err != nil {
			return err
		}
		if err := t.releaseDroppedLeftToJob(ctx); err != nil {
			return err
		}
		if err := t.resendAfterRelease(ctx); err != nil {
			return err
		}
	}
	return t.resendUnknown(ctx)
}

// returnAfterWipe: after Redis restarted empty, reservations sold before
// it are released and expired. A design that rebuilds its counter from
// PostgreSQL but not what else it kept in Redis (a marker per key or per
// user) must still give those units back, once each: the audit must
// balance after the transitions, and the 40 requests that follow buy them.
func (t *trial) returnAfterWipe(ctx context.Context, sku string) error {
	// Batch 2 sold while Redis was up and none of it was confirmed.
	keys := []string{t.key("req-b2-000"), t.key("req-b2-001"), t.key("req-b2-002"), t.key("req-b2-003")}
	var did, wrong, wrongKeys []string
	if _, ok := t.node(0).(strategy.Releaser); ok {
		for i, key := range keys[:2] {
			before, err := t.node(i).Lookup(ctx, key)
			if err != nil {
				return fmt.Errorf("after a restart empty: lookup before the release: %w", err)
			}
			op := Op{Process: "wipe-release", Kind: "release", Node: i % t.cfg.NodeCount(), Req: strategy.Request{Key: key}, Invoke: t.hist.Begin()}
			units, err := t.node(i).(strategy.Releaser).Release(ctx, key)
			op.Units, op.Type = units, OpOK
			if err != nil {
				op.Type, op.Err = OpInfo, err.Error()
			}
			t.hist.End(op)
			did = append(did, fmt.Sprintf("release %s: %d unit(s)", t.plain(key), units))
			// Nothing else moves the row meanwhile: a HELD one is this
			// release's to move, whatever Redis lost of it.
			if want := map[bool]int{true: 1, false: 0}[before.Status == strategy.StatusHeld]; err == nil && units != want {
				wrong = append(wrong, fmt.Sprintf("%s (%s before): %d unit(s), want %d", t.plain(key), before.Status, units, want))
				wrongKeys = append(wrongKeys, key)
			}
		}
		t.check(Base, "after a restart empty, a release answers what it moved: 1 for a reservation that was HELD, though Redis lost what it knew of it", len(wrong) == 0,
			strings.Join(wrong, "; "), wrongKeys...)
	}
	if _, ok := t.dep.(strategy.Ager); ok {
		if _, isExpirer := t.node(0).(strategy.Expirer); isExpirer {
			if err := t.makeDue(ctx, keys[2:]); err != nil {
				return fmt.Errorf("after a restart empty: %w", err)
			}
			units, _ := t.expireUntilDone(ctx, "wipe-expire", 0)
			did = append(did, fmt.Sprintf("expiry job: %d unit(s)", units))
		}
	}
	if len(did) == 0 {
		return nil
	}
	audit, err := t.audit(ctx)
	if err != nil {
		return err
	}
	a := audit[sku]
	t.fact("after a restart empty: reservations sold before it ended", "%s; active %d of %d, available %d", strings.Join(did, ", "), a.Active, a.Total, a.Available)
	t.check(strategy.SurvivesRestart, "after a restart empty, a unit released or expired from a reservation sold before it goes back once (drift 0)", a.Drift() == 0,
		fmt.Sprintf("total %d - available %d - active %d = drift %d", a.Total, a.Available, a.Active, a.Drift()))
	return nil
}

// limitTakesNothing: after Redis restarted empty, a user who holds a unit
// asks again under a new key. Redis no longer knows the user, so a
// design that counts there takes a unit before PostgreSQL's per-user index
// refuses the row; USER_LIMIT must then give it back. The audit's
// available count is read before and after: the difference is the
// request's own, whatever the restart did to the counts, so it is charged
// to Conserves.
func (t *trial) limitTakesNothing(ctx context.Context, sku string) error {
	user := t.user(fmt.Sprintf("user-b1-%03d", t.in.Requests-1))
	held, err := t.node(0).Lookup(ctx, t.key(fmt.Sprintf("req-b1-%03d", t.in.Requests-1)))
	if err != nil {
		return fmt.Errorf("lookup of a holder: %w", err)
	}
	if !held.Status.Active() {
		return nil // the first batch did not sell to this user: nothing to ask
	}
	before, err := t.audit(ctx)
	if err != nil {
		return err
	}
	op := t.reserveDefinite(ctx, "limit", 0, strategy.Request{Key: t.key("req-holder-again"), User: user, SKU: sku, TTL: strategy.TTLForever})
	after, err := t.audit(ctx)
	if err != nil {
		return err
	}
	t.fact("after a restart empty: a holder asks again under a new key", "%s; available %d before, %d after", answerText(op), before[sku].Available, after[sku].Available)
	if op.Type == OpFail && op.Outcome == strategy.OutcomeUserLimit {
		t.check(strategy.Conserves, "a request refused USER_LIMIT takes no unit, after a restart empty too", after[sku].Available == before[sku].Available,
			fmt.Sprintf("available %d before the request, %d after its USER_LIMIT", before[sku].Available, after[sku].Available), op.Req.Key)
	}
	return nil
}

// answerText is an operation's answer, or its error.
func answerText(op Op) string {
	if op.Type == OpInfo {
		return "error " + op.Err
	}
	return string(op.Outcome)
}

// killInFlight is the mid-run fault, on a SKU like the first (its name
// with "-inflight", the same total) in a deployment of its own (so that its counts, which depend on scheduling, stay out of the
// trial's audit): 2 x requests are sent at once and Redis is SIGKILLed as
// soon as the first is answered, with the others in flight, then restarted
// on its files once they are all answered. The requests that got no answer
// are sent again, then then_requests more sell the SKU out. How many sold,
// failed or got no answer, and by how much the audit is off, are varying
// counts; whether it is off is judged against SurvivesRestart.
func (t *trial) killInFlight(ctx context.Context, srv resourcetest.Server) error {
	in := t.in
	plain := in.Stock[0].SKU + "-inflight"
	dep, send, err := t.sideDeployment(ctx, plain, 0)
	if err != nil {
		return err
	}
	defer dep.Close()
	definite := func(proc string, i int, req strategy.Request) Op {
		for try := 0; ; try++ {
			op := send(proc, i, req)
			if op.Outcome != strategy.OutcomeBusy || op.Type != OpFail || try >= busyResends || ctx.Err() != nil {
				return op
			}
			t.busyResent.Add(1)
		}
	}
	req := func(prefix string, i int) strategy.Request {
		return strategy.Request{Key: t.key(fmt.Sprintf("req-%s-%03d", prefix, i)), User: t.user(fmt.Sprintf("user-%s-%03d", prefix, i)), SKU: t.sku(plain), TTL: strategy.TTLForever}
	}
	n := 2 * in.Requests
	first := make(chan struct{})
	var once sync.Once
	killed := make(chan error, 1)
	go func() {
		<-first
		killed <- srv.Kill(ctx)
	}()
	ops := make([]Op, n)
	Together(n, func(i int) {
		ops[i] = send(fmt.Sprintf("f-c%d", i), i, req("inflight", i))
		once.Do(func() { close(first) })
	})
	if err := <-killed; err != nil {
		return fmt.Errorf("SIGKILL under load: %w", err)
	}
	if err := srv.Restart(ctx); err != nil {
		return fmt.Errorf("restart after the SIGKILL under load: %w", err)
	}
	sold, unknown, unresolved := 0, 0, 0
	for i, op := range ops {
		switch {
		case op.Type == OpInfo:
			unknown++
			if again := definite(op.Process+"'", i, op.Req); again.Type == OpInfo {
				unresolved++
			}
		case op.Outcome == strategy.OutcomeHeld:
			sold++
		}
	}
	t.vary("in flight: sold before the SIGKILL", sold)
	t.vary("in flight: no answer at the SIGKILL", unknown)
	t.check(Base, "in flight: every unanswered request gets an answer when sent again", unresolved == 0,
		"some requests still got no answer once Redis was back (counts in last-run.json)")
	Together(in.ThenRequests, func(i int) { definite(fmt.Sprintf("f-n%d", i), i, req("after", i)) })
	a, err := soleAudit(ctx, dep, "in-flight")
	if err != nil {
		return err
	}
	t.vary("in flight: oversold", a.Oversold())
	t.vary("in flight: drift", a.Drift())
	t.fact("in flight", "%s: Redis SIGKILLed after the first of %d answers, restarted on its files; unanswered requests sent again, then %d more",
		plain, n, in.ThenRequests)
	// A strategy that does not claim to survive a restart may or may not
	// lose the last writes before the SIGKILL (aof-everysec loses up to a
	// second of them), so whether its in-flight audit is off depends on
	// timing: the counts above record it, and only a claim is judged.
	if !t.env.Meta.Claims.Has(strategy.SurvivesRestart) {
		return nil
	}
	t.check(strategy.SurvivesRestart, "in flight: active reservations never exceed the stock", a.Oversold() == 0,
		plain+": more active reservations than units (by how many varies: last-run.json)")
	t.check(strategy.SurvivesRestart, "in flight: total - available == active once the unanswered are sent again", a.Drift() == 0,
		plain+": the counter and the reservations disagree (by how much varies: last-run.json)")
	return nil
}

// sideDeployment opens a deployment of its own over plain (the trial's
// first SKU's total, nodes and resources), so that counts that depend on
// scheduling stay out of the trial's audit, and returns it with send, which
// sends a request to node i mod nodes and records it in the history.
func (t *trial) sideDeployment(ctx context.Context, plain string, lease time.Duration) (strategy.Deployment, func(proc string, i int, req strategy.Request) Op, error) {
	cfg := strategy.Config{DB: t.env.DB, Stock: []strategy.Stock{{SKU: t.sku(plain), Total: t.in.Stock[0].Total}}, Nodes: t.in.Nodes, Resources: t.cfg.Resources, LockLease: lease}
	dep, err := t.env.Meta.Open(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("open the deployment of %s: %w", plain, err)
	}
	send := func(proc string, i int, req strategy.Request) Op {
		op := Op{Process: proc, Node: i % cfg.NodeCount(), Req: req, Invoke: t.hist.Begin()}
		res, err := dep.Node(i%cfg.NodeCount()).Reserve(ctx, req)
		return t.hist.End(reserveOp(op, res, err))
	}
	return dep, send, nil
}

// soleAudit is the audit of a side deployment's one SKU.
func soleAudit(ctx context.Context, dep strategy.Deployment, what string) (strategy.StockAudit, error) {
	audits, err := dep.Audit(ctx)
	if err != nil {
		return strategy.StockAudit{}, fmt.Errorf("%s audit: %w", what, err)
	}
	if len(audits) != 1 {
		return strategy.StockAudit{}, fmt.Errorf("%s audit: %d rows, want 1", what, len(audits))
	}
	return audits[0], nil
}

func unknownNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(", %d unknown", n)
}

// owns reports whether sku is one of the trial's deployment.
func (t *trial) owns(sku string) bool {
	for _, s := range t.cfg.Stock {
		if s.SKU == sku {
			return true
		}
	}
	return false
}

// resendUnknown sends every request of the trial's deployment whose outcome
// was unknown again, as the contract tells a client to, now that everything
// is up: each must get a definite answer.
func (t *trial) resendUnknown(ctx context.Context) error {
	var unresolved []string
	resent := 0
	for _, op := range t.hist.Ops() {
		if op.Kind != "reserve" || op.Type != OpInfo || !t.owns(op.Req.SKU) {
			continue
		}
		resent++
		if again := t.reserveDefinite(ctx, op.Process+"'", op.Node, op.Req); again.Type == OpInfo {
			unresolved = append(unresolved, t.plain(op.Req.Key)+": "+again.Err)
		}
	}
	t.vary("unknown outcomes resent", resent)
	t.check(Base, "every unknown outcome is resolved by sending the same request again", len(unresolved) == 0,
		fmt.Sprintf("%d still unknown: %s", len(unresolved), sample(unresolved)))
	return nil
}
