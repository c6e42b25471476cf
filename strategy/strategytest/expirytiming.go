package strategytest

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// expiryLadder is the TTLs checkExpiryTiming holds at once: short enough
// that an expiry job which runs ahead of its clock by a second to a minute
// finds one still ahead of now() but inside its margin, long enough that
// the rest stay ahead on a slow machine.
// The longest rungs are past an hour, up to strategy.MaxTTL: a TTL cut to
// an hour (or any cap under a day) shows only there.
var expiryLadder = []time.Duration{
	250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 3 * time.Second,
	5 * time.Second, 10 * time.Second, 30 * time.Second, 50 * time.Second, 2 * time.Minute, 10 * time.Minute, time.Hour,
	6 * time.Hour, strategy.MaxTTL,
}

// clockSlack is how far apart the harness's clock and the one the strategy
// stamps expires_at with may be: both are this machine's wall clock
// (PostgreSQL's now(), Go's time.Now), read microseconds apart.
const clockSlack = 100 * time.Millisecond

// earlySlack is the slack of the other direction: a reservation moved (or
// a payment refused) while its expires_at was ahead of PostgreSQL's clock
// read after the call returned. Every reading the strategy made came
// before that one, and from the same clock (the server's now(), or this
// machine's, which is the server's for the kit's own); a millisecond
// covers the stamps' rounding to microseconds. A cutoff of now() plus a
// "skew" of tens of milliseconds is a sign error that clockSlack let by.
const earlySlack = time.Millisecond

// serverNow reads PostgreSQL's clock (clock_timestamp(), not the
// transaction's now()).
func serverNow(ctx context.Context, t tester, db *pgxpool.Pool) time.Time {
	t.Helper()
	var now time.Time
	if err := db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		t.Fatalf("reading the server's clock: %v", err)
	}
	return now
}

// holdLadder opens a deployment of its own and holds one reservation per
// TTL of expiryLadder on node 0, all at once. It returns the deployment
// (the caller closes it) and the keys, in ladder order. Each reservation's
// expires_at, in the answer and in Lookup, must be its TTL after a moment
// inside its Reserve call (within clockSlack): every scenario asks for an
// hour or a minute, so a TTL rounded to whole seconds or minutes, or one
// ignored for a constant hour, shows only here.
func holdLadder(ctx context.Context, t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string, prefix string) (strategy.Deployment, []string) {
	t.Helper()
	dep, keys, _ := holdTTLs(ctx, t, meta, db, rs, prefix, expiryLadder)
	return dep, keys
}

// holdTTLs is holdLadder for any TTLs; it also returns each expires_at as
// Lookup gave it.
func holdTTLs(ctx context.Context, t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string, prefix string, ttls []time.Duration) (strategy.Deployment, []string, []time.Time) {
	t.Helper()
	sku := kitSKU(prefix)
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: len(ttls)}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	keys := make([]string, len(ttls))
	held := make([]strategy.Result, len(ttls))
	errs := make([]error, len(ttls))
	began := make([]time.Time, len(ttls))
	returned := make([]time.Time, len(ttls))
	expires := make([]time.Time, len(ttls))
	Together(len(ttls), func(i int) {
		keys[i] = fmt.Sprintf("kit-%s-%02d-%s", prefix, i, sku)
		began[i] = time.Now()
		// All at once on one SKU: a strategy that queues on a lock (redislock
		// answers BUSY past its 3 s wait) is asked again, as a client would.
		held[i], errs[i] = reserveUnlessBusy(ctx, dep.Node(0), strategy.Request{Key: keys[i], User: fmt.Sprintf("kit-%s-%02d", prefix, i), SKU: sku, TTL: ttls[i]})
		returned[i] = time.Now()
	})
	var off []string
	for i, ttl := range ttls {
		if errs[i] != nil || held[i].Outcome != strategy.OutcomeHeld {
			dep.Close()
			t.Fatalf("Reserve with TTL %s: %+v, %v; want HELD", ttl, held[i], errs[i])
		}
		stored, err := dep.Node(0).Lookup(ctx, keys[i])
		if err != nil {
			dep.Close()
			t.Fatalf("Lookup %s: %v", keys[i], err)
		}
		expires[i] = stored.ExpiresAt
		from, to := began[i].Add(ttl-clockSlack), returned[i].Add(ttl+clockSlack)
		for where, at := range map[string]time.Time{"answer": held[i].Reservation.ExpiresAt, "Lookup": stored.ExpiresAt} {
			if at.Before(from) || at.After(to) {
				off = append(off, fmt.Sprintf("TTL %s: expires_at in the %s is %s after the call began (it returned after %s)",
					ttl, where, at.Sub(began[i]).Round(time.Millisecond), returned[i].Sub(began[i]).Round(time.Millisecond)))
			}
		}
	}
	if len(off) > 0 {
		// Fatal: the callers wait for these expires_at to pass, and one
		// hours away (a timestamp stored without its zone) would hang them.
		dep.Close()
		sort.Strings(off)
		t.Fatalf("%d expires_at are not the TTL asked for after the reservation was made: %s", len(off), strings.Join(off, "; "))
	}
	return dep, keys, expires
}

// checkExpiryTiming: ExpireDue moves exactly the HELD reservations whose
// expires_at had passed when it ran. Every other expiry scenario makes
// reservations due with Ager.MakeDue (just into the past) beside
// reservations a minute to hours ahead, so an expiry job that compares
// expires_at with now() plus a margin of a few seconds to a minute passes
// them all. Here reservations with TTLs from 250 ms to an hour are held at
// once and the job runs once, right after:
//
//   - one it expired whose expires_at was still ahead when it returned
//     (later than the server's clock read after the call, plus
//     earlySlack) was expired early;
//   - one still HELD whose expires_at had passed before the call began
//     (by more than clockSlack) was left behind;
//   - the units it reports are the reservations it moved.
//
// Neither judgement depends on how fast the machine is: a slow one only
// moves which TTLs fall on either side of now().
func checkExpiryTiming(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, keys := holdLadder(ctx, t, meta, db, rs, "due")
	defer dep.Close()
	expirer, ok := dep.Node(0).(strategy.Expirer)
	if !ok {
		t.Skip("no expiry job (strategy.Expirer)")
	}
	began := time.Now()
	units, err := expirer.ExpireDue(ctx)
	returned := time.Now()
	if err != nil {
		t.Fatalf("ExpireDue: %v", err)
	}
	after := serverNow(ctx, t, db)
	var early, late []string
	expired := 0
	for i, k := range keys {
		r, err := dep.Node(0).Lookup(ctx, k)
		if err != nil {
			t.Fatalf("Lookup %s: %v", k, err)
		}
		switch ahead := r.ExpiresAt.Sub(after); {
		case r.Status == strategy.StatusExpired:
			expired++
			if ahead > earlySlack {
				early = append(early, fmt.Sprintf("TTL %s: expires_at was %s ahead", expiryLadder[i], ahead.Round(time.Millisecond)))
			}
		case r.Status == strategy.StatusHeld && r.ExpiresAt.Before(began.Add(-clockSlack)):
			late = append(late, fmt.Sprintf("TTL %s: expires_at had passed %s before", expiryLadder[i], began.Sub(r.ExpiresAt).Round(time.Millisecond)))
		case r.Status != strategy.StatusHeld:
			t.Errorf("TTL %s: status %s after ExpireDue; want HELD or EXPIRED", expiryLadder[i], r.Status)
		}
	}
	if len(early) > 0 {
		t.Errorf("ExpireDue expired %d reservations before their expires_at (it returned %s after it was called): %s", len(early), returned.Sub(began).Round(time.Millisecond), strings.Join(early, "; "))
	}
	if len(late) > 0 {
		t.Errorf("ExpireDue left %d due reservations HELD: %s", len(late), strings.Join(late, "; "))
	}
	if units != expired {
		t.Errorf("ExpireDue reported %d units; it moved %d reservations to EXPIRED", units, expired)
	}
}

// checkConfirmTiming: ConfirmBeforeExpiry confirms a HELD reservation
// exactly while its expires_at has not passed. The other scenarios confirm
// reservations minutes ahead or made due just into the past, so a confirm
// that compares with now() plus a margin passes them (one minus a margin
// is ctl-confirm-late's mistake, which confirm-vs-expire catches). Here
// each reservation of the ladder is confirmed once, shortest TTL first,
// and each call is judged on its own: one whose expires_at was still ahead
// when the call returned must move, one whose expires_at had passed before
// it began must not.
func checkConfirmTiming(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, keys := holdLadder(ctx, t, meta, db, rs, "cnf")
	defer dep.Close()
	confirmer, ok := dep.Node(0).(strategy.Confirmer)
	if !ok {
		t.Skip("no Confirm (strategy.Confirmer)")
	}
	var refused, late []string
	for i, k := range keys {
		before, err := dep.Node(0).Lookup(ctx, k)
		if err != nil {
			t.Fatalf("Lookup %s: %v", k, err)
		}
		began := time.Now()
		moved, err := confirmer.Confirm(ctx, k, strategy.ConfirmBeforeExpiry)
		if err != nil {
			t.Fatalf("Confirm (TTL %s): %v", expiryLadder[i], err)
		}
		after := serverNow(ctx, t, db)
		switch {
		case !moved && before.ExpiresAt.Sub(after) > earlySlack:
			refused = append(refused, fmt.Sprintf("TTL %s: expires_at was %s ahead", expiryLadder[i], before.ExpiresAt.Sub(after).Round(time.Microsecond)))
		case moved && began.Sub(before.ExpiresAt) > clockSlack:
			late = append(late, fmt.Sprintf("TTL %s: expires_at had passed %s before", expiryLadder[i], began.Sub(before.ExpiresAt).Round(time.Millisecond)))
		}
		want := strategy.StatusHeld
		if moved {
			want = strategy.StatusConfirmed
		}
		if after, err := dep.Node(0).Lookup(ctx, k); err != nil || after.Status != want {
			t.Errorf("TTL %s: Confirm said moved=%v, then Lookup says %s, %v; want %s", expiryLadder[i], moved, after.Status, err, want)
		}
	}
	if len(refused) > 0 {
		t.Errorf("ConfirmBeforeExpiry refused %d reservations before their expires_at: %s", len(refused), strings.Join(refused, "; "))
	}
	if len(late) > 0 {
		t.Errorf("ConfirmBeforeExpiry confirmed %d reservations after their expires_at: %s", len(late), strings.Join(late, "; "))
	}
}
