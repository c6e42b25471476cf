package strategytest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"

	"github.com/reservebench/reservebench/strategy"
)

// holdMany makes n HELD reservations on the first SKU, round-robin over the
// nodes, and returns their keys.
func (t *trial) holdMany(ctx context.Context, n int) ([]string, error) {
	sku := t.sku(t.in.Stock[0].SKU)
	keys := make([]string, n)
	ops := make([]Op, n)
	Together(n, func(i int) {
		keys[i] = t.key(fmt.Sprintf("req-%04d", i))
		ops[i] = t.reserveDefinite(ctx, fmt.Sprintf("c%d", i), i, strategy.Request{
			Key: keys[i], User: t.user(fmt.Sprintf("user-%04d", i)), SKU: sku, TTL: strategy.TTLForever,
		})
	})
	for _, op := range ops {
		if op.Outcome != strategy.OutcomeHeld {
			return nil, fmt.Errorf("setup: %d reservations on %d units: %s answered %s %s", n, t.in.Stock[0].Total, op.Req.Key, op.Outcome, op.Err)
		}
	}
	return keys, nil
}

// expire runs ExpireDue on a node and records it. A failing run is recorded
// as unknown: the job may have done part of its work.
func (t *trial) expire(ctx context.Context, proc string, node int) Op {
	op := Op{Process: proc, Kind: "expire", Node: node % t.cfg.NodeCount(), Invoke: t.hist.Begin()}
	units, err := t.node(node).(strategy.Expirer).ExpireDue(ctx)
	op.Units, op.Type = units, OpOK
	if err != nil {
		op.Type, op.Err, op.Aborted = OpInfo, err.Error(), abortedByConflict(err)
	}
	if op.Aborted {
		t.aborted.Add(1)
	}
	return t.hist.End(op)
}

// expireUntilDone runs the expiry job and, when it fails, reruns it, as an
// operator reruns a release job that died (at most 3 runs). It returns the
// units the successful run reported, and how many runs failed other than by
// a conflict abort (those are evidence; aborts are counted in t.aborted).
func (t *trial) expireUntilDone(ctx context.Context, proc string, node int) (units, failedRuns int) {
	for run := 0; run < 3; run++ {
		op := t.expire(ctx, proc, node)
		if op.Type == OpOK {
			return units + op.Units, failedRuns
		}
		if !op.Aborted {
			failedRuns++
		}
	}
	return units, failedRuns
}

// confirm runs Confirm on a node and records it; an error is an unknown
// outcome.
func (t *trial) confirm(ctx context.Context, proc string, node int, key string, mode strategy.ConfirmMode) (bool, error) {
	op := Op{Process: proc, Kind: "confirm", Node: node % t.cfg.NodeCount(), Req: strategy.Request{Key: key}, Invoke: t.hist.Begin()}
	moved, err := t.node(node).(strategy.Confirmer).Confirm(ctx, key, mode)
	op.Moved, op.Type = moved, OpOK
	if err != nil {
		op.Type, op.Err = OpInfo, err.Error()
	}
	t.hist.End(op)
	return moved, err
}

func (t *trial) makeDue(ctx context.Context, keys []string) error {
	n, err := t.dep.(strategy.Ager).MakeDue(ctx, keys)
	if err != nil {
		return fmt.Errorf("make due: %w", err)
	}
	if n != len(keys) {
		return fmt.Errorf("make due: moved %d of %d HELD reservations", n, len(keys))
	}
	t.madeDueMu.Lock()
	defer t.madeDueMu.Unlock()
	if t.madeDue == nil {
		t.madeDue = map[string]bool{}
	}
	for _, k := range keys {
		t.madeDue[k] = true
	}
	return nil
}

// returned measures a step by the audit, not by what the strategy reports:
// it runs step and returns how far available rose.
func (t *trial) returned(ctx context.Context, step func()) (int, error) {
	before, err := t.audit(ctx)
	if err != nil {
		return 0, err
	}
	step()
	after, err := t.audit(ctx)
	if err != nil {
		return 0, err
	}
	return sumAvailable(after) - sumAvailable(before), nil
}

// statuses counts the durable statuses of keys as node 0 reads them, and
// has every other node read them too: a node that answers from what it
// saw itself (a cache of its own reservations) reads a status another
// node's transition has moved on, and only a node that made none of the
// transitions shows it. Disagreements are checked at the end of the trial.
func (t *trial) statuses(ctx context.Context, keys []string) (map[strategy.Status]int, map[string]strategy.Reservation, error) {
	durable, err := t.lookupAll(ctx, keys)
	if err != nil {
		return nil, nil, err
	}
	for node := 1; node < t.cfg.NodeCount(); node++ {
		other, err := t.lookupOn(ctx, node, keys)
		if err != nil {
			return nil, nil, err
		}
		for _, k := range keys {
			t.nodesCompared++
			if a, b := durable[k].Status, other[k].Status; a != b {
				t.nodesApart = append(t.nodesApart, fmt.Sprintf("%s: node 0 %q, node %d %q", t.plain(k), a, node, b))
			}
		}
	}
	count := map[strategy.Status]int{}
	for _, d := range durable {
		count[d.Status]++
	}
	return count, durable, nil
}

// runExpiryReplay is C28-07: 20 held, 8 expire: the release returns 8; a
// replay returns 0; 4 concurrent replays return 0 in total; the other 12
// expire and 4 concurrent releases return exactly 12 in total. With
// then_due only that many of the rest expire in the second round, and with
// then_requests new requests follow, which may take exactly the units that
// came back (C28-10's input: 10 units, 10 held, 5 due, replayed, then 10
// requests: 5 succeed).
func runExpiryReplay(ctx context.Context, t *trial) error {
	in := t.in
	keys, err := t.holdMany(ctx, in.Held)
	if err != nil {
		return err
	}
	first, rest := keys[:in.FirstDue], keys[in.FirstDue:]
	if in.ThenDue != nil {
		rest = rest[:*in.ThenDue]
	}
	var failedRuns int

	step := func(name string, due int, run func() (reported int)) error {
		var reported int
		back, err := t.returned(ctx, func() { reported = run() })
		if err != nil {
			return err
		}
		t.fact(name, "%d units back", back)
		t.check(strategy.ReturnOnce, name+": units back == rows that became due", back == due,
			fmt.Sprintf("%d rows were due, the stock rose by %d", due, back))
		t.check(strategy.ReturnOnce, name+": reported units == units back", reported == back,
			fmt.Sprintf("the job reported %d, the stock rose by %d", reported, back))
		return nil
	}

	if err := t.makeDue(ctx, first); err != nil {
		return err
	}
	if err := step(fmt.Sprintf("release %d due", len(first)), len(first), func() int {
		u, f := t.expireUntilDone(ctx, "job", 0)
		failedRuns += f
		return u
	}); err != nil {
		return err
	}
	if err := step("replay", 0, func() int { u, f := t.expireUntilDone(ctx, "replay", 1); failedRuns += f; return u }); err != nil {
		return err
	}
	var gateErr error
	concurrent := func(proc string) int {
		units, failed := make([]int, in.Workers), make([]int, in.Workers)
		gateErr = t.concurrently(ctx, in.Workers, func(i int) {
			units[i], failed[i] = t.expireUntilDone(ctx, fmt.Sprintf("%s%d", proc, i), i)
		})
		sum := 0
		for i := range units {
			sum += units[i]
			failedRuns += failed[i]
		}
		return sum
	}
	if in.Workers > 1 {
		if err := step(fmt.Sprintf("%d concurrent replays", in.Workers), 0, func() int { return concurrent("replay") }); err != nil {
			return err
		}
		if gateErr != nil {
			return gateErr
		}
	}
	if len(rest) > 0 {
		if err := t.makeDue(ctx, rest); err != nil {
			return err
		}
		if err := step(fmt.Sprintf("%d concurrent releases of %d due", in.Workers, len(rest)), len(rest), func() int { return concurrent("job") }); err != nil {
			return err
		}
		if gateErr != nil {
			return gateErr
		}
	}
	// A run that fails is evidence, not noise: no fault is injected here, so
	// a failing job is one whose count disagrees with the database (a CHECK
	// on the stock caught it) or that cannot run beside itself.
	t.fact("release job runs that failed", "%d", failedRuns)
	t.check(strategy.ReturnOnce, "the expiry job fails only by a conflict abort when no fault is injected", failedRuns == 0,
		fmt.Sprintf("%d runs failed (the harness reran them); a run that fails with nothing injected disagrees with the database", failedRuns))

	due := append(append([]string(nil), first...), rest...)
	count, _, err := t.statuses(ctx, due)
	if err != nil {
		return err
	}
	t.fact("end", "EXPIRED %d of %d due", count[strategy.StatusExpired], len(due))
	t.check(strategy.ReturnOnce, "every due reservation ends EXPIRED", count[strategy.StatusExpired] == len(due),
		fmt.Sprintf("statuses %v", count))
	if len(due) < len(keys) {
		notDue, _, err := t.statuses(ctx, keys[len(due):])
		if err != nil {
			return err
		}
		t.check(strategy.ReturnOnce, "a reservation that is not due stays HELD", notDue[strategy.StatusHeld] == len(keys)-len(due),
			fmt.Sprintf("statuses of the %d not due: %v", len(keys)-len(due), notDue))
	}
	if _, ok := t.node(1).(strategy.Releaser); ok && len(due) > 0 {
		if err := t.releaseMovesNothing(ctx, due[0], strategy.StatusExpired); err != nil {
			return err
		}
	}
	if in.ThenRequests == 0 { // with then_requests, they are the ones to take the units back
		if err := t.reserveAgain(ctx, due, strategy.StatusExpired); err != nil {
			return err
		}
	}
	return t.thenRequests(ctx)
}

// thenRequests sends then_requests new requests at once, from new users,
// and reports how many were HELD; the durable checks judge whether more
// units were sold than the stock holds.
func (t *trial) thenRequests(ctx context.Context) error {
	n := t.in.ThenRequests
	if n == 0 {
		return nil
	}
	sku := t.sku(t.in.Stock[0].SKU)
	before, err := t.audit(ctx)
	if err != nil {
		return err
	}
	ops := make([]Op, n)
	Together(n, func(i int) {
		ops[i] = t.reserveDefinite(ctx, fmt.Sprintf("new%d", i), i, strategy.Request{
			Key: t.key(fmt.Sprintf("req-new-%04d", i)), User: t.user(fmt.Sprintf("user-new-%04d", i)), SKU: sku, TTL: strategy.TTLForever})
	})
	held := 0
	for _, op := range ops {
		if op.Outcome == strategy.OutcomeHeld {
			held++
		}
	}
	free := before[sku].Available
	t.fact(fmt.Sprintf("then %d new requests", n), "%d HELD (%d units were free by the stock's count)", held, free)
	t.check(strategy.NoOversell, "new requests take at most the units that are really free",
		held <= min(free, before[sku].Total-before[sku].Active),
		fmt.Sprintf("%d HELD; the audit before them: total %d, available %d, active %d", held, before[sku].Total, before[sku].Available, before[sku].Active))
	return nil
}

// runConfirmVsExpire is C28-08: every reservation is due; confirmers (a late
// payment callback) and the expiry job race for the rows. Each row must be
// handled by exactly one side, and units come back only for EXPIRED rows.
func runConfirmVsExpire(ctx context.Context, t *trial) error {
	in := t.in
	all, err := t.holdMany(ctx, in.Held)
	if err != nil {
		return err
	}
	// First, with nothing racing: confirmed rows that are due must survive
	// the expiry job, which returns units only for the HELD ones.
	if in.Confirmed > 0 {
		confirmed, held := all[:in.Confirmed], all[in.Confirmed:2*in.Confirmed]
		if err := t.makeDue(ctx, all[:2*in.Confirmed]); err != nil {
			return err
		}
		// A payment that arrives after expires_at is refused in the
		// default mode, even though no expiry moved the row yet.
		late, err := t.confirm(ctx, "confirm", 0, held[0], strategy.ConfirmBeforeExpiry)
		if err != nil {
			return fmt.Errorf("confirm before expiry of a due reservation: %w", err)
		}
		t.check(Base, "ConfirmBeforeExpiry does not confirm a reservation past expires_at", !late,
			fmt.Sprintf("%s was due and Confirm(ConfirmBeforeExpiry) moved it", t.plain(held[0])), held[0])
		if late {
			return nil // the rest of the prelude assumes the row is still HELD
		}
		for _, k := range confirmed {
			moved, err := t.confirm(ctx, "confirm", 0, k, strategy.ConfirmUntilExpired)
			if err != nil || !moved {
				return fmt.Errorf("setup: confirm %s: moved %v, %v", t.plain(k), moved, err)
			}
		}
		var reported, failed int
		back, err := t.returned(ctx, func() { reported, failed = t.expireUntilDone(ctx, "job", 0) })
		if err != nil {
			return err
		}
		cs, _, err := t.statuses(ctx, confirmed)
		if err != nil {
			return err
		}
		hs, _, err := t.statuses(ctx, held)
		if err != nil {
			return err
		}
		t.fact(fmt.Sprintf("%d due CONFIRMED and %d due HELD, then the expiry job alone", len(confirmed), len(held)),
			"%d stay CONFIRMED, %d EXPIRED, %d units back", cs[strategy.StatusConfirmed], hs[strategy.StatusExpired], back)
		t.check(strategy.ReturnOnce, "the expiry job never moves a CONFIRMED row", cs[strategy.StatusConfirmed] == len(confirmed),
			fmt.Sprintf("statuses of %d confirmed due rows after the job: %v", len(confirmed), cs))
		t.check(strategy.ReturnOnce, "the expiry job returns units for the HELD due rows only", back == len(held) && reported == back && hs[strategy.StatusExpired] == len(held),
			fmt.Sprintf("%d HELD due rows, %d EXPIRED; the stock rose by %d, the job reported %d", len(held), hs[strategy.StatusExpired], back, reported))
		t.check(strategy.ReturnOnce, "the expiry job fails only by a conflict abort when no fault is injected", failed == 0, fmt.Sprintf("%d runs failed", failed))
	}
	keys := all[2*in.Confirmed:]
	if err := t.makeDue(ctx, keys); err != nil {
		return err
	}
	queue := make(chan string, len(keys))
	for _, i := range rand.Perm(len(keys)) {
		queue <- keys[i]
	}
	close(queue)

	var mu sync.Mutex
	confirmedByCall := map[string]bool{}
	expiredUnits := 0
	var gateErr error
	back, err := t.returned(ctx, func() {
		gateErr = t.concurrently(ctx, 2*in.Workers, func(i int) {
			if i < in.Workers { // confirmer
				for k := range queue {
					if moved, _ := t.confirm(ctx, fmt.Sprintf("confirm%d", i), i, k, strategy.ConfirmUntilExpired); moved {
						mu.Lock()
						confirmedByCall[k] = true
						mu.Unlock()
					}
				}
				return
			}
			u, _ := t.expireUntilDone(ctx, fmt.Sprintf("expire%d", i), i)
			mu.Lock()
			expiredUnits += u
			mu.Unlock()
		})
	})
	if err != nil {
		return err
	}
	if gateErr != nil {
		return gateErr
	}
	count, durable, err := t.statuses(ctx, keys)
	if err != nil {
		return err
	}
	confirmed, expired := count[strategy.StatusConfirmed], count[strategy.StatusExpired]
	wrongSide := 0
	for k := range confirmedByCall {
		if durable[k].Status != strategy.StatusConfirmed {
			wrongSide++
		}
	}
	t.fact("rows handled by exactly one side", "%d of %d", confirmed+expired, len(keys))
	t.vary("confirmed", confirmed)
	t.vary("expired", expired)
	t.check(strategy.ReturnOnce, "each row is confirmed or expired, never both, never neither", confirmed+expired == len(keys) && wrongSide == 0,
		fmt.Sprintf("statuses %v; %d rows confirmed by a call but not CONFIRMED", count, wrongSide))
	t.check(strategy.ReturnOnce, "units come back only for EXPIRED rows", back == expired,
		fmt.Sprintf("%d rows EXPIRED, the stock rose by %d", expired, back))
	t.check(strategy.ReturnOnce, "confirm calls that moved a row == CONFIRMED rows", len(confirmedByCall) == confirmed,
		fmt.Sprintf("%d calls reported a move, %d rows CONFIRMED", len(confirmedByCall), confirmed))
	t.check(strategy.ReturnOnce, "units the expiry job reported == units back", expiredUnits == back,
		fmt.Sprintf("the jobs reported %d, the stock rose by %d", expiredUnits, back))
	return nil
}

// release calls Release on node and records it; an abort by a conflict is
// counted in t.aborted.
func (t *trial) release(ctx context.Context, proc string, node int, key string) (int, error) {
	op := Op{Process: proc, Kind: "release", Node: node % t.cfg.NodeCount(), Req: strategy.Request{Key: key}, Invoke: t.hist.Begin()}
	units, err := t.node(node).(strategy.Releaser).Release(ctx, key)
	op.Units, op.Type = units, OpOK
	if err != nil {
		op.Type, op.Err, op.Aborted = OpInfo, err.Error(), abortedByConflict(err)
		if op.Aborted {
			t.aborted.Add(1)
		}
	}
	t.hist.End(op)
	return units, err
}

// runReleaseReplay checks Release the way C28-07 checks the expiry job: the
// first release of a HELD reservation returns its unit, every replay (also
// concurrent) returns nothing, and of concurrent first releases exactly one
// returns the unit.
func runReleaseReplay(ctx context.Context, t *trial) error {
	in := t.in
	held, err := t.holdMany(ctx, in.Held)
	if err != nil {
		return err
	}
	// Only the first in.Release are released: the others stay HELD, so a
	// unit returned twice raises the stock instead of hitting a CHECK on
	// available <= total.
	keys := held[:in.Release]
	failed := 0
	var mu sync.Mutex
	release := func(proc string, node int, key string) int {
		units, err := t.release(ctx, proc, node, key)
		if err != nil && !abortedByConflict(err) {
			mu.Lock()
			failed++
			mu.Unlock()
		}
		return units
	}
	var seqFirst, seqReplay, seqConc, concFirst, concReplay int
	var gateErr error
	back, err := t.returned(ctx, func() {
		for i, k := range keys {
			if gateErr != nil {
				return
			}
			if i%2 == 0 { // release, replay, then concurrent replays
				seqFirst += release("c", 0, k)
				seqReplay += release("c", 1, k)
				gateErr = t.concurrently(ctx, in.Workers, func(w int) {
					u := release(fmt.Sprintf("r%d", w), w, k)
					mu.Lock()
					seqConc += u
					mu.Unlock()
				})
				continue
			}
			// concurrent first releases: exactly one may return the unit
			gateErr = t.concurrently(ctx, in.Workers, func(w int) {
				u := release(fmt.Sprintf("r%d", w), w, k)
				mu.Lock()
				concFirst += u
				mu.Unlock()
			})
			concReplay += release("c", 0, k)
		}
	})
	if err != nil {
		return err
	}
	if gateErr != nil {
		return gateErr
	}
	seq, conc := (len(keys)+1)/2, len(keys)/2
	t.fact("release, then replay, then concurrent replays", "%d, %d, %d units for %d reservations", seqFirst, seqReplay, seqConc, seq)
	t.fact("concurrent first releases, then replay", "%d, %d units for %d reservations", concFirst, concReplay, conc)
	t.check(strategy.ReturnOnce, "a release returns its unit exactly once", seqFirst == seq && seqReplay == 0 && seqConc == 0 && concFirst == conc && concReplay == 0,
		fmt.Sprintf("sequential %d/%d/%d, concurrent %d/%d (want %d/0/0, %d/0)", seqFirst, seqReplay, seqConc, concFirst, concReplay, seq, conc))
	t.check(strategy.ReturnOnce, "units back == reservations released", back == len(keys),
		fmt.Sprintf("%d released, the stock rose by %d", len(keys), back))
	count, _, err := t.statuses(ctx, keys)
	if err != nil {
		return err
	}
	t.check(strategy.ReturnOnce, "every released reservation ends RELEASED", count[strategy.StatusReleased] == len(keys),
		fmt.Sprintf("statuses %v", count))
	t.check(strategy.ReturnOnce, "a release fails only by a conflict abort when no fault is injected", failed == 0, fmt.Sprintf("%d release calls failed", failed))
	if rest := held[in.Release:]; len(rest) > 0 {
		hs, _, err := t.statuses(ctx, rest)
		if err != nil {
			return err
		}
		t.check(strategy.ReturnOnce, "a reservation nobody released stays HELD", hs[strategy.StatusHeld] == len(rest), fmt.Sprintf("statuses %v", hs))
	}
	if c, ok := t.node(0).(strategy.Confirmer); ok {
		moved, err := c.Confirm(ctx, keys[0], strategy.ConfirmUntilExpired)
		if err != nil {
			return fmt.Errorf("confirm after release: %w", err)
		}
		t.check(strategy.ReturnOnce, "a released reservation cannot be confirmed", !moved, "Confirm moved a RELEASED reservation")
	}
	if _, ok := t.node(0).(strategy.Confirmer); ok && len(held) > in.Release {
		if err := t.releaseConfirmed(ctx, held[in.Release]); err != nil {
			return err
		}
	}
	if t.cfg.NodeCount() > 1 && len(held) > in.Release+1 {
		if err := t.releaseElsewhere(ctx, in.Release+1, held[in.Release+1]); err != nil {
			return err
		}
	}
	return t.reserveAgain(ctx, keys, strategy.StatusReleased)
}

// releaseElsewhere releases holdMany's reservation i (made on node i)
// through the next node only, and then has its user ask for the SKU under
// a new key on node i: the unit is free and the user holds nothing, so
// the answer is HELD. Every other release in the scenario reaches every
// node, so a node that remembers "this user holds the SKU" until its own
// Release forgets it passes them all.
func (t *trial) releaseElsewhere(ctx context.Context, i int, key string) error {
	units, err := t.release(ctx, "c", i+1, key)
	t.check(strategy.ReturnOnce, "a release of a HELD reservation through a node that did not make it returns its unit", err == nil && units == 1,
		fmt.Sprintf("release on node %d: %d units, %v", (i+1)%t.cfg.NodeCount(), units, err), key)
	if err != nil || units != 1 {
		return nil // the state is not the one the next step is about
	}
	again := t.reserveDefinite(ctx, "c", i, strategy.Request{
		Key: t.key(fmt.Sprintf("req-elsewhere-%04d", i)), User: t.user(fmt.Sprintf("user-%04d", i)), SKU: t.sku(t.in.Stock[0].SKU), TTL: strategy.TTLForever,
	})
	// A node that counts its own share may have none left: SOLD_OUT is
	// allowed there unless no phantom sold-out is claimed; USER_LIMIT never.
	ok := again.Outcome == strategy.OutcomeHeld ||
		again.Outcome == strategy.OutcomeSoldOut && !t.env.Meta.Claims.Has(strategy.NoPhantomSoldOut)
	t.check(Base, "a user whose reservation another node released can reserve the SKU again on the node that made it", ok,
		fmt.Sprintf("made on node %d, released on node %d, asked again on node %d: %s %s", i%t.cfg.NodeCount(), (i+1)%t.cfg.NodeCount(), i%t.cfg.NodeCount(), again.Outcome, again.Err), key, again.Req.Key)
	return nil
}

// releaseConfirmed confirms a HELD reservation and then releases it: the
// release must move nothing and return no unit (a paid reservation is not
// given back by a late cancel).
func (t *trial) releaseConfirmed(ctx context.Context, key string) error {
	moved, err := t.confirm(ctx, "c", 0, key, strategy.ConfirmUntilExpired)
	if err != nil || !moved {
		return fmt.Errorf("confirm %s before releasing it: moved %v, %v", t.plain(key), moved, err)
	}
	if err := t.releaseMovesNothing(ctx, key, strategy.StatusConfirmed); err != nil {
		return err
	}
	// A CONFIRMED reservation is active: its user is refused the SKU under
	// a new key (an index on status = 'HELD' alone lets a paying user
	// take a second unit).
	var n int // holdMany's key req-NNNN belongs to user-NNNN
	if _, err := fmt.Sscanf(t.plain(key), "req-%d", &n); err != nil {
		return fmt.Errorf("releaseConfirmed: %s is not a key of holdMany", t.plain(key))
	}
	second := t.reserveDefinite(ctx, "c", 1, strategy.Request{
		Key: t.key(fmt.Sprintf("req-paid-%04d", n)), User: t.user(fmt.Sprintf("user-%04d", n)), SKU: t.sku(t.in.Stock[0].SKU), TTL: strategy.TTLForever,
	})
	t.check(strategy.OneActivePerUser, "a user whose reservation was confirmed is refused the SKU under a new key", second.Outcome == strategy.OutcomeUserLimit,
		fmt.Sprintf("%s answered %s %s", t.plain(second.Req.Key), second.Outcome, second.Err), second.Req.Key)
	// The confirmed request sent again is a REPLAY of the reservation as
	// it is now: a client that lost the first answer learns it is paid for
	// (a replay query that folds CONFIRMED into HELD passes every other
	// check).
	var bad []string
	for node := 0; node < t.cfg.NodeCount(); node++ {
		again := t.reserveDefinite(ctx, "c", node, strategy.Request{Key: key, User: t.user(fmt.Sprintf("user-%04d", n)), SKU: t.sku(t.in.Stock[0].SKU), TTL: strategy.TTLForever})
		if again.Outcome != strategy.OutcomeReplay || again.Answer.Status != strategy.StatusConfirmed {
			bad = append(bad, fmt.Sprintf("node %d answered %s %s %s", node, again.Outcome, again.Answer.Status, again.Err))
		}
	}
	t.check(strategy.IdempotentKey, "a confirmed reservation's request sent again is a REPLAY that says CONFIRMED", len(bad) == 0, sample(bad), key)
	return nil
}

// releaseMovesNothing releases key, whose reservation has ended in status
// ended (CONFIRMED, EXPIRED): the release must move nothing and return no
// unit. A paid reservation is not given back by a late cancel, and an
// expired one already gave its unit back; a Release whose WHERE takes more
// than HELD passes every other scenario.
func (t *trial) releaseMovesNothing(ctx context.Context, key string, ended strategy.Status) error {
	var units int
	back, err := t.returned(ctx, func() {
		rel := Op{Process: "c", Kind: "release", Node: 1 % t.cfg.NodeCount(), Req: strategy.Request{Key: key}, Invoke: t.hist.Begin()}
		var rerr error
		units, rerr = t.node(1).(strategy.Releaser).Release(ctx, key)
		rel.Units, rel.Type = units, OpOK
		if rerr != nil {
			rel.Type, rel.Err = OpInfo, rerr.Error()
		}
		t.hist.End(rel)
	})
	if err != nil {
		return err
	}
	_, durable, err := t.statuses(ctx, []string{key})
	if err != nil {
		return err
	}
	st := durable[key].Status
	t.check(strategy.ReturnOnce, fmt.Sprintf("a%s %s reservation cannot be released", article(ended), strings.ToLower(string(ended))), units == 0 && back == 0 && st == ended,
		fmt.Sprintf("Release of a%s %s reservation reported %d units, the stock rose by %d, status %s", article(ended), ended, units, back, st), key)
	return nil
}

// article is "n" before a status that starts with a vowel.
func article(s strategy.Status) string {
	if strings.ContainsAny(string(s)[:1], "AEIOU") {
		return "n"
	}
	return ""
}

// reserveAgain has the holders of keys (made by holdMany, now in status
// ended) send their old request again, which must be a REPLAY that says
// ended (the reservation's current state, not the one it was made in), and
// then ask for the same SKU under a new key, all at once: a unit is free
// for each, and a reservation that no longer holds a unit must no longer
// count against its user (a limit that counts every status passes every
// other scenario).
func (t *trial) reserveAgain(ctx context.Context, keys []string, ended strategy.Status) error {
	sku := t.sku(t.in.Stock[0].SKU)
	replays, reused, again := make([]Op, len(keys)), make([]Op, len(keys)), make([]Op, len(keys))
	Together(len(keys), func(i int) {
		var n int // holdMany's key req-NNNN belongs to user-NNNN
		if _, err := fmt.Sscanf(t.plain(keys[i]), "req-%d", &n); err != nil {
			panic(fmt.Sprintf("reserveAgain: %s is not a key of holdMany", keys[i]))
		}
		user := t.user(fmt.Sprintf("user-%04d", n))
		replays[i] = t.reserveDefinite(ctx, fmt.Sprintf("again%d", i), i, strategy.Request{Key: keys[i], User: user, SKU: sku, TTL: strategy.TTLForever})
		// The key of a reservation that ended is still its owner's: another
		// user who sends it is told KEY_REUSED, not a REPLAY of it.
		reused[i] = t.reserveDefinite(ctx, fmt.Sprintf("again%d", i), i, strategy.Request{Key: keys[i], User: t.user(fmt.Sprintf("user-other-%04d", n)), SKU: sku, TTL: strategy.TTLForever})
		again[i] = t.reserveDefinite(ctx, fmt.Sprintf("again%d", i), i, strategy.Request{
			Key: t.key(fmt.Sprintf("req-again-%04d", n)), User: user, SKU: sku, TTL: strategy.TTLForever,
		})
	})
	var stale, refused, notReused []string
	for i := range keys {
		if r := reused[i]; r.Outcome != strategy.OutcomeKeyReused || r.Answer.Key != keys[i] || r.Answer.User == r.Req.User {
			notReused = append(notReused, fmt.Sprintf("%s from %s: %s %s (owner %q) %s", t.plain(r.Req.Key), t.plain(r.Req.User), r.Outcome, r.Answer.Status, t.plain(r.Answer.User), r.Err))
		}
		if r := replays[i]; r.Outcome != strategy.OutcomeReplay || r.Answer.Status != ended {
			stale = append(stale, fmt.Sprintf("%s: %s %s %s", t.plain(r.Req.Key), r.Outcome, r.Answer.Status, r.Err))
		}
		if a := again[i]; a.Outcome != strategy.OutcomeHeld {
			refused = append(refused, fmt.Sprintf("%s: %s %s", t.plain(a.Req.User), a.Outcome, a.Err))
		}
	}
	t.check(Base, fmt.Sprintf("a request sent again after its reservation was %s is a REPLAY that says %s", ended, ended), len(stale) == 0,
		fmt.Sprintf("%d of %d answered otherwise: %s", len(stale), len(keys), sample(stale)))
	t.check(strategy.IdempotentKey, fmt.Sprintf("the key of a reservation that was %s, sent by another user, is KEY_REUSED with its owner's reservation", ended), len(notReused) == 0,
		fmt.Sprintf("%d of %d answered otherwise: %s", len(notReused), len(keys), sample(notReused)))
	t.check(Base, fmt.Sprintf("a user whose reservation was %s can reserve the SKU again", ended), len(refused) == 0,
		fmt.Sprintf("%d of %d answered otherwise than HELD: %s", len(refused), len(keys), sample(refused)))
	if _, ok := t.node(0).(strategy.Releaser); !ok {
		return nil
	}
	var anew []string
	for _, a := range again {
		if a.Outcome == strategy.OutcomeHeld {
			anew = append(anew, a.Req.Key)
		}
	}
	return t.releaseOldAfterAnew(ctx, keys, anew, ended)
}

// releaseOldAfterAnew sends the release of every old key (now in status
// ended) again, after its user holds a new reservation of the same SKU
// (anew): a client retrying a cancel it never heard back from. Nothing may
// move and no unit may come back: the old reservation's unit came back
// already, and the user's new reservation is not the old one (a give-back
// guarded by the user's marker instead of the key's hands the new
// reservation's unit out a second time, and only this order of events
// shows it).
func (t *trial) releaseOldAfterAnew(ctx context.Context, keys, anew []string, ended strategy.Status) error {
	var units int
	var failed []string
	back, err := t.returned(ctx, func() {
		for i, k := range keys {
			u, err := t.release(ctx, "c", i, k)
			units += u
			if err != nil {
				failed = append(failed, fmt.Sprintf("%s: %v", t.plain(k), err))
			}
		}
	})
	if err != nil {
		return err
	}
	count, _, err := t.statuses(ctx, anew)
	if err != nil {
		return err
	}
	t.fact(fmt.Sprintf("releases of the %s keys sent again after their users reserved anew", strings.ToLower(string(ended))), "%d units reported, the stock rose by %d, %d of %d new reservations HELD",
		units, back, count[strategy.StatusHeld], len(anew))
	t.check(strategy.ReturnOnce, fmt.Sprintf("a release of a%s %s reservation sent again after its user reserved anew returns nothing", article(ended), strings.ToLower(string(ended))),
		units == 0 && back == 0 && len(failed) == 0 && count[strategy.StatusHeld] == len(anew),
		fmt.Sprintf("%d releases: %d units reported, the stock rose by %d, %d failed %s, new reservations %v", len(keys), units, back, len(failed), sample(failed), count))
	return nil
}
