package strategytest

import (
	"context"
	"fmt"

	"github.com/reservebench/reservebench/strategy"
)

// runRedisRestart sends batches of requests with the strategy's Redis
// going down between them, no request in flight at each fault (so the
// counts are the design's, not the scheduler's):
//
//	before            requests with Redis up
//	after SIGKILL     Redis SIGKILLed and restarted on its files: it keeps
//	                  what its persistence settings keep
//	while stopped     Redis shut down: every answer must be a definite
//	                  refusal (BUSY) or an unknown outcome the durable state
//	                  resolves; nothing may be sold twice
//	after restart     started again on its files
//	after empty       SIGKILLed and restarted with no data (a replacement
//	                  instance): then_requests more, enough to sell out
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
	if err := fault("stop", func() error { return srv.Stop(ctx) }); err != nil {
		return err
	}
	down, unknown, err := send("while Redis is stopped (audited once it is back)", in.Requests, func() error {
		return fault("restart after stop", func() error { return srv.Restart(ctx) })
	})
	if err != nil {
		return err
	}
	sold := down[strategy.OutcomeHeld] + down[strategy.OutcomeReplay]
	t.fact("while Redis is stopped: answers", "%d sold, %d refused, %d unknown (resolved from the database below)",
		sold, in.Requests-sold-unknown, unknown)
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
	if _, _, err := send("after a restart empty", in.ThenRequests, nil); err != nil {
		return err
	}
	return t.resendUnknown(ctx)
}

// resendUnknown sends every request whose outcome was unknown again, as the
// contract tells a client to, now that everything is up: each must get a
// definite answer.
func (t *trial) resendUnknown(ctx context.Context) error {
	var unresolved []string
	resent := 0
	for _, op := range t.hist.Ops() {
		if op.Kind != "reserve" || op.Type != OpInfo {
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

func unknownNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(", %d unknown", n)
}
