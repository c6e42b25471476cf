package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// conflictBehind: a request whose insert waits behind an attempt held open
// that then commits the row it conflicts with. The statement that waited
// took its snapshot before that row existed, so whatever it read then
// says the request is new; only the insert meets the row (ON CONFLICT DO
// NOTHING drops it, or a unique violation ends it). A strategy that takes
// its unit by what it read, not by the row it inserted (a batch that
// takes as many units as rows it tried, a decrement not tied to the
// insert's RETURNING, a unique violation answered without rolling back the
// decrement), loses a unit for good. The duplicate-key scenario meets this
// only when two requests happen to overlap; here every case is made to
// wait (seen in pg_blocking_pids) before the attempt commits. For a
// strategy without attempts held open, the attempt is a plain request
// held at its COMMIT, its writes done (outsider round 28b: the check was
// skipped for strategies without sessions).
//
// run does the four cases one after the other, each on SKUs of its own,
// and judges the answers (the contract); audit then judges the stock
// (conserves).
type conflictBehind struct {
	audited laterVerdict
}

// conflictCase is one case of conflictBehind: held is the attempt's
// reservation, sent the request that waits behind it.
type conflictCase struct {
	name       string
	held, sent strategy.Request
	want       strategy.Outcome
	// batched: sent goes with a companion request for its SKU, both
	// queued while an earlier request for the SKU waits behind a second
	// attempt on the SKU's stock; a node that batches serves the two
	// together, so that the batch inserts one row and drops the other.
	batched bool
}

func (c *conflictBehind) run(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const total = 4
	var cases []conflictCase
	var stock []strategy.Stock
	req := func(key, user, sku string) strategy.Request {
		return strategy.Request{Key: "kit-behind-" + key, User: "kit-behind-" + user, SKU: sku, TTL: time.Hour}
	}
	for _, k := range []struct {
		name                string
		otherSKU, otherUser bool
		sameKey             bool
		want                strategy.Outcome
		batched             bool
	}{
		{"its key, for another SKU", true, false, true, strategy.OutcomeKeyReused, false},
		{"its own twin (the same key, user and SKU)", false, false, true, strategy.OutcomeReplay, false},
		{"its user's reservation of the SKU under another key", false, false, false, strategy.OutcomeUserLimit, false},
		{"its key, by another user", false, true, true, strategy.OutcomeKeyReused, false},
		{"its key, for another SKU, beside another request for that SKU", true, false, true, strategy.OutcomeKeyReused, true},
	} {
		sku := kitSKU(fmt.Sprintf("behind-%d", len(cases)))
		sentSKU := sku
		stock = append(stock, strategy.Stock{SKU: sku, Total: total})
		if k.otherSKU {
			sentSKU = kitSKU(fmt.Sprintf("behind-%d-other", len(cases)))
			stock = append(stock, strategy.Stock{SKU: sentSKU, Total: total})
		}
		held := req(sku, "u-"+sku, sku)
		sent := req(sku, "u-"+sku, sentSKU)
		if !k.sameKey {
			sent.Key = req("other-"+sku, "", "").Key
		}
		if k.otherUser {
			sent.User = req("", "v-"+sku, "").User
		}
		cases = append(cases, conflictCase{name: k.name, held: held, sent: sent, want: k.want, batched: k.batched})
	}
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: stock})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	// Without attempts held open, the attempt is a plain request held at
	// its COMMIT (holdAttempt); the batched case, which holds two, needs
	// sessions.
	opener, _ := dep.Node(0).(strategy.SessionOpener)
	heldByRequest, elsewhere := map[string]int{}, false
	for i, cs := range cases {
		if i > 1 && elsewhere {
			break
		}
		if cs.batched && opener == nil {
			continue
		}
		answers := conflictBehindOne(ctx, t, dep, opener, admin, cs)
		// The twin (the second case) comes for the SKU the attempt holds:
		// answered BUSY without waiting in PostgreSQL, it queued for the
		// SKU elsewhere (redislock: the SKU's Redis lock), and the cases
		// after it, on a SKU held the same way, would each wait out that
		// queue's bound as well.
		elsewhere = i == 1 && answers[0].err == nil && answers[0].res.Outcome == strategy.OutcomeBusy
		for _, a := range answers {
			if a.err == nil && a.res.Outcome == strategy.OutcomeHeld {
				heldByRequest[a.res.Reservation.SKU]++
			}
		}
	}
	c.audited.ran = true
	list, err := dep.Audit(ctx)
	if err != nil {
		c.audited.failf("Audit: %v", err)
		return
	}
	for _, st := range list {
		want := heldByRequest[st.SKU]
		if st.Drift() != 0 || st.Active != want {
			c.audited.failf("audit of %s: total %d, available %d, active %d; want %d active and drift 0 (a request that met a committed conflict took a unit it did not keep)",
				st.SKU, st.Total, st.Available, st.Active, want)
		}
	}
}

// conflictBehindOne runs one case: the attempt holds cs.held, cs.sent goes
// to node 0 and waits behind it, then the attempt commits. It judges the
// answer of a request that waited and returns every answer of the case
// (the companions' too), and a HELD one for each attempt that committed: one given without waiting in PostgreSQL (a
// strategy that serialises elsewhere, or refuses at once) is left to the
// audit, as are errors and BUSY.
func conflictBehindOne(ctx context.Context, t tester, dep strategy.Deployment, opener strategy.SessionOpener, admin *pgxpool.Pool, cs conflictCase) []answer {
	t.Helper()
	session, holder := holdAttempt(ctx, t, opener, dep.Node(0), admin, cs.held, "attempt held open: "+cs.name)
	defer func() { _ = session.Rollback(ctx) }()
	var box panicBox
	defer box.rethrow()
	var others []chan answer
	var sent chan answer
	if cs.batched {
		// A second attempt holds a unit of the SKU; a first request waits
		// behind it (a node that batches: its batch waits for the stock
		// row); sent and a companion come while it waits, so a node that
		// batches serves them together next.
		other := func(name string) strategy.Request {
			return strategy.Request{Key: cs.sent.Key + "-" + name, User: cs.sent.User + "-" + name, SKU: cs.sent.SKU, TTL: time.Hour}
		}
		stockHolder, stockPIDs := holdInSession(ctx, t, opener, other("stock"), "attempt held open on the stock: "+cs.name)
		defer func() { _ = stockHolder.Rollback(ctx) }()
		node := dep.Node(0)
		first := reserveAsync(ctx, &box, node, other("first"))
		firstWaits, err := awaitAnswerOrBlockedWithin(ctx, admin, stockPIDs, first, besideWithin)
		if err != nil {
			t.Fatalf("a request behind the attempt on the stock: %v", err)
		}
		sent = reserveAsync(ctx, &box, node, cs.sent)
		companion := reserveAsync(ctx, &box, node, other("companion"))
		if firstWaits {
			if err := awaitQueued(ctx, node, cs.sent.SKU, 2, sent, companion); err != nil {
				t.Fatalf("the request and its companion behind the batch that waits for the stock: %v", err)
			}
		}
		others = append(others, first, companion)
		switch err := stockHolder.Commit(ctx); {
		case err == nil:
			committed := make(chan answer, 1)
			committed <- answer{res: strategy.Result{Outcome: strategy.OutcomeHeld, Reservation: strategy.Reservation{SKU: cs.sent.SKU}}}
			others = append(others, committed)
		case !abortedByConflict(err): // at SERIALIZABLE an attempt may be refused at Commit
			t.Fatalf("Commit of the attempt on the stock: %v", err)
		}
	} else {
		sent = reserveAsync(ctx, &box, dep.Node(0), cs.sent)
	}
	blocked, err := awaitAnswerOrBlockedWithin(ctx, admin, holder, sent, besideWithin)
	if err != nil {
		t.Fatalf("a request behind %s: %v", cs.name, err)
	}
	cerr := session.Commit(ctx)
	if cerr != nil && !abortedByConflict(cerr) {
		t.Fatalf("Commit of the attempt holding %s: %v", cs.name, cerr)
	}
	a := <-sent
	out := []answer{a}
	for _, o := range others {
		out = append(out, <-o)
	}
	if cerr == nil {
		out = append(out, answer{res: strategy.Result{Outcome: strategy.OutcomeHeld, Reservation: strategy.Reservation{SKU: cs.held.SKU}}})
	}
	// Refused at Commit (at SERIALIZABLE, for the sake of the requests
	// behind it), the attempt left nothing to conflict with.
	if cerr != nil || !blocked || a.err != nil || a.res.Outcome == strategy.OutcomeBusy {
		return out // an unknown outcome or a refusal that wrote nothing: the audit judges it
	}
	r := a.res.Reservation
	switch {
	case a.res.Outcome != cs.want:
		t.Errorf("a request that waited behind %s, which then committed: %s, want %s", cs.name, a.res.Outcome, cs.want)
	case cs.want == strategy.OutcomeKeyReused && (r.User != cs.held.User || r.SKU != cs.held.SKU):
		t.Errorf("a request that waited behind %s: KEY_REUSED carrying %s/%s, want the key's owner %s/%s", cs.name, r.User, r.SKU, cs.held.User, cs.held.SKU)
	case cs.want == strategy.OutcomeReplay && (r.Status != strategy.StatusHeld || r.SKU != cs.held.SKU || r.User != cs.held.User):
		t.Errorf("a request that waited behind %s: REPLAY of %s/%s %s, want the committed HELD reservation", cs.name, r.User, r.SKU, r.Status)
	}
	return out
}

// audit reports what run found in the stock.
func (c *conflictBehind) audit(t tester) {
	t.Helper()
	c.audited.judge(t, "the requests behind a conflict that commits did not run")
}
