package strategytest

import (
	"context"
	"fmt"
	"strings"

	"github.com/reservebench/reservebench/pgtest/pgproxy"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest/internal/pgcontrol"
)

// cutTransition is one transition partitionTransitions cuts: the call, on
// a key HELD for it, and what the row's status says its answer must be.
type cutTransition struct {
	name string // Confirm, Release, ExpireDue
	key  string
	// moves is the status the transition moves the row to.
	moves strategy.Status
	// call runs it once on node 0 and records it; its answer as a count
	// (Confirm: 1 for moved).
	call func(ctx context.Context, proc string) (int, error)
}

// partitionTransitions, in the trials of a drop fault, cuts the
// transitions: on the scenario's second SKU (its units are the holds'
// alone), it holds one unit for each transition the strategy has (Confirm,
// Release, and ExpireDue over a hold made due with Ager), and runs each in
// turn with the proxy armed to reset its connection once the server has
// executed the trial's point (the first write, or the COMMIT). A cut call
// must end unknown or with its true answer, read from the row afterwards:
// Confirm true iff the row is CONFIRMED, Release and ExpireDue 1 iff it is
// RELEASED or EXPIRED (the only release of the key, the only due hold). Once
// the server has ended the cut backend, a call that ended unknown is sent
// again, as a client would, until it answers: the row must then have moved,
// and the resend must report nothing moved when the cut call had moved it.
// Then every unit the rows say is free must sell again (a unit a cut
// transition took out of its row and never gave back is lost for good), and
// the trial's audit, after this, must balance.
func (t *trial) partitionTransitions(ctx context.Context, p *pgproxy.Proxy, mode string, point pgproxy.Point) error {
	p.Arm(pgproxy.Fault{}) // a fault the load left armed must not cut the holds
	for len(p.Hits()) > 0 {
		<-p.Hits()
	}
	label := "fault " + mode + ": transitions"
	n0 := t.node(0)
	_, hasConfirm := n0.(strategy.Confirmer)
	_, hasRelease := n0.(strategy.Releaser)
	_, hasExpire := n0.(strategy.Expirer)
	_, ages := t.dep.(strategy.Ager)
	hasExpire = hasExpire && ages
	var calls []cutTransition
	if hasConfirm {
		calls = append(calls, cutTransition{name: "Confirm", moves: strategy.StatusConfirmed, call: func(ctx context.Context, proc string) (int, error) {
			moved, err := t.confirm(ctx, proc, 0, t.key("cut-confirm"), strategy.ConfirmBeforeExpiry)
			if moved {
				return 1, err
			}
			return 0, err
		}, key: t.key("cut-confirm")})
	}
	if hasRelease {
		calls = append(calls, cutTransition{name: "Release", moves: strategy.StatusReleased, key: t.key("cut-release"), call: func(ctx context.Context, proc string) (int, error) {
			return t.release(ctx, proc, 0, t.key("cut-release"))
		}})
	}
	if hasExpire {
		calls = append(calls, cutTransition{name: "ExpireDue", moves: strategy.StatusExpired, key: t.key("cut-expire"), call: func(ctx context.Context, proc string) (int, error) {
			op := t.expire(ctx, proc, 0)
			if op.Type != OpOK {
				return op.Units, fmt.Errorf("%s", op.Err)
			}
			return op.Units, nil
		}})
	}
	if len(calls) == 0 {
		t.fact(label, "not applicable: no Confirm, Release or ExpireDue")
		return nil
	}
	cutSKU := t.in.Stock[1]
	sku := t.sku(cutSKU.SKU)
	keys := make([]string, len(calls))
	for i, c := range calls {
		keys[i] = c.key
		if err := t.holdSomewhere(ctx, "cut-hold", c.key, t.user(fmt.Sprintf("user-cut-%02d", i)), sku); err != nil {
			return err
		}
	}
	if hasExpire {
		if err := t.makeDue(ctx, []string{t.key("cut-expire")}); err != nil {
			return err
		}
	}

	var reached, wrong, resendWrong []string
	unknown, definite := 0, 0
	for _, c := range calls {
		p.Arm(pgproxy.Fault{Point: point, Action: pgproxy.Drop, Hits: 1})
		got, err := c.call(ctx, "cut")
		p.Arm(pgproxy.Fault{})
		// A Drop reports its hit before it resets the connection, so the
		// hit is there once the call has seen the reset.
		var hits []pgproxy.Hit
		for len(p.Hits()) > 0 {
			hits = append(hits, <-p.Hits())
		}
		if len(hits) == 0 {
			reached = append(reached, fmt.Sprintf("%s not cut (no %s sent)", c.name, point))
		} else {
			reached = append(reached, fmt.Sprintf("%s cut (%s)", c.name, firstWord(hits[0].SQL)))
		}
		pids := make([]int32, len(hits))
		for i, h := range hits {
			pids[i] = int32(h.Backend)
		}
		if err := pgcontrol.WaitNone(ctx, t.env.Admin, "backends of the cut transitions", goneBackendsSQL, pids); err != nil {
			return err
		}
		durable, lerr := t.lookupAll(ctx, []string{c.key})
		if lerr != nil {
			return lerr
		}
		st := durable[c.key].Status
		moved := st == c.moves
		switch {
		case len(hits) == 0: // not cut: its answer is checked all the same
		case err != nil:
			unknown++
		default:
			definite++
		}
		if err == nil {
			if (got == 1) != moved || got > 1 {
				wrong = append(wrong, fmt.Sprintf("%s answered %s, and the row is %s", c.name, transitionAnswer(c.name, got), st))
			}
			continue
		}
		// Unknown: the client sends it again, once the server has ended the
		// cut backend, until it answers.
		var again int
		var aerr error
		for try := 0; try < resendTries; try++ {
			again, aerr = c.call(ctx, fmt.Sprintf("cut-again%d", try))
			if aerr == nil {
				break
			}
		}
		after, lerr := t.lookupAll(ctx, []string{c.key})
		if lerr != nil {
			return lerr
		}
		switch {
		case aerr != nil:
			resendWrong = append(resendWrong, fmt.Sprintf("%s sent again %d times, still failing: %v", c.name, resendTries, aerr))
		case after[c.key].Status != c.moves:
			resendWrong = append(resendWrong, fmt.Sprintf("%s sent again answered %s, and the row is %s, not %s", c.name, transitionAnswer(c.name, again), after[c.key].Status, c.moves))
		case moved && again != 0:
			resendWrong = append(resendWrong, fmt.Sprintf("%s sent again after the cut one had moved the row answered %s", c.name, transitionAnswer(c.name, again)))
		}
	}
	t.fact(label, "armed to cut each once the server had executed its %s: %s", point, strings.Join(reached, ", "))
	t.vary(label+": cut calls that ended unknown", unknown)
	t.vary(label+": cut calls answered definitely", definite)
	t.check(Base, "a transition whose connection was cut ends unknown or with its true answer (Confirm true iff the row is CONFIRMED, Release and ExpireDue 1 iff it moved the row)", len(wrong) == 0,
		sample(wrong), keys...)
	t.check(Base, "a transition sent again after a cut left it unknown moves the row, and reports nothing moved when the cut one had moved it", len(resendWrong) == 0,
		sample(resendWrong), keys...)
	return t.sellFreedAgain(ctx, label, cutSKU, keys)
}

// answerText renders a transition's answer.
func transitionAnswer(name string, got int) string {
	if name == "Confirm" {
		return fmt.Sprintf("%v", got == 1)
	}
	return fmt.Sprintf("%d", got)
}

// holdSomewhere holds one unit of sku under key, on node 0 or, where a
// node with no unit left may answer SOLD_OUT while another has one (no
// claim against a phantom sold-out), on the next node that has one.
func (t *trial) holdSomewhere(ctx context.Context, proc, key, user, sku string) error {
	mayPhantom := !t.env.Meta.Claims.Has(strategy.NoPhantomSoldOut)
	var last Op
	for node := 0; node < t.cfg.NodeCount(); node++ {
		last = t.reserveDefinite(ctx, proc, node, strategy.Request{Key: key, User: user, SKU: sku, TTL: strategy.TTLForever})
		if last.Outcome == strategy.OutcomeHeld || !(mayPhantom && last.Outcome == strategy.OutcomeSoldOut) {
			break
		}
	}
	if last.Outcome != strategy.OutcomeHeld {
		return fmt.Errorf("setup: hold %s: %s %s %s", t.plain(key), last.Type, last.Outcome, last.Err)
	}
	return nil
}

// sellFreedAgain asks for every unit of the cut transitions' SKU that its
// rows say is free (total minus the active rows among keys, the SKU's only
// ones), each under a new key: each must be HELD (on some node, where a
// phantom sold-out is not claimed against). A unit a cut Release or
// ExpireDue took out of its row and never gave back is not sold again.
func (t *trial) sellFreedAgain(ctx context.Context, label string, cutSKU StockInput, keys []string) error {
	durable, err := t.lookupAll(ctx, keys)
	if err != nil {
		return err
	}
	free := cutSKU.Total
	for _, k := range keys {
		if durable[k].Status.Active() {
			free--
		}
	}
	sku := t.sku(cutSKU.SKU)
	mayPhantom := !t.env.Meta.Claims.Has(strategy.NoPhantomSoldOut)
	var refused, sent []string
	for i := 0; i < free; i++ {
		key := t.key(fmt.Sprintf("cut-again-%02d", i))
		sent = append(sent, key)
		var last Op
		for node := 0; node < t.cfg.NodeCount(); node++ {
			last = t.reserveDefinite(ctx, "cut-sell", node, strategy.Request{Key: key, User: t.user(fmt.Sprintf("user-cut-again-%02d", i)), SKU: sku, TTL: strategy.TTLForever})
			if last.Outcome == strategy.OutcomeHeld || !(mayPhantom && last.Outcome == strategy.OutcomeSoldOut) {
				break
			}
		}
		if last.Outcome != strategy.OutcomeHeld {
			refused = append(refused, fmt.Sprintf("%s: %s %s %s", t.plain(key), last.Type, last.Outcome, last.Err))
		}
	}
	t.check(t.auditClaim(strategy.ReturnOnce), "a unit whose Release or ExpireDue was cut, once resolved, sells again", len(refused) == 0,
		fmt.Sprintf("%d of %d units the rows say are free were not sold: %s", len(refused), free, sample(refused)), append(sent, keys...)...)
	return nil
}
