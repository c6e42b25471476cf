package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// perSKUStock is the stock checkUnitsPerSKU deploys: three SKUs of
// different sizes, so a unit that lands on the wrong one shows in both.
var perSKUStock = []struct {
	suffix string
	total  int
	// release, expire and confirm are how many of the SKU's reservations
	// each transition moves; each SKU gets a different mix.
	release, expire, confirm int
}{
	{"-a", 3, 1, 0, 0},
	{"-b", 4, 0, 2, 1},
	{"-c", 5, 1, 1, 1},
}

// busyTries bounds how often a contract check sends a BUSY request again:
// nothing else runs on its SKUs, so a BUSY there is rare and short.
const busyTries = 20

// checkUnitsPerSKU: every transition gives its unit back to the SKU it was
// sold from. Every scenario that releases or expires reservations runs on
// one SKU, where a unit given back to the wrong SKU of the deployment, or
// to all of them (sku = ANY of the deployment's SKUs where the moved row's
// SKU was meant), lands on the one SKU there is. Here a deployment of three
// SKUs on two nodes sells every unit of each; then each SKU has some of its
// reservations released, some made due and expired, some confirmed, as far
// as the strategy has those transitions, each SKU a different mix. Per SKU,
// the audit must then count exactly the units freed as available, and
// asking every node for more must sell exactly those units again. Each
// confirmed reservation is confirmed a second time on the way, which must
// move nothing.
func checkUnitsPerSKU(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const nodes = 2
	base := kitSKU("per")
	var stock []strategy.Stock
	for _, s := range perSKUStock {
		stock = append(stock, strategy.Stock{SKU: base + s.suffix, Total: s.total})
	}
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Nodes: nodes, Stock: stock})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	node := dep.Node(0)
	releaser, canRelease := node.(strategy.Releaser)
	expirer, canExpire := node.(strategy.Expirer)
	ager, canAge := dep.(strategy.Ager)
	canExpire = canExpire && canAge
	confirmer, canConfirm := node.(strategy.Confirmer)
	if !canRelease && !canExpire {
		t.Skip("no Release and no expiry job with MakeDue: no transition gives a unit back")
	}

	sold := &seller{t: t, dep: dep, nodes: nodes, prefix: "kit-per"}
	sell := func(sku string, bound int) []string { return keysOf(sold.sellOut(ctx, sku, bound)) }

	// First a cart of one unit of each SKU, held open on node 1 and rolled
	// back: each unit goes back to its own SKU (outsider round 52's m14, a
	// memquota whose rollback put every unit of a cart back on its first
	// line's SKU, passed every scenario: none rolled back a cart of two
	// SKUs).
	if opener, ok := dep.Node(1).(strategy.SessionOpener); ok {
		rollBackCart(ctx, t, opener, stock)
	}
	// Every SKU sells out before any unit comes back, so a unit given back
	// to the wrong SKU is a unit that SKU never lost.
	held := make([][]string, len(perSKUStock))
	for i, s := range perSKUStock {
		if held[i] = sell(stock[i].SKU, s.total); len(held[i]) != s.total {
			t.Fatalf("%s: %d of its %d units sold to requests on every node, after a cart of one unit of each SKU was rolled back; want all", s.suffix, len(held[i]), s.total)
		}
	}
	freed := map[string]int{}
	var due []string
	for i, s := range perSKUStock {
		sku, held := stock[i].SKU, held[i]
		next := 0
		take := func(n int) []string { ks := held[next : next+n]; next += n; return ks }
		if canRelease {
			for _, k := range take(s.release) {
				units, err := releaser.Release(ctx, k)
				if err != nil || units != 1 {
					t.Fatalf("Release of a HELD reservation of %s: %d units, %v; want 1", s.suffix, units, err)
				}
				freed[sku]++
			}
		}
		if canExpire {
			ks := take(s.expire)
			due = append(due, ks...)
			freed[sku] += len(ks)
		}
		if canConfirm {
			for _, k := range take(s.confirm) {
				if moved, err := confirmer.Confirm(ctx, k, strategy.ConfirmBeforeExpiry); err != nil || !moved {
					t.Fatalf("Confirm of a HELD reservation of %s: %v, %v; want moved", s.suffix, moved, err)
				}
				// A payment callback delivered twice moves the row once.
				if moved, err := confirmer.Confirm(ctx, k, strategy.ConfirmUntilExpired); err != nil || moved {
					t.Errorf("Confirm of a CONFIRMED reservation of %s: moved %v, %v; want false, nil", s.suffix, moved, err)
				}
			}
		}
	}
	if len(due) > 0 {
		if n, err := ager.MakeDue(ctx, due); err != nil || n != len(due) {
			t.Fatalf("MakeDue of %d HELD reservations: %d, %v", len(due), n, err)
		}
		units, err := expirer.ExpireDue(ctx)
		if err != nil {
			t.Fatalf("ExpireDue: %v", err)
		}
		if units != len(due) {
			t.Errorf("ExpireDue gave back %d units; %d reservations were due", units, len(due))
		}
	}

	audit, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	bySKU := map[string]strategy.StockAudit{}
	for _, a := range audit {
		bySKU[a.SKU] = a
	}
	for i, s := range perSKUStock {
		sku := stock[i].SKU
		want := strategy.StockAudit{SKU: sku, Total: s.total, Available: freed[sku], Active: s.total - freed[sku]}
		if got := bySKU[sku]; got.Total != want.Total || got.Available != want.Available || got.Active != want.Active {
			t.Errorf("%s after its transitions: audit total %d, available %d, active %d; want %d, %d, %d (each unit back on the SKU it was sold from)",
				s.suffix, got.Total, got.Available, got.Active, want.Total, want.Available, want.Active)
		}
	}
	// Where a restart loses nothing, every node restarts first: its recount
	// must free what the transitions freed, no more, no less (outsider
	// round 52's m03, a memquota-recover whose recount counted EXPIRED
	// rows as held, passed every scenario: none restarted a node after its
	// job had expired a row).
	restarted := ""
	if r, ok := dep.(strategy.Restarter); ok && meta.Claims.Has(strategy.SurvivesRestart) {
		for i := 0; i < nodes; i++ {
			if err := r.Restart(ctx, i); err != nil {
				t.Fatalf("Restart(%d): %v", i, err)
			}
		}
		restarted = " (every node restarted first)"
	}
	for i, s := range perSKUStock {
		sku := stock[i].SKU
		if again := sell(sku, s.total); len(again) != freed[sku] {
			t.Errorf("%s: %d units sold again after its transitions freed %d%s", s.suffix, len(again), freed[sku], restarted)
		}
	}
}

// checkTransitionMovesOneKey: Confirm and Release move the reservation of
// their key and nothing else. Every scenario gives each user one
// reservation, so a transition that moves every HELD reservation of the
// key's user ("pay for the cart") passes them all. Here one user holds a
// unit of each of two SKUs and another user one of the first: confirming
// the first user's reservation of SKU a must leave the other two HELD,
// releasing its reservation of SKU b must return that unit only, and every
// key is then looked up on both nodes.
func checkTransitionMovesOneKey(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const nodes = 2
	base := kitSKU("one-key")
	skuA, skuB := base+"-a", base+"-b"
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Nodes: nodes, Stock: []strategy.Stock{{SKU: skuA, Total: 4}, {SKU: skuB, Total: 4}}}) // 2 a node where nodes split it
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	node := dep.Node(0)
	confirmer, canConfirm := node.(strategy.Confirmer)
	releaser, canRelease := node.(strategy.Releaser)
	if !canConfirm && !canRelease {
		t.Skip("no Confirm and no Release: no transition of one key")
	}
	reqs := []strategy.Request{
		{Key: "kit-one-key-u-a-" + base, User: "kit-one-key-u", SKU: skuA, TTL: time.Hour},
		{Key: "kit-one-key-u-b-" + base, User: "kit-one-key-u", SKU: skuB, TTL: time.Hour},
		{Key: "kit-one-key-v-a-" + base, User: "kit-one-key-v", SKU: skuA, TTL: time.Hour},
	}
	for i, req := range reqs {
		if res, err := reserveUnlessBusy(ctx, dep.Node(i%nodes), req); err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Fatalf("Reserve %s on a fresh SKU: %s, %v; want HELD", req.Key, res.Outcome, err)
		}
	}
	want := map[string]strategy.Status{reqs[0].Key: strategy.StatusHeld, reqs[1].Key: strategy.StatusHeld, reqs[2].Key: strategy.StatusHeld}
	expect := func(after string) {
		t.Helper()
		for n := 0; n < nodes; n++ {
			for _, req := range reqs {
				r, err := dep.Node(n).Lookup(ctx, req.Key)
				if err != nil {
					t.Fatalf("Lookup %s on node %d: %v", req.Key, n, err)
				}
				if r.Status != want[req.Key] {
					t.Errorf("after %s, node %d reads %s as %s; want %s (a transition moves only its own key)", after, n, req.Key, r.Status, want[req.Key])
				}
			}
		}
	}
	if canConfirm {
		if moved, err := confirmer.Confirm(ctx, reqs[0].Key, strategy.ConfirmBeforeExpiry); err != nil || !moved {
			t.Fatalf("Confirm %s: %v, %v; want moved", reqs[0].Key, moved, err)
		}
		want[reqs[0].Key] = strategy.StatusConfirmed
		expect("confirming user u's reservation of SKU a")
	}
	if canRelease {
		before, err := dep.Audit(ctx)
		if err != nil {
			t.Fatalf("Audit: %v", err)
		}
		units, err := releaser.Release(ctx, reqs[1].Key)
		if err != nil || units != 1 {
			t.Errorf("Release %s (HELD): %d units, %v; want 1", reqs[1].Key, units, err)
		}
		after, err := dep.Audit(ctx)
		if err != nil {
			t.Fatalf("Audit: %v", err)
		}
		for i := range after {
			wantUp := 0
			if after[i].SKU == skuB {
				wantUp = 1
			}
			for _, b := range before {
				if b.SKU == after[i].SKU && after[i].Available-b.Available != wantUp {
					t.Errorf("Release of user u's reservation of SKU b: %s's available went from %d to %d; want +%d", b.SKU, b.Available, after[i].Available, wantUp)
				}
			}
		}
		want[reqs[1].Key] = strategy.StatusReleased
		expect("releasing user u's reservation of SKU b")
	}
}

// seller sells out SKUs of a deployment of its own, request by request.
type seller struct {
	t      tester
	dep    strategy.Deployment
	nodes  int
	prefix string
	seq    int
}

// sellOut asks each node in turn for units of sku, one request at a time,
// each from a new user, until it answers SOLD_OUT (a node may sell only
// its share) or has sold bound, and returns the requests it HELD. Each
// node's last answer is SOLD_OUT when bound is at least the stock.
func (s *seller) sellOut(ctx context.Context, sku string, bound int) []strategy.Request {
	s.t.Helper()
	var held []strategy.Request
	for i := 0; i < s.nodes; i++ {
		for j := 0; j <= bound; j++ {
			s.seq++
			req := strategy.Request{Key: fmt.Sprintf("%s-%03d-%s", s.prefix, s.seq, sku), User: fmt.Sprintf("%s-user-%03d", s.prefix, s.seq), SKU: sku, TTL: time.Hour}
			res, err := reserveUnlessBusy(ctx, s.dep.Node(i), req)
			if err != nil {
				s.t.Fatalf("Reserve on node %d: %v", i, err)
			}
			if res.Outcome == strategy.OutcomeSoldOut {
				break
			}
			if res.Outcome != strategy.OutcomeHeld {
				s.t.Fatalf("Reserve %s on node %d: %s; want HELD or SOLD_OUT (nothing else runs on this SKU)", req.Key, i, res.Outcome)
			}
			held = append(held, req)
		}
	}
	return held
}

func keysOf(reqs []strategy.Request) []string {
	out := make([]string, len(reqs))
	for i, r := range reqs {
		out[i] = r.Key
	}
	return out
}

// reserveUnlessBusy sends req until the answer is not BUSY, at most
// busyTries times.
func reserveUnlessBusy(ctx context.Context, s strategy.Strategy, req strategy.Request) (strategy.Result, error) {
	for try := 1; ; try++ {
		res, err := s.Reserve(ctx, req)
		if err != nil || res.Outcome != strategy.OutcomeBusy || try == busyTries {
			return res, err
		}
	}
}

// reserveUntilAnswered sends req until it gets an answer that is neither
// an error nor BUSY, at most busyTries times. It is for a check's setup, not
// its subject: an error leaves the outcome unknown, and sending the same key
// again is how the contract resolves it (a REPLAY if the first one held).
// A SERIALIZABLE strategy that gives up after its retry policy under the
// setup's concurrency is doing what it documents, and the check is not
// about that.
//
// A REPLAY of a HELD reservation after an error is answered HELD: the send
// that erred is the one that held it.
func reserveUntilAnswered(ctx context.Context, s strategy.Strategy, req strategy.Request) (strategy.Result, error) {
	erred := false
	for try := 1; ; try++ {
		res, err := s.Reserve(ctx, req)
		if erred && err == nil && res.Outcome == strategy.OutcomeReplay && res.Reservation.Status == strategy.StatusHeld {
			res.Outcome = strategy.OutcomeHeld
		}
		if (err == nil && res.Outcome != strategy.OutcomeBusy) || try == busyTries || ctx.Err() != nil {
			return res, err
		}
		erred = erred || err != nil
	}
}

// checkZeroShare: a node whose configured share of a SKU is 0
// (strategy.Stock.Shares) sells none of it, and the deployment sells no
// more than the SKU's total. A strategy that reads a share of 0 as "not
// set" gives that node the even split and oversells. Every other
// deployment of the kit splits its stock evenly or as [5, 15], where no
// node's share is 0. Three nodes, shares [0, 3, 0]: requests go to every
// node until each has answered SOLD_OUT.
func checkZeroShare(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("zero-share")
	const nodes, total = 3, 3
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Nodes: nodes, Stock: []strategy.Stock{{SKU: sku, Total: total, Shares: []int{0, total, 0}}}})
	if err != nil {
		t.Fatalf("Open with shares [0, %d, 0]: %v", total, err)
	}
	defer dep.Close()
	held := 0
	for i := 0; i < 3*total; i++ {
		req := strategy.Request{Key: fmt.Sprintf("kit-zero-share-%d-%s", i, sku), User: fmt.Sprintf("kit-zero-share-%d", i), SKU: sku, TTL: time.Hour}
		res, err := reserveUnlessBusy(ctx, dep.Node(i%nodes), req)
		if err != nil {
			t.Fatalf("Reserve on node %d: %v", i%nodes, err)
		}
		if res.Outcome == strategy.OutcomeHeld {
			held++
		}
	}
	list, err := dep.Audit(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("Audit: %+v, %v", list, err)
	}
	if a := list[0]; held > total || a.Active > total || a.Drift() != 0 {
		t.Errorf("SKU of %d units with shares [0, %d, 0] on 3 nodes, %d requests on each node: %d HELD, audit %+v; want at most %d (a share of 0 sells nothing)", total, total, total, held, a, total)
	}
}

// rollBackCart reserves one unit of each SKU of stock in one attempt held
// open, and rolls it back.
func rollBackCart(ctx context.Context, t tester, opener strategy.SessionOpener, stock []strategy.Stock) {
	t.Helper()
	s, err := opener.OpenSession(ctx)
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	defer func() { _ = s.Rollback(context.Background()) }()
	for i, st := range stock {
		req := strategy.Request{Key: fmt.Sprintf("kit-per-cart-%d-%s", i, st.SKU), User: "kit-per-cart", SKU: st.SKU, TTL: time.Hour}
		if res, err := s.Reserve(ctx, req); err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Fatalf("line %d of a cart held open (%s, %d units, none sold): %s, %v; want HELD", i+1, st.SKU, st.Total, res.Outcome, err)
		}
	}
	if err := s.Rollback(ctx); err != nil {
		t.Fatalf("Rollback of a cart of one unit of each of %d SKUs: %v", len(stock), err)
	}
}
