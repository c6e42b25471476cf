package strategytest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkDueHoldsItsUnit: a HELD reservation whose expires_at has passed
// keeps its unit until a transition moves it. ConfirmUntilExpired confirms
// such a reservation (the late payment of C28-08), so a strategy that sells
// its unit first, counting due rows as free without moving them, sells one
// unit twice. A strategy may expire due rows itself before it sells (lazy
// expiry), as long as it moves them: then the late confirm finds them
// EXPIRED. The scenarios always run the expiry job before they sell again;
// here one reservation is made due, the SKU is sold out around it, and
// only then does the late payment arrive.
//
// Three more ways to forget the due row are driven here: its request is
// sent again (REPLAY, still HELD), its own user asks
// for the SKU again under a new key while a unit is free (the row still
// counts against its user: a limit that skips due rows gives the user a
// second hold, and the late payment then leaves two active), and, where
// survives-restart is claimed, node 0 restarts while the row is due (a
// recount that skips due rows sells its unit again).
func checkDueHoldsItsUnit(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "due-holds", 2)
	defer dep.Close()
	ager, ok := dep.(strategy.Ager)
	if !ok {
		t.Skip("no MakeDue (strategy.Ager): a due reservation cannot be made without waiting for its TTL")
	}
	node := dep.Node(0)
	req := func(i int) strategy.Request {
		return strategy.Request{Key: fmt.Sprintf("kit-due-holds-%d-%s", i, sku), User: fmt.Sprintf("kit-due-holds-%d", i), SKU: sku, TTL: time.Hour}
	}
	if res, err := reserveUnlessBusy(ctx, node, req(1)); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("Reserve 1 of 2 units: %s, %v; want HELD", res.Outcome, err)
	}
	if n, err := ager.MakeDue(ctx, []string{req(1).Key}); err != nil || n != 1 {
		t.Fatalf("MakeDue: %d, %v; want 1", n, err)
	}
	// The request sent again is REPLAY of what Lookup reads: HELD, its
	// unit still its own, however late (a replay that reports a due row
	// EXPIRED tells the client its hold is gone while the row still holds
	// the unit, counts against its user and takes the late payment).
	if res, err := reserveUnlessBusy(ctx, node, req(1)); err != nil || res.Outcome != strategy.OutcomeReplay || res.Reservation.Status != strategy.StatusHeld {
		t.Errorf("reservation 1's request sent again while it is due and unmoved: %s with status %s, %v; want REPLAY with status HELD (as Lookup reads it until a transition moves it)", res.Outcome, res.Reservation.Status, err)
	}
	if r, err := node.Lookup(ctx, req(1).Key); err != nil || r.Status != strategy.StatusHeld {
		t.Errorf("Lookup of reservation 1 while it is due and unmoved: %s, %v; want HELD", r.Status, err)
	}
	again := req(1)
	again.Key = "kit-due-holds-again-" + sku
	if res, err := reserveUnlessBusy(ctx, node, again); err != nil || res.Outcome != strategy.OutcomeUserLimit {
		t.Errorf("reservation 1's user asks again under a new key while reservation 1 is due and unmoved, 1 of 2 units free: %s, %v; want USER_LIMIT (a due reservation is its user's until a transition moves it)", res.Outcome, err)
	}
	if r, ok := dep.(strategy.Restarter); ok && meta.Claims.Has(strategy.SurvivesRestart) {
		if err := r.Restart(ctx, 0); err != nil {
			t.Fatalf("Restart of node 0 while reservation 1 is due: %v", err)
		}
		node = dep.Node(0)
	}
	answers := ""
	for i := 2; i <= 3; i++ {
		res, err := reserveUnlessBusy(ctx, node, req(i))
		if err != nil {
			t.Fatalf("Reserve %d while reservation 1 is due and unmoved: %v", i, err)
		}
		answers += fmt.Sprintf(" %s", res.Outcome)
	}
	audit := func(when string) {
		t.Helper()
		list, err := dep.Audit(ctx)
		if err != nil || len(list) != 1 {
			t.Fatalf("Audit %s: %+v, %v", when, list, err)
		}
		if a := list[0]; a.Active > a.Total || a.Available < 0 || a.Drift() != 0 {
			t.Errorf("%s: audit %+v (2 more requests answered%s after reservation 1 of 2 units fell due): a due HELD reservation holds its unit until a transition moves it",
				when, a, answers)
		}
	}
	audit("after selling around a due reservation")
	if c, ok := node.(strategy.Confirmer); ok {
		before, err := node.Lookup(ctx, req(1).Key)
		if err != nil {
			t.Fatalf("Lookup of the due reservation: %v", err)
		}
		moved, err := c.Confirm(ctx, req(1).Key, strategy.ConfirmUntilExpired)
		if err != nil {
			t.Fatalf("Confirm (until expired) of the due reservation: %v", err)
		}
		// Nothing else runs: a reservation Lookup read HELD is one no
		// expiry has moved, and the late payment confirms it, however late
		// (MakeDue put it 400 days past; a strategy that expired it lazily
		// while selling reads EXPIRED here, and refuses rightly).
		if before.Status == strategy.StatusHeld && !moved {
			t.Errorf("Confirm (until expired) of a due reservation that Lookup read HELD just before: not moved; want it confirmed (ConfirmUntilExpired confirms a reservation past expires_at as long as no expiry has moved it)")
		}
		audit(fmt.Sprintf("after its late payment (confirm moved %v)", moved))
	}
	if e, ok := node.(strategy.Expirer); ok {
		if _, err := e.ExpireDue(ctx); err != nil {
			t.Fatalf("ExpireDue: %v", err)
		}
		audit("after the expiry job")
	}
}

// dueAtOnce is how many reservations checkExpireAllDue makes due at once:
// more than the batch sizes a job that works in batches would pick (100,
// 500, 1000), and more than a few such batches a run (outsider rounds 18
// and 19 capped a run at 5 and at 3 batches of 1,000, and both passed the
// 1,400 of before), over more SKUs (dueOneUnitSKUs of them with one unit,
// dueHundredSKUs with 100) than a job that bounds the SKUs of a run would
// take (16, 32, 64, 256). The hundreds spread the extra rows over SKUs, and
// the requests go out round-robin over the SKUs (dueOrder), so a strategy
// that serialises a SKU's requests makes them side by side: sent SKU by
// SKU, 5,400 took redislock past 2 minutes under the race detector.
const (
	dueAtOnce      = 6000
	dueOneUnitSKUs = 300
	dueHundredSKUs = 46
)

// dueOrder is the order in which checkExpireAllDue sends its requests, as
// indexes into skuOf (the SKU of each, grouped SKU by SKU): round-robin
// over the SKUs, the n-th request of every SKU before the (n+1)-th of any,
// so the requests in flight together are for different SKUs.
func dueOrder(skuOf []string) []int {
	var groups [][]int
	for i, sku := range skuOf {
		if i == 0 || sku != skuOf[i-1] {
			groups = append(groups, nil)
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], i)
	}
	order := make([]int, 0, len(skuOf))
	for n := 0; len(order) < len(skuOf); n++ {
		for _, g := range groups {
			if n < len(g) {
				order = append(order, g[n])
			}
		}
	}
	return order
}

// checkExpireAllDue: one ExpireDue moves every due HELD reservation of the
// deployment, however many there are and over however many SKUs. A job
// that moves a batch (LIMIT 1000), or the due rows of a bounded number of
// SKUs ("a run locks no more than 32 stock rows"), and returns leaves the
// rest HELD past their expires_at, holding units nobody can buy, until a
// later run that the contract does not promise; no scenario has more than
// a few hundred reservations due at once, over a few SKUs.
//
// Most of them are on one SKU (1,004 of its 1,004 units), and a strategy
// that claims to survive restarts restarts node 0 before the job runs: a
// restarted node that recounts only a bounded number of active
// reservations (a script's arguments kept below 1,000) sells the SKU again,
// and no other scenario restarts with more than a few dozen active.
//
// The last unit of that SKU goes last, to an attempt held open where the
// strategy has them, while a plain request for it waits or is refused
// (plainBesideHeldSession): the only race the kit runs at the end of a SKU
// of more than a few units (outsider round 49's m19 took no lock on SKUs
// of 1,000 units or more, "nobody races for the last of a thousand").
func checkExpireAllDue(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	counts := []int{dueAtOnce - 3*32 - 100*dueHundredSKUs - dueOneUnitSKUs, 32, 32, 32} // per SKU, summing to dueAtOnce
	for range dueHundredSKUs {
		counts = append(counts, 100)
	}
	for range dueOneUnitSKUs {
		counts = append(counts, 1)
	}
	base := kitSKU("due-all")
	var stock []strategy.Stock
	var skuOf []string // the SKU of each reservation
	for i, n := range counts {
		stock = append(stock, strategy.Stock{SKU: fmt.Sprintf("%s-%d", base, i), Total: n})
		for range n {
			skuOf = append(skuOf, stock[i].SKU)
		}
	}
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: stock})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	ager, isAger := dep.(strategy.Ager)
	_, isExpirer := dep.Node(0).(strategy.Expirer)
	if !isAger || !isExpirer {
		t.Skip("no expiry job with MakeDue (strategy.Expirer, strategy.Ager)")
	}
	keys := make([]string, dueAtOnce)
	var (
		mu    sync.Mutex
		wrong []string
	)
	// 16 at a time, an error sent again: the check is about the job, not
	// about contention (ssicount, at SERIALIZABLE, gave up on 5 of 1,100
	// after 64 attempts each when errors were final).
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	var box panicBox
	reqOf := func(i int) strategy.Request {
		keys[i] = fmt.Sprintf("kit-due-all-%04d-%s", i, base)
		return strategy.Request{Key: keys[i], User: fmt.Sprintf("kit-due-all-%04d", i), SKU: skuOf[i], TTL: time.Hour}
	}
	lastOfBig := counts[0] - 1 // skuOf is grouped SKU by SKU, the big one first
	for _, i := range dueOrder(skuOf) {
		if i == lastOfBig {
			continue
		}
		req := reqOf(i)
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			defer box.catch()
			if res, err := reserveUntilAnswered(ctx, dep.Node(0), req); err != nil || res.Outcome != strategy.OutcomeHeld {
				mu.Lock()
				wrong = append(wrong, fmt.Sprintf("%s: %s, %v", req.Key, res.Outcome, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	box.rethrow()
	if len(wrong) > 0 {
		t.Fatalf("%d of %d reservations on %d units not HELD: %s", len(wrong), dueAtOnce, dueAtOnce, sample(wrong))
	}
	last := reqOf(lastOfBig)
	if opener, ok := dep.Node(0).(strategy.SessionOpener); ok {
		s, backends := holdInSession(ctx, t, opener, last, fmt.Sprintf("Session.Reserve of the last unit of %s (%d units)", last.SKU, counts[0]))
		defer func() { _ = s.Rollback(ctx) }()
		plainBesideHeldSession(ctx, t, admin, dep, s, backends, dep.Node(0), strategy.Request{Key: "kit-due-all-plain-" + base, User: "kit-due-all-plain", SKU: last.SKU, TTL: time.Hour},
			fmt.Sprintf("an attempt held open on the last unit of a SKU of %d", counts[0]))
	} else if res, err := reserveUntilAnswered(ctx, dep.Node(0), last); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("the last reservation of %s: %s, %v; want HELD", last.SKU, res.Outcome, err)
	}
	if r, ok := dep.(strategy.Restarter); ok && meta.Claims.Has(strategy.SurvivesRestart) {
		if err := r.Restart(ctx, 0); err != nil {
			t.Fatalf("Restart of node 0 with %d reservations active: %v", dueAtOnce, err)
		}
		for _, st := range stock {
			req := strategy.Request{Key: "kit-due-all-more-" + st.SKU, User: "kit-due-all-more", SKU: st.SKU, TTL: time.Hour}
			if res, err := reserveUnlessBusy(ctx, dep.Node(0), req); err != nil || res.Outcome == strategy.OutcomeHeld {
				t.Errorf("a request after node 0 restarted, with all %d units of %s reserved: %s, %v; want SOLD_OUT (a restart that recounts part of the active reservations sells them again)", st.Total, st.SKU, res.Outcome, err)
			}
		}
	}
	if n, err := ager.MakeDue(ctx, keys); err != nil || n != dueAtOnce {
		t.Fatalf("MakeDue of %d reservations: %d, %v", dueAtOnce, n, err)
	}
	units, err := dep.Node(0).(strategy.Expirer).ExpireDue(ctx) // node 0 as it is now: restarted, perhaps
	if err != nil {
		t.Fatalf("ExpireDue: %v", err)
	}
	list, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	active := 0
	for _, a := range list {
		active += a.Active
	}
	if units != dueAtOnce || active != 0 {
		t.Errorf("one ExpireDue with %d reservations due: %d units given back, %d reservations still active; want %d and 0 (a job may not stop at a batch)",
			dueAtOnce, units, active, dueAtOnce)
	}
}

// checkDueReleases: a HELD reservation whose expires_at has passed, and
// that no transition has moved yet, is still its holder's to give back:
// Release returns its unit and moves it out of HELD, and a late payment
// (ConfirmUntilExpired, which would confirm it had it stayed HELD) then
// finds nothing to confirm. A Release that refuses due rows ("expired")
// leaves a hold its client cancelled to be confirmed and charged, and the
// unit back only when the job runs; every scenario's releases come before
// their rows fall due, and the timing checks try only the job and Confirm.
func checkDueReleases(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "due-release", 2)
	defer dep.Close()
	ager, ok := dep.(strategy.Ager)
	if !ok {
		t.Skip("no MakeDue (strategy.Ager): a due reservation cannot be made without waiting for its TTL")
	}
	node := dep.Node(0)
	releaser, ok := node.(strategy.Releaser)
	if !ok {
		t.Skip("no Release (strategy.Releaser)")
	}
	key := "kit-due-release-" + sku
	if res, err := reserveUnlessBusy(ctx, node, strategy.Request{Key: key, User: "kit-due-release", SKU: sku, TTL: time.Hour}); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("Reserve: %s, %v; want HELD", res.Outcome, err)
	}
	if n, err := ager.MakeDue(ctx, []string{key}); err != nil || n != 1 {
		t.Fatalf("MakeDue: %d, %v; want 1", n, err)
	}
	units, err := releaser.Release(ctx, key)
	if err != nil {
		t.Fatalf("Release of the due, unmoved reservation: %v", err)
	}
	after, err := node.Lookup(ctx, key)
	if err != nil {
		t.Fatalf("Lookup after Release: %v", err)
	}
	if units != 1 || after.Status == strategy.StatusHeld || after.Status == strategy.StatusConfirmed {
		t.Errorf("Release of a HELD reservation past its expires_at, before any transition moved it: %d units, status %s; want 1 unit and the row out of HELD", units, after.Status)
	}
	if c, ok := node.(strategy.Confirmer); ok {
		moved, err := c.Confirm(ctx, key, strategy.ConfirmUntilExpired)
		if err != nil {
			t.Fatalf("Confirm (until expired) after the release: %v", err)
		}
		if moved {
			t.Errorf("ConfirmUntilExpired confirmed a reservation its holder had released (Release returned %d units)", units)
		}
	}
	if e, ok := node.(strategy.Expirer); ok {
		if _, err := e.ExpireDue(ctx); err != nil {
			t.Fatalf("ExpireDue: %v", err)
		}
	}
	list, err := dep.Audit(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("Audit: %+v, %v", list, err)
	}
	if a := list[0]; a.Active != 0 || a.Available != a.Total || a.Drift() != 0 {
		t.Errorf("audit after releasing the due reservation and running the expiry job: %+v; want every unit available", a)
	}
}

// checkMakeDueFarBack: MakeDue does what strategy.Ager says: the HELD
// reservations it moves stay HELD, with expires_at 400 days in the past.
// The kit leans on that distance: a job or a late payment that looks back
// only over a window ("due in the last 6 hours") is caught because
// MakeDue's rows are older than any window; a MakeDue that moved them 400
// seconds back passed every check (outsider round 33's m9), and with it
// such a job would pass too. A day's margin allows for the clocks.

func checkMakeDueFarBack(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "due-far", 2)
	defer dep.Close()
	ager, ok := dep.(strategy.Ager)
	if !ok {
		t.Skip("no MakeDue (strategy.Ager)")
	}
	node := dep.Node(0)
	keys := []string{"kit-due-far-1-" + sku, "kit-due-far-2-" + sku}
	for i, key := range keys {
		req := strategy.Request{Key: key, User: fmt.Sprintf("kit-due-far-%d", i+1), SKU: sku, TTL: time.Hour}
		if res, err := reserveUnlessBusy(ctx, node, req); err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Fatalf("Reserve %s: %s, %v; want HELD", key, res.Outcome, err)
		}
	}
	if n, err := ager.MakeDue(ctx, keys); err != nil || n != len(keys) {
		t.Fatalf("MakeDue of %d HELD reservations: %d, %v", len(keys), n, err)
	}
	latest := time.Now().Add(-399 * 24 * time.Hour)
	for _, key := range keys {
		r, err := node.Lookup(ctx, key)
		if err != nil {
			t.Fatalf("Lookup %s after MakeDue: %v", key, err)
		}
		if r.Status != strategy.StatusHeld || r.ExpiresAt.After(latest) {
			t.Errorf("%s after MakeDue: %s, expires_at %s ago; want HELD, 400 days ago (strategy.Ager: so far back that a job looking back over a window misses it)",
				key, r.Status, time.Since(r.ExpiresAt).Round(time.Second))
		}
	}
}

// checkExpirerAges: a deployment whose nodes run an expiry job
// (strategy.Expirer) offers MakeDue (strategy.Ager). Without it every
// check of the job with a due row (a job run twice at once, a Release or a
// late Confirm after the job, a job over several SKUs) is skipped, and
// strategies written from scratch with such a job and no Ager passed the
// kit with each of those mistakes (outsider round 42: four of four).
func checkExpirerAges(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, _ := openOneSKU(ctx, t, meta, db, rs, "expirer-ages", 1)
	defer dep.Close()
	if _, expires := dep.Node(0).(strategy.Expirer); !expires {
		t.Skip("no expiry job (strategy.Expirer)")
	}
	if _, ok := dep.(strategy.Ager); !ok {
		t.Errorf("the nodes run an expiry job (strategy.Expirer) and the deployment offers no MakeDue (strategy.Ager): the kit cannot make a reservation due, so none of its checks of the job with due rows can run; implement strategy.Ager")
	}
}
