package strategytest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkAnswersWhenSoldOut: a node that has just answered SOLD_OUT still
// tells every other request what it is. The scenarios resend keys and
// test the user limit while units remain, and a storm's late requests are
// new keys, so a strategy that answers from a "this SKU is sold out"
// shortcut before it looks at the key or the user passes them all. Here a
// deployment of two SKUs on two nodes sells SKU A out, every node's last
// answer SOLD_OUT, and user X holds SKU B's only unit. Then, on each node:
//
//   - every key A sold, sent again by its user, is REPLAY of its
//     reservation (also all at once), and one sent with a longer TTL
//     leaves its expires_at where it was;
//   - one of them sent by another user, or by its user for SKU B, is
//     KEY_REUSED, and so is X's key for B sent for A, by X or another user;
//   - X, who holds only B, asking for A is SOLD_OUT, not USER_LIMIT;
//   - a user who holds A asking again under a new key is USER_LIMIT or
//     SOLD_OUT, and a new user SOLD_OUT. Either answer, because the
//     contract orders only the key first (the comment on strategy's
//     outcomes): memquota's node answers SOLD_OUT from its count, and
//     redislock from seed 002's check of the stock row before its lock,
//     without looking for the user's reservations, which spares a sold-out
//     storm that read.
//
// Last, when the strategy releases, one of A's units is released and X
// gets it: exactly one HELD, asking each node in turn, or on node 0 at once
// when the strategy claims no phantom sold-out and the release went
// through another node.
func checkAnswersWhenSoldOut(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const nodes = 2
	base := kitSKU("out")
	skuA, skuB := base+"-a", base+"-b"
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Nodes: nodes, Stock: []strategy.Stock{{SKU: skuA, Total: 2}, {SKU: skuB, Total: 1}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	sold := &seller{t: t, dep: dep, nodes: nodes, prefix: "kit-out"}
	held := sold.sellOut(ctx, skuA, 2)
	if len(held) != 2 {
		t.Fatalf("SKU A: %d of its 2 units sold to requests on every node; want both", len(held))
	}
	x := strategy.Request{Key: "kit-out-x-b-" + base, User: "kit-out-user-x", SKU: skuB, TTL: time.Hour}
	if res, err := reserveUnlessBusy(ctx, dep.Node(0), x); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("user X's reservation of SKU B: %s, %v; want HELD", res.Outcome, err)
	}

	var wrong []string
	ask := func(node int, what string, req strategy.Request, want ...strategy.Outcome) strategy.Result {
		res, err := reserveUnlessBusy(ctx, dep.Node(node), req)
		if err != nil {
			wrong = append(wrong, fmt.Sprintf("node %d, %s: error %v", node, what, err))
			return res
		}
		for _, w := range want {
			if res.Outcome == w {
				return res
			}
		}
		wrong = append(wrong, fmt.Sprintf("node %d, %s: %s, want %s", node, what, res.Outcome, outcomesText(want)))
		return res
	}
	replayed := func(node int, how string, req strategy.Request, res strategy.Result) {
		if res.Outcome == strategy.OutcomeReplay && (res.Reservation.Key != req.Key || res.Reservation.User != req.User || res.Reservation.Status != strategy.StatusHeld) {
			wrong = append(wrong, fmt.Sprintf("node %d, %s: REPLAY of %+v, want the HELD reservation of its key", node, how, res.Reservation))
		}
	}
	for i := 0; i < nodes; i++ {
		for _, req := range held {
			req := req
			replayed(i, "a sold key sent again", req, ask(i, "a sold key sent again", req, strategy.OutcomeReplay))
		}
		before, err := dep.Node(i).Lookup(ctx, held[1].Key)
		if err != nil {
			t.Fatalf("Lookup %s: %v", held[1].Key, err)
		}
		longer := held[1]
		longer.TTL = 2 * time.Hour
		res := ask(i, "a sold key sent again with a longer TTL", longer, strategy.OutcomeReplay)
		after, err := dep.Node(i).Lookup(ctx, held[1].Key)
		if err != nil {
			t.Fatalf("Lookup %s: %v", held[1].Key, err)
		}
		moved := func(at time.Time) bool { return at.Sub(before.ExpiresAt).Abs() > time.Millisecond }
		if moved(after.ExpiresAt) || (res.Outcome == strategy.OutcomeReplay && moved(res.Reservation.ExpiresAt)) {
			wrong = append(wrong, fmt.Sprintf("node %d, a sold key sent again with a longer TTL moved expires_at from %s to %s (the answer says %s); a replay changes nothing",
				i, before.ExpiresAt.Format(time.RFC3339Nano), after.ExpiresAt.Format(time.RFC3339Nano), res.Reservation.ExpiresAt.Format(time.RFC3339Nano)))
		}
		other := held[0]
		other.User = "kit-out-user-other"
		ask(i, "a sold key from another user", other, strategy.OutcomeKeyReused)
		// A known key is answered about its key before anything else: from
		// a user who holds A under another key it is KEY_REUSED, not
		// USER_LIMIT (which would tell the client to stop asking for A,
		// when what it did wrong was to reuse a key).
		byHolder := held[0]
		byHolder.User = held[1].User
		ask(i, "a sold key from the user of the other reservation of A", byHolder, strategy.OutcomeKeyReused)
		elsewhere := held[0]
		elsewhere.SKU = skuB
		ask(i, "a sold key from its user for SKU B", elsewhere, strategy.OutcomeKeyReused)
		// And the other way: a key of B sent for A, which the node last
		// found sold out. A node that asks "why not" first while it
		// remembers A sold out has to compare the key's SKU there too
		// (outsider round 40's onetrip answered its user REPLAY).
		xForA := x
		xForA.SKU = skuA
		ask(i, "user X's key for SKU B, sent by X for the sold-out A", xForA, strategy.OutcomeKeyReused)
		xByOther := xForA
		xByOther.User = "kit-out-user-other"
		ask(i, "user X's key for SKU B, sent by another user for the sold-out A", xByOther, strategy.OutcomeKeyReused)
		ask(i, "user X, who holds only SKU B, asking for A", strategy.Request{Key: fmt.Sprintf("kit-out-x-a%d-%s", i, base), User: x.User, SKU: skuA, TTL: time.Hour}, strategy.OutcomeSoldOut)
		again := held[1]
		again.Key = fmt.Sprintf("kit-out-again-%d-%s", i, base)
		ask(i, "a holder of A under a new key", again, strategy.OutcomeUserLimit, strategy.OutcomeSoldOut)
		ask(i, "a new user asking for A", strategy.Request{Key: fmt.Sprintf("kit-out-new-%d-%s", i, base), User: fmt.Sprintf("kit-out-user-new-%d", i), SKU: skuA, TTL: time.Hour}, strategy.OutcomeSoldOut)
	}
	results := make([]strategy.Result, len(held))
	errs := make([]error, len(held))
	Together(len(held), func(j int) { results[j], errs[j] = reserveUnlessBusy(ctx, dep.Node(j%nodes), held[j]) })
	for j, req := range held {
		switch {
		case errs[j] != nil:
			wrong = append(wrong, fmt.Sprintf("the sold keys sent again at once: %s: error %v", req.Key, errs[j]))
		case results[j].Outcome != strategy.OutcomeReplay:
			wrong = append(wrong, fmt.Sprintf("the sold keys sent again at once: %s: %s, want REPLAY", req.Key, results[j].Outcome))
		default:
			replayed(j%nodes, "the sold keys sent again at once", req, results[j])
		}
	}

	// A strategy that claims no phantom sold-out releases through the last
	// node and is asked on node 0, whose last answers for A were SOLD_OUT: a
	// node that remembers "sold out" and forgets it only on its own
	// Release answers SOLD_OUT with a unit free. Without the claim a node
	// may keep a share of its own, so each node is asked in turn.
	phantomFree := meta.Claims.Has(strategy.NoPhantomSoldOut)
	releasing := 0
	if phantomFree {
		releasing = nodes - 1
	}
	if releaser, ok := dep.Node(releasing).(strategy.Releaser); ok {
		if units, err := releaser.Release(ctx, held[0].Key); err != nil || units != 1 {
			t.Fatalf("Release of a HELD reservation of A on node %d: %d units, %v; want 1", releasing, units, err)
		}
		xa := strategy.Request{Key: "kit-out-x-a-" + base, User: x.User, SKU: skuA, TTL: time.Hour}
		if phantomFree {
			ask(0, fmt.Sprintf("user X asking for the unit of A that node %d's release gave back (no-phantom-sold-out is claimed)", releasing), xa, strategy.OutcomeHeld)
			if meta.Attach != nil {
				// The same through another process of the service (Attach):
				// a memory of "sold out" shared by a process's nodes, and
				// cleared by that process's own releases, is the same
				// mistake one level up.
				ask(0, "a new user asking for A, sold out again", strategy.Request{Key: "kit-out-new-again-" + base, User: "kit-out-user-new-again", SKU: skuA, TTL: time.Hour}, strategy.OutcomeSoldOut)
				other, err := meta.Attach(ctx, strategy.Config{Resources: rs, DB: db, Nodes: nodes, Stock: []strategy.Stock{{SKU: skuA, Total: 2}, {SKU: skuB, Total: 1}}})
				if err != nil {
					t.Fatalf("Attach a second process: %v", err)
				}
				defer other.Close()
				if r, ok := other.Node(0).(strategy.Releaser); ok {
					if units, err := r.Release(ctx, xa.Key); err != nil || units != 1 {
						t.Fatalf("Release of user X's reservation of A through a second process: %d units, %v; want 1", units, err)
					}
					ask(0, "a new user asking for the unit of A that a second process's release gave back (no-phantom-sold-out is claimed)",
						strategy.Request{Key: "kit-out-after-attach-" + base, User: "kit-out-user-after-attach", SKU: skuA, TTL: time.Hour}, strategy.OutcomeHeld)
				}
			}
		} else {
			got := 0
			for i := 0; i < nodes && got == 0; i++ {
				if res := ask(i, "user X asking for A's released unit", xa, strategy.OutcomeHeld, strategy.OutcomeSoldOut); res.Outcome == strategy.OutcomeHeld {
					got++
				}
			}
			if got != 1 {
				wrong = append(wrong, "user X, who holds only SKU B, asking every node in turn for the unit A's release gave back: no HELD")
			}
		}
	}
	if len(wrong) > 0 {
		t.Errorf("%d answers wrong after SKU A sold out: %s", len(wrong), strings.Join(wrong, "; "))
	}
}

func outcomesText(os []strategy.Outcome) string {
	s := make([]string, len(os))
	for i, o := range os {
		s[i] = string(o)
	}
	return strings.Join(s, " or ")
}
