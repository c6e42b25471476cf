package strategytest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// planOrderRounds is how many crowds checkAnswersInAnyPlanOrder sends.
const planOrderRounds = 3

// checkAnswersInAnyPlanOrder: a crowd of requests for one SKU, sent at once
// to one node, gets each its own answer when the server's planner joins by
// sorting: the deployment's connections run with enable_hashjoin and
// enable_nestloop off, and join_collapse_limit and from_collapse_limit at 1
// (joins in the order the statement writes them), so each join returns its
// rows in the order of its own join key, and the last one's decides the
// order of the result, not the order the statement read its input in.
// (Without the collapse limits, combine's batch still came back in request
// order: the planner put a merge join on the request's position last.) A
// strategy that
// serves several requests with one statement and matches the rows it gets
// back to its requests by their position, not by a column it sent,
// answers one request with another's outcome (outsider round 23's rowpos:
// combine without its ORDER BY). With the planner's own choices (hash
// joins that keep the order of their outer input at these sizes) the rows
// came back in request order, and every scenario passed.
//
// Each crowd is every answer a SKU with units gives, shuffled: four keys
// held before sent again by their users (REPLAY of each one's own
// reservation), those four users under new keys (USER_LIMIT), two of the
// keys from other users (KEY_REUSED) and six new users (HELD, under each
// one's own key). Keys sort in another order than the crowd is sent in.
func checkAnswersInAnyPlanOrder(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	wrong := sortedRounds(ctx, t, db, planOrderRounds, func(sorted *pgxpool.Pool, round int) []string {
		return crowdInSortedPlans(ctx, t, meta, sorted, rs, round)
	})
	if len(wrong) > 0 {
		t.Errorf("%d answers of a crowd (joins by sorting) are not their own request's: %s", len(wrong), sample(wrong))
	}
}

// crowdInSortedPlans sends one round's crowd on a fresh deployment and
// returns the answers that are wrong for their request.
func crowdInSortedPlans(ctx context.Context, t tester, meta strategy.Meta, sorted *pgxpool.Pool, rs map[strategy.Resource]string, round int) []string {
	t.Helper()
	dep, sku := openOneSKU(ctx, t, meta, sorted, rs, fmt.Sprintf("plan-order-%d", round), 40)
	defer dep.Close()
	node := dep.Node(0)
	// Key names start with a letter that orders them across the kinds, so
	// that their sorted order is neither the crowd's nor grouped by kind.
	key := func(i int) string { return fmt.Sprintf("%c-kit-plan-%02d-%s", 'a'+(i*7)%26, i, sku) }
	type ask struct {
		req  strategy.Request
		want strategy.Outcome
		of   string // the key whose reservation a REPLAY must carry
	}
	var crowd []ask
	for i := 0; i < 4; i++ {
		held := strategy.Request{Key: key(i), User: fmt.Sprintf("kit-plan-holder-%d", i), SKU: sku, TTL: time.Hour}
		holdForCheck(ctx, t, node, held)
		crowd = append(crowd, ask{held, strategy.OutcomeReplay, held.Key})
		limited := held
		limited.Key = key(10 + i)
		crowd = append(crowd, ask{limited, strategy.OutcomeUserLimit, ""})
		if i < 2 {
			reused := held
			reused.User = fmt.Sprintf("kit-plan-other-%d", i)
			crowd = append(crowd, ask{reused, strategy.OutcomeKeyReused, ""})
		}
	}
	for i := 0; i < 6; i++ {
		crowd = append(crowd, ask{strategy.Request{Key: key(20 + i), User: fmt.Sprintf("kit-plan-new-%d", i), SKU: sku, TTL: time.Hour}, strategy.OutcomeHeld, ""})
	}
	rand.Shuffle(len(crowd), func(i, j int) { crowd[i], crowd[j] = crowd[j], crowd[i] })
	results := make([]strategy.Result, len(crowd))
	errs := make([]error, len(crowd))
	Together(len(crowd), func(i int) { results[i], errs[i] = reserveUntilAnswered(ctx, node, crowd[i].req) })
	var wrong []string
	for i, a := range crowd {
		res, err := results[i], errs[i]
		switch {
		case err != nil:
			wrong = append(wrong, fmt.Sprintf("%s (user %s): error %v", a.req.Key, a.req.User, err))
		case res.Outcome != a.want:
			wrong = append(wrong, fmt.Sprintf("%s (user %s): %s, want %s", a.req.Key, a.req.User, res.Outcome, a.want))
		case (a.want == strategy.OutcomeHeld || a.want == strategy.OutcomeReplay) && (res.Reservation.Key != a.req.Key || res.Reservation.User != a.req.User):
			wrong = append(wrong, fmt.Sprintf("%s (user %s): %s of the reservation of %s (user %s)", a.req.Key, a.req.User, res.Outcome, res.Reservation.Key, res.Reservation.User))
		}
	}
	return wrong
}

// sortedRounds runs crowd on a pool that joins by sorting, round after
// round, until one returns wrong answers or rounds have run, and returns
// those answers.
func sortedRounds(ctx context.Context, t tester, db *pgxpool.Pool, rounds int, crowd func(sorted *pgxpool.Pool, round int) []string) []string {
	t.Helper()
	sorted, err := sortedJoinsPool(ctx, db)
	if err != nil {
		t.Fatalf("a pool that joins by sorting: %v", err)
	}
	defer closeKitPool(sorted)
	var wrong []string
	for round := 0; round < rounds && len(wrong) == 0; round++ {
		wrong = crowd(sorted, round)
	}
	return wrong
}

// sortedJoinsPool is a pool on db's database whose connections join by
// sorting: enable_hashjoin and enable_nestloop off, and join_collapse_limit
// and from_collapse_limit at 1 (joins in the order the statement writes
// them), so each join returns its rows in the order of its own join key.
func sortedJoinsPool(ctx context.Context, db *pgxpool.Pool) (*pgxpool.Pool, error) {
	cfg := db.Config().Copy()
	cfg.ConnConfig.RuntimeParams["enable_hashjoin"] = "off"
	cfg.ConnConfig.RuntimeParams["enable_nestloop"] = "off"
	cfg.ConnConfig.RuntimeParams["join_collapse_limit"] = "1"
	cfg.ConnConfig.RuntimeParams["from_collapse_limit"] = "1"
	// A disabled join method adds 10^10 to a plan's cost, past
	// jit_above_cost: every statement was compiled, about half a second
	// each, and a crowd of 16 outlived the check's two minutes on a
	// loaded machine (combine, a CI rehearsal of 2026-12-06). Compiling
	// changes no row order.
	cfg.ConnConfig.RuntimeParams["jit"] = "off"
	return pgxpool.NewWithConfig(ctx, cfg)
}
