package strategytest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// The timing checks of expirytiming.go act right after the ladder is held,
// before its shortest rung is due, and every other scenario makes
// reservations due with the strategy's own Ager.MakeDue, which may move
// expires_at a second or more into the past. An expiry job that waits
// half a second past expires_at ("clock-skew tolerance"), or a confirm that
// accepts a payment half a second late, passes them all. The checks here
// hold reservations that fall due a moment later and act on them, paced by
// the clock, from just before to just after that moment: each call is
// judged on its own against the expires_at Lookup gave, as in
// expirytiming.go. The clock is what is under test; the pacing orders
// nothing between calls.

// justPastTTL is the TTL of the reservations the checks act on: long
// enough that all of them are held before the first is due on a slow
// machine, short enough that the checks take about a second.
const justPastTTL = 400 * time.Millisecond

// justPastStep is how often the checks act once the reservations are
// close to due: a lag or a grace longer than clockSlack plus a step shows.
const justPastStep = 40 * time.Millisecond

// checkJustPast runs checkExpiryJustPast and checkConfirmJustPast side by
// side, on deployments of their own, and reports what each found.
func checkJustPast(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	checks := []struct {
		name string
		run  func(tester, strategy.Meta, *pgxpool.Pool, map[strategy.Resource]string)
	}{{"expiry job", checkExpiryJustPast}, {"confirm", checkConfirmJustPast}}
	found := make([]*recorder, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			found[i] = runRecorded(func(r tester) { c.run(r, meta, db, rs) })
		}()
	}
	wg.Wait()
	var skipped []string
	for i, r := range found {
		for _, e := range r.errs {
			t.Errorf("%s: %s", checks[i].name, e)
		}
		if r.skipped != "" {
			skipped = append(skipped, r.skipped)
		}
	}
	if len(skipped) == len(checks) {
		t.Skip(strings.Join(skipped, "; "))
	}
}

// checkExpiryJustPast: the expiry job runs every justPastStep from before
// the reservations fall due until each has moved; a run that began more
// than clockSlack after a reservation's expires_at must have moved it, and
// none may move one whose expires_at was still ahead (by earlySlack) of the
// server's clock read when it returned.
func checkExpiryJustPast(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, keys, expires := holdTTLs(ctx, t, meta, db, rs, "lag", []time.Duration{justPastTTL, justPastTTL})
	defer dep.Close()
	expirer, ok := dep.Node(0).(strategy.Expirer)
	if !ok {
		t.Skip("no expiry job (strategy.Expirer)")
	}
	last := latest(expires)
	deadline := last.Add(clockSlack + 10*justPastStep)
	if wait := time.Until(last.Add(-2 * justPastStep)); wait > 0 {
		<-time.After(wait)
	}
	tick := time.NewTicker(justPastStep)
	defer tick.Stop()
	moved := map[string]bool{}
	for len(moved) < len(keys) && time.Now().Before(deadline) {
		<-tick.C
		began := time.Now()
		units, err := expirer.ExpireDue(ctx)
		if err != nil {
			t.Fatalf("ExpireDue: %v", err)
		}
		returned := serverNow(ctx, t, db)
		now := 0
		for i, k := range keys {
			if moved[k] {
				continue
			}
			r, err := dep.Node(0).Lookup(ctx, k)
			if err != nil {
				t.Fatalf("Lookup %s: %v", k, err)
			}
			switch {
			case r.Status == strategy.StatusExpired:
				moved[k] = true
				now++
				if ahead := expires[i].Sub(returned); ahead > earlySlack {
					t.Errorf("it expired %s while its expires_at was %s ahead of the server's clock read after it returned", k, ahead.Round(time.Microsecond))
				}
			case r.Status != strategy.StatusHeld:
				t.Fatalf("%s: status %s after ExpireDue; want HELD or EXPIRED", k, r.Status)
			case began.Sub(expires[i]) > clockSlack:
				t.Fatalf("a run that began %s after the expires_at of %s left it HELD (and returned %d units): the job waits past expires_at",
					began.Sub(expires[i]).Round(time.Millisecond), k, units)
			}
		}
		if units != now {
			t.Errorf("a run reported %d units; it moved %d reservations to EXPIRED", units, now)
		}
	}
	if len(moved) < len(keys) {
		t.Errorf("%d of %d reservations still HELD %s after they fell due", len(keys)-len(moved), len(keys), time.Since(last).Round(time.Millisecond))
	}
}

// confirmOffsets are when checkConfirmJustPast confirms, each reservation
// at one offset from its own expires_at. A margin on either side shows in
// a call that lands between the margin and expires_at: a grace past it
// (clockSlack and beyond) in the calls after, a margin before it in the
// dense calls of the last 50 ms, which a margin of a few tens of
// milliseconds ("clock skew") refuses. One call there suffices, and a call
// slower than the window it landed in cannot show it, so there are many:
// each starts on its own at its moment, not after the one before, so a slow
// call (a loaded machine, a Confirm that queues) never pushes the rest out
// of the window.
var confirmOffsets = []time.Duration{
	-160 * time.Millisecond, -120 * time.Millisecond, -80 * time.Millisecond,
	-48 * time.Millisecond, -42 * time.Millisecond, -36 * time.Millisecond, -30 * time.Millisecond,
	-24 * time.Millisecond, -18 * time.Millisecond, -12 * time.Millisecond, -6 * time.Millisecond,
	0, 40 * time.Millisecond, 120 * time.Millisecond, 160 * time.Millisecond,
	200 * time.Millisecond, 240 * time.Millisecond, 280 * time.Millisecond,
}

// checkConfirmJustPast: reservations that fall due together are confirmed
// one each at the moments of confirmOffsets, from before its expires_at to
// after it; a confirm that began more than clockSlack after expires_at must
// refuse, one that returned more than earlySlack before it (the server's
// clock) must move the row.
func checkConfirmJustPast(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ttls := make([]time.Duration, len(confirmOffsets))
	for i := range ttls {
		ttls[i] = justPastTTL
	}
	dep, keys, expires := holdTTLs(ctx, t, meta, db, rs, "grace", ttls)
	defer dep.Close()
	confirmer, ok := dep.Node(0).(strategy.Confirmer)
	if !ok {
		t.Skip("no Confirm (strategy.Confirmer)")
	}
	// The earliest offset goes to the earliest expires_at, so the moments
	// come in the order of the offsets however the holds spread.
	order := make([]int, len(keys))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return expires[a].Compare(expires[b]) })
	type call struct {
		began, returned time.Time
		ok              bool
		err             error
	}
	calls := make([]call, len(keys))
	var wg sync.WaitGroup
	for n, i := range order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if wait := time.Until(expires[i].Add(confirmOffsets[n])); wait > 0 {
				<-time.After(wait)
			}
			c := &calls[i]
			c.began = time.Now()
			c.ok, c.err = confirmer.Confirm(ctx, keys[i], strategy.ConfirmBeforeExpiry)
			if c.err != nil {
				c.err = fmt.Errorf("Confirm %s: %w", keys[i], c.err)
				return
			}
			// serverNow's Fatalf belongs to the test's goroutine.
			if err := db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&c.returned); err != nil {
				c.err = fmt.Errorf("reading the server's clock: %w", err)
			}
		}()
	}
	wg.Wait()
	var late, refused []string
	for _, i := range order {
		c, k := calls[i], keys[i]
		switch {
		case c.err != nil:
			t.Fatal(c.err)
		case c.ok && c.began.Sub(expires[i]) > clockSlack:
			late = append(late, fmt.Sprintf("%s, %s after its expires_at", k, c.began.Sub(expires[i]).Round(time.Millisecond)))
		case !c.ok && expires[i].Sub(c.returned) > earlySlack:
			refused = append(refused, fmt.Sprintf("%s, %s before its expires_at", k, expires[i].Sub(c.returned).Round(time.Microsecond)))
		}
	}
	if len(late) > 0 {
		t.Errorf("ConfirmBeforeExpiry confirmed %d reservations after their expires_at had passed: %s", len(late), strings.Join(late, "; "))
	}
	if len(refused) > 0 {
		t.Errorf("ConfirmBeforeExpiry refused %d reservations before their expires_at: %s", len(refused), strings.Join(refused, "; "))
	}
}

func latest(ts []time.Time) time.Time {
	var out time.Time
	for _, t := range ts {
		if t.After(out) {
			out = t
		}
	}
	return out
}
