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

// expiryStagger spaces the expires_at of checkExpiryJustPast's
// reservations, expiryKeys of them: whenever a run of the expiry job
// happens near them, some reservation falls due within a few milliseconds
// after it, where a job that moves what is due "soon" (a clock-skew
// allowance of tens of milliseconds) moves one early. The runs go back to
// back, so a loaded machine that slows them still leaves some of them
// among the stagger.
const (
	expiryStagger = 6 * time.Millisecond
	expiryKeys    = 12
)

// checkExpiryJustPast: the expiry job runs back to back from before the
// reservations fall due until each has moved; a run that began more than
// clockSlack after a reservation's expires_at must have moved it, and none
// may move one whose expires_at was still ahead (by earlySlack) of the
// server's clock read when it returned: by count, the runs' units so far
// against the reservations due (or overdue) by then, and each
// reservation's status looked up once the runs end. Rounds run (with longer TTLs, for
// holds that outlast a short one on a loaded machine) until one had enough
// runs that could move a reservation early (confirmWindow, as for
// confirms), or one found a violation.
func checkExpiryJustPast(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	var chances int
	for round, ttl := range confirmTTLs {
		failed, n := expiryRound(t, meta, db, rs, fmt.Sprintf("lag%d", round), ttl)
		if failed || n >= confirmWindowCalls {
			return
		}
		chances = n
	}
	t.Logf("expiry job just before expires_at: only %d runs began and returned within %s before a HELD reservation's expires_at in the last round (TTL %s); a skew that small was not tried",
		chances, confirmWindow, confirmTTLs[len(confirmTTLs)-1])
}

// expiryRound is one round of checkExpiryJustPast: whether it reported a
// violation, and how many runs of the job began and returned within
// confirmWindow before the expires_at of a reservation still HELD.
func expiryRound(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string, prefix string, ttl time.Duration) (failed bool, chances int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ttls := make([]time.Duration, expiryKeys)
	for i := range ttls {
		ttls[i] = ttl + time.Duration(i)*expiryStagger
	}
	dep, keys, expires := holdTTLs(ctx, t, meta, db, rs, prefix, ttls)
	defer dep.Close()
	expirer, ok := dep.Node(0).(strategy.Expirer)
	if !ok {
		t.Skip("no expiry job (strategy.Expirer)")
	}
	first := slices.MinFunc(expires, time.Time.Compare)
	if wait := time.Until(first.Add(-2 * confirmWindow)); wait > 0 {
		<-time.After(wait)
	}
	// No wall-clock deadline ends the runs: on a loaded machine one run may
	// take longer than the whole stagger, and what is judged is each run
	// against the moment it began. The runs go back to back, nothing but a
	// read of the server's clock between them: which run moved which
	// reservation is judged by count (each run's units against the
	// reservations due by the time it returned), and the reservations are
	// looked up once, after the runs. Looking up all twelve after each run
	// (as this check did until 2026-12-06) left gaps of a dozen round trips
	// between runs, longer than the stagger on a loaded machine, where no
	// run fell inside a reservation's last 50 ms (ctl-expire-skew was
	// missed in about 1 CI run of 25). The loop ends when the runs' units
	// cover every reservation, or at the first run that began more than
	// clockSlack after the last expires_at; ctx bounds a job that never
	// returns.
	last := slices.MaxFunc(expires, time.Time.Compare)
	moved := 0
	for moved < len(keys) {
		began := time.Now()
		units, err := expirer.ExpireDue(ctx)
		if err != nil {
			t.Fatalf("ExpireDue: %v", err)
		}
		returned := serverNow(ctx, t, db)
		moved += units
		due, overdue, chance := 0, 0, false
		for _, e := range expires {
			ahead := e.Sub(returned)
			if ahead <= earlySlack {
				due++
			} else if e.Sub(began) <= confirmWindow {
				chance = true
			}
			if began.Sub(e) > clockSlack {
				overdue++
			}
		}
		if chance {
			chances++
		}
		switch {
		case moved > due:
			t.Errorf("the runs so far moved %d reservations; only %d of their expires_at had passed by the server's clock read after the last returned (the job moves reservations before their time)", moved, due)
			failed = true
		case moved < overdue:
			t.Errorf("the runs so far moved %d reservations; %d were due more than %s before the last of them began (the job waits past expires_at)", moved, overdue, clockSlack)
			failed = true
		}
		if failed || began.Sub(last) > clockSlack {
			break
		}
	}
	expired := 0
	for _, k := range keys {
		r, err := dep.Node(0).Lookup(ctx, k)
		if err != nil {
			t.Fatalf("Lookup %s: %v", k, err)
		}
		switch r.Status {
		case strategy.StatusExpired:
			expired++
		case strategy.StatusHeld:
			if !failed {
				t.Errorf("%s is HELD after runs of the job that began more than %s after its expires_at", k, clockSlack)
				failed = true
			}
		default:
			t.Fatalf("%s: status %s after ExpireDue; want HELD or EXPIRED", k, r.Status)
		}
	}
	if expired != moved {
		t.Errorf("the runs reported %d units; they moved %d reservations to EXPIRED", moved, expired)
		failed = true
	}
	return failed, chances
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

// confirmWindow is the stretch before expires_at that a call must begin
// and end inside to show a margin of that size: a round in which fewer
// than confirmWindowCalls calls did (a loaded machine: holds that took
// longer than the TTL, calls slower than the window) says nothing about a
// margin, and runs again with a longer TTL.
const (
	confirmWindow      = 50 * time.Millisecond
	confirmWindowCalls = 3
)

// confirmTTLs are the TTLs of the just-past checks' rounds: the later ones
// give holds on a loaded machine time to finish before the first moment to
// act. An idle machine runs the first round only; a machine running the
// race suite beside the table (make test) sometimes needs a second one.
var confirmTTLs = []time.Duration{justPastTTL, 3 * justPastTTL, 10 * justPastTTL, 10 * justPastTTL, 10 * justPastTTL}

// checkConfirmJustPast: reservations that fall due together are confirmed
// one each at the moments of confirmOffsets, from before its expires_at to
// after it; a confirm that began more than clockSlack after expires_at must
// refuse, one that returned more than earlySlack before it (the server's
// clock) must move the row. Rounds run until one had enough calls inside
// confirmWindow to show a margin there, or one found a violation.
func checkConfirmJustPast(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	var inWindow int
	for round, ttl := range confirmTTLs {
		late, refused, in := confirmRound(t, meta, db, rs, fmt.Sprintf("grace%d", round), ttl)
		if len(late) > 0 {
			t.Errorf("ConfirmBeforeExpiry confirmed %d reservations after their expires_at had passed: %s", len(late), strings.Join(late, "; "))
		}
		if len(refused) > 0 {
			t.Errorf("ConfirmBeforeExpiry refused %d reservations before their expires_at: %s", len(refused), strings.Join(refused, "; "))
		}
		if len(late)+len(refused) > 0 || in >= confirmWindowCalls {
			return
		}
		inWindow = in
	}
	t.Logf("confirm just before expires_at: only %d calls began and returned within %s before expires_at in the last round (TTL %s); a margin that small was not tried",
		inWindow, confirmWindow, confirmTTLs[len(confirmTTLs)-1])
}

// confirmRound holds one reservation per confirmOffsets with the given TTL
// and confirms each at its moment. It returns the confirms that came late
// and the refusals that came early, and how many calls began and returned
// inside confirmWindow before expires_at (whatever they answered).
func confirmRound(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string, prefix string, ttl time.Duration) (late, refused []string, inWindow int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ttls := make([]time.Duration, len(confirmOffsets))
	for i := range ttls {
		ttls[i] = ttl
	}
	dep, keys, expires := holdTTLs(ctx, t, meta, db, rs, prefix, ttls)
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
		if !c.began.Before(expires[i].Add(-confirmWindow)) && expires[i].Sub(c.returned) > earlySlack {
			inWindow++
		}
	}
	return late, refused, inWindow
}
