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
// (nothing judged).
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
		key  string
		ttl  time.Duration
		paid bool // confirmed at 1.5*ttl, not left to the job
	}
	list := []held{{key: "due", ttl: ttl}, {key: "ahead", ttl: 3 * ttl}}
	if confirms {
		list = append(list, held{key: "due-paid", ttl: ttl, paid: true}, held{key: "ahead-paid", ttl: 3 * ttl, paid: true})
	}
	answered := make([]time.Time, len(list))
	made := time.Now()
	for i, h := range list {
		list[i].key = fmt.Sprintf("kit-clock-%s-%s", h.key, sku)
		res, err := node.Reserve(ctx, strategy.Request{Key: list[i].key, User: list[i].key, SKU: sku, TTL: h.ttl})
		if err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Fatalf("Reserve %q (TTL %v), the database's clock %v ahead: %s, %v; want HELD", list[i].key, h.ttl, pgtest.ClockAhead, res.Outcome, err)
		}
		answered[i] = res.Reservation.ExpiresAt
	}
	allMade := time.Now()
	for i, h := range list {
		got, err := node.Lookup(ctx, h.key)
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
	units := 0
	if expires {
		if units, err = expirer.ExpireDue(ctx); err != nil {
			t.Fatalf("ExpireDue: %v", err)
		}
	}
	if time.Now().After(until) {
		return false
	}
	note := fmt.Sprintf("the database's clock runs %v ahead of the application's; the calls began %v after the last reservation was made", pgtest.ClockAhead, began.Sub(allMade).Round(time.Millisecond))
	wantUnits := 0
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
		case due:
			want = strategy.StatusExpired
			wantUnits++
		}
		got, err := node.Lookup(ctx, h.key)
		if err != nil {
			t.Fatalf("Lookup %q: %v", h.key, err)
		}
		if got.Status != want && !(h.paid && confirmed[h.key] && got.Status == strategy.StatusConfirmed) {
			t.Errorf("after the expiry job, %q (TTL %v): %s; want %s (%s: a strategy that stamps expires_at by one clock and judges it by the other is %v off)",
				h.key, h.ttl, got.Status, want, note, pgtest.ClockAhead)
		}
	}
	if expires && units != wantUnits {
		t.Errorf("the expiry job returned %d units; want %d, one for each reservation of the shorter TTL (%s)", units, wantUnits, note)
	}
	return true
}
