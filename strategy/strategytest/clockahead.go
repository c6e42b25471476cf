package strategytest

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
)

// checkClockAhead: a strategy judges expires_at by the clock it stamped it
// with. Every other check runs where the application and the database
// read one clock, so a strategy that stamps expires_at with the database's
// now() and then compares it with the application's time.Now() (or the
// other way round) passes them all (outsider round 28b's m7, an expiry job
// that compared with the client's clock). Here the database's clock runs
// pgtest.ClockAhead (5 s) ahead of the application's (a server of its own,
// started with libfaketime): reservations of TTL T and 3T are held at
// once, and at about 1.5T after they were made, ConfirmBeforeExpiry must
// refuse one of TTL T and accept one of 3T, and the expiry job must move
// exactly those of TTL T. A strategy that keeps to one clock, whichever,
// does so whatever the two clocks read; one that mixes them is 5 s off.
// Each HELD answer's expires_at must also be the one Lookup reads, to a
// second: an answer computed by the other clock tells the client another
// deadline than the one the strategy keeps. If
// the reservations took too long to make for the window between T and 3T
// on a loaded machine, a round with a longer T runs. Nothing here waits on
// a lock or a timeout (on that server they fire 5 s late: pgtest's
// Options.ClockAhead).
func checkClockAhead(t tester, meta strategy.Meta, rs map[strategy.Resource]string) {
	t.Helper()
	if os.Getenv(pgtest.EnvDSN) != "" {
		t.Skip(pgtest.EnvDSN + " names the server: a server whose clock runs ahead needs local binaries and libfaketime")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgtest.ClockAheadServer(ctx)
	if err != nil {
		t.Fatalf("a server whose clock runs %v ahead: %v", pgtest.ClockAhead, err)
	}
	d, err := srv.CreateDatabase(ctx, "rb_clock_ahead")
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer func() {
		if err := srv.DropDatabase(context.WithoutCancel(ctx), d.Name); err != nil {
			t.Errorf("%v", err)
		}
	}()
	db, err := pgtest.OpenPool(ctx, d.DSN, 16)
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer db.Close()
	// Up to 2.5 s, a TTL keeps either mix 5 s off past the window.
	for round, ttl := range []time.Duration{time.Second, 2 * time.Second, 2500 * time.Millisecond} {
		if clockAheadRound(ctx, t, meta, db, rs, round, ttl) {
			return
		}
	}
	t.Logf("the database's clock %v ahead: the reservations, or the calls on them, took too long on this machine for the window between their TTLs; not judged", pgtest.ClockAhead)
}

// answerSlack is how far a HELD answer's expires_at may be from the one
// Lookup reads: a strategy that answers what it stored is microseconds
// off, one that computes its answer by the other clock 5 s.
const answerSlack = time.Second

// clockAheadRound holds the reservations of TTL ttl and 3*ttl, acts on them
// at 1.5*ttl and judges; it reports false when the calls missed the window
// (nothing judged). Where the strategy has them, a pair is made in an
// attempt held open (strategy.SessionOpener), and a second deployment's
// pair is judged by its expiry job held open (strategy.ExpirySessionOpener):
// each path may take its clock from another place (outsider round 48's m33
// stamped a session's expires_at by the application's clock, and m32's job
// held open compared with it, and both passed when only Reserve and
// ExpireDue ran here).
func clockAheadRound(ctx context.Context, t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string, round int, ttl time.Duration) bool {
	t.Helper()
	sku := kitSKU(fmt.Sprintf("clock-ahead-%d", round))
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 8}}})
	if err != nil {
		t.Fatalf("Open on a server whose clock runs %v ahead: %v", pgtest.ClockAhead, err)
	}
	defer dep.Close()
	node := dep.Node(0)
	expirer, expires := node.(strategy.Expirer)
	confirmer, confirms := node.(strategy.Confirmer)
	if !expires && !confirms {
		t.Skip("no expiry job (strategy.Expirer) and no Confirm (strategy.Confirmer): nothing judges expires_at")
	}
	type held struct {
		key       string
		ttl       time.Duration
		paid      bool // confirmed at 1.5*ttl, not left to the job
		inSession bool // made in an attempt held open
		heldJob   bool // the second deployment's, judged by its job held open
	}
	list := []held{{key: "due", ttl: ttl}, {key: "ahead", ttl: 3 * ttl}}
	if confirms {
		list = append(list, held{key: "due-paid", ttl: ttl, paid: true}, held{key: "ahead-paid", ttl: 3 * ttl, paid: true})
	}
	opener, sessions := node.(strategy.SessionOpener)
	if sessions {
		list = append(list, held{key: "due-session", ttl: ttl, inSession: true}, held{key: "ahead-session", ttl: 3 * ttl, inSession: true})
	}
	var jobNode strategy.Strategy
	var jobSKU string
	if _, heldJobs := node.(strategy.ExpirySessionOpener); expires && heldJobs {
		jobSKU = kitSKU(fmt.Sprintf("clock-ahead-job-%d", round))
		jobDep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: jobSKU, Total: 2}}})
		if err != nil {
			t.Fatalf("Open of a second deployment on a server whose clock runs %v ahead: %v", pgtest.ClockAhead, err)
		}
		defer jobDep.Close()
		jobNode = jobDep.Node(0)
		list = append(list, held{key: "due-job", ttl: ttl, heldJob: true}, held{key: "ahead-job", ttl: 3 * ttl, heldJob: true})
	}
	nodeOf := func(h held) strategy.Strategy {
		if h.heldJob {
			return jobNode
		}
		return node
	}
	answered := make([]time.Time, len(list))
	made := time.Now()
	var session strategy.Session
	if sessions {
		if session, err = opener.OpenSession(ctx); err != nil {
			t.Fatalf("OpenSession: %v", err)
		}
		defer func() { _ = session.Rollback(context.Background()) }()
	}
	for i, h := range list {
		list[i].key = fmt.Sprintf("kit-clock-%s-%s", h.key, sku)
		req := strategy.Request{Key: list[i].key, User: list[i].key, SKU: sku, TTL: h.ttl}
		var res strategy.Result
		switch {
		case h.inSession:
			res, err = session.Reserve(ctx, req)
		case h.heldJob:
			req.SKU = jobSKU
			res, err = jobNode.Reserve(ctx, req)
		default:
			res, err = node.Reserve(ctx, req)
		}
		if err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Fatalf("Reserve %q (TTL %v%s), the database's clock %v ahead: %s, %v; want HELD", list[i].key, h.ttl, map[bool]string{true: ", in an attempt held open"}[h.inSession], pgtest.ClockAhead, res.Outcome, err)
		}
		answered[i] = res.Reservation.ExpiresAt
	}
	if sessions {
		if err := session.Commit(ctx); err != nil {
			t.Fatalf("Commit of the attempt held open: %v", err)
		}
	}
	allMade := time.Now()
	for i, h := range list {
		got, err := nodeOf(h).Lookup(ctx, h.key)
		if err != nil {
			t.Fatalf("Lookup %q: %v", h.key, err)
		}
		if d := got.ExpiresAt.Sub(answered[i]); d > answerSlack || d < -answerSlack {
			t.Errorf("Reserve %q (TTL %v) answered expires_at %s, Lookup reads %s (%v apart; the database's clock runs %v ahead of the application's): the answer must carry the deadline the strategy keeps",
				h.key, h.ttl, answered[i].Format(time.RFC3339Nano), got.ExpiresAt.Format(time.RFC3339Nano), d, pgtest.ClockAhead)
		}
	}
	if !allMade.Add(ttl / 2).After(time.Now()) {
		return false // the look-ups took the window
	}
	// By either clock, kept to, the short ones are due from allMade+ttl and
	// the long ones not before made+3*ttl: act halfway, judge only if the
	// calls began after the first moment and returned before the second,
	// with half a TTL to spare on each side.
	from, until := allMade.Add(ttl+ttl/2), made.Add(3*ttl-ttl/2)
	if !from.Before(until) {
		return false
	}
	<-time.After(time.Until(from)) // the clock is what is under test
	began := time.Now()
	confirmed := map[string]bool{}
	if confirms {
		for _, h := range list {
			if !h.paid {
				continue
			}
			ok, err := confirmer.Confirm(ctx, h.key, strategy.ConfirmBeforeExpiry)
			if err != nil {
				t.Fatalf("Confirm %q: %v", h.key, err)
			}
			confirmed[h.key] = ok
		}
	}
	units, jobUnits := 0, 0
	if expires {
		if units, err = expirer.ExpireDue(ctx); err != nil {
			t.Fatalf("ExpireDue: %v", err)
		}
	}
	if jobNode != nil {
		job, err := jobNode.(strategy.ExpirySessionOpener).OpenExpirySession(ctx)
		if err != nil {
			t.Fatalf("OpenExpirySession: %v", err)
		}
		jobUnits, err = job.ExpireDue(ctx)
		if err == nil {
			err = job.Commit(ctx)
		} else {
			_ = job.Rollback(context.Background())
		}
		if err != nil {
			t.Fatalf("the expiry job held open: %v", err)
		}
	}
	if time.Now().After(until) {
		return false
	}
	note := fmt.Sprintf("the database's clock runs %v ahead of the application's; the calls began %v after the last reservation was made", pgtest.ClockAhead, began.Sub(allMade).Round(time.Millisecond))
	wantUnits, wantJobUnits := 0, 0
	for _, h := range list {
		due := h.ttl == ttl
		if h.paid {
			if confirmed[h.key] == due {
				t.Errorf("ConfirmBeforeExpiry of %q (TTL %v) at 1.5 times the shorter TTL: %v; want %v (%s: a strategy that stamps expires_at by one clock and judges it by the other is %v off)",
					h.key, h.ttl, confirmed[h.key], !due, note, pgtest.ClockAhead)
			}
		}
		if !expires {
			continue
		}
		want := strategy.StatusHeld
		switch {
		case h.paid && !due:
			want = strategy.StatusConfirmed
		case due && h.heldJob:
			want = strategy.StatusExpired
			wantJobUnits++
		case due:
			want = strategy.StatusExpired
			wantUnits++
		}
		got, err := nodeOf(h).Lookup(ctx, h.key)
		if err != nil {
			t.Fatalf("Lookup %q: %v", h.key, err)
		}
		if got.Status != want && !(h.paid && confirmed[h.key] && got.Status == strategy.StatusConfirmed) {
			t.Errorf("after the expiry job%s, %q (TTL %v%s): %s; want %s (%s: a strategy that stamps expires_at by one clock and judges it by the other is %v off)",
				map[bool]string{true: " held open"}[h.heldJob], h.key, h.ttl, map[bool]string{true: ", made in an attempt held open"}[h.inSession], got.Status, want, note, pgtest.ClockAhead)
		}
	}
	if expires && units != wantUnits {
		t.Errorf("the expiry job returned %d units; want %d, one for each reservation of the shorter TTL (%s)", units, wantUnits, note)
	}
	if jobNode != nil && jobUnits != wantJobUnits {
		t.Errorf("the expiry job held open returned %d units; want %d, one for each reservation of the shorter TTL (%s)", jobUnits, wantJobUnits, note)
	}
	return true
}
