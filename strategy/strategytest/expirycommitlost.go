package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkExpiryCommitLost: an expiry job whose transaction is lost at its
// COMMIT (the server ends its connection: a failover, an administrator, a
// network cut) gives back nothing, wherever else it counts units. The kit
// holds the job's first COMMIT before it is sent (holdTracer), ends the
// backend it would run on (pg_terminate_backend), and lets it go: the
// COMMIT fails and the transaction is rolled back, so the due reservation
// is still HELD. A job that gave its units back outside PostgreSQL before
// its COMMIT (a Redis counter, a node's memory: "a failed give-back rolls
// the expiry back") has the unit counted free while its row holds it
// (outsider round 35's m12rcexpiregiveintx, rediscounter): no scenario
// cut an expiry job between its give-back and its COMMIT, and the base
// strategy commits its UPDATE first. On a SKU of 1 unit whose reservation
// is due: the job, cut at its COMMIT; then two new users ask for the unit;
// then the job again, and two more. At no point may more reservations be
// active than the one unit. A job that commits no transaction of its own
// (autocommit statements) is not cut, and the check is then the same
// sequence without a fault.
func checkExpiryCommitLost(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, dep, sku, closeAll := openTraced(ctx, t, meta, db, rs, "expiry-commit-lost", 1)
	defer closeAll()
	node := dep.Node(0)
	expirer, ok := node.(strategy.Expirer)
	if !ok {
		t.Skip("no expiry job (strategy.Expirer)")
	}
	ager, ok := dep.(strategy.Ager)
	if !ok {
		t.Skip("no MakeDue (strategy.Ager)")
	}
	due := strategy.Request{Key: "kit-ecl-due-" + sku, User: "kit-ecl-due", SKU: sku, TTL: time.Hour}
	holdForCheck(ctx, t, node, due)
	if n, err := ager.MakeDue(ctx, []string{due.Key}); err != nil || n != 1 {
		t.Fatalf("MakeDue: %d, %v; want 1", n, err)
	}

	var box panicBox
	defer box.rethrow()
	h.arm(isCommit)
	type jobAnswer struct {
		units int
		err   error
	}
	job := make(chan jobAnswer, 1)
	go func() {
		var a jobAnswer
		defer func() { job <- a }()
		defer box.catch()
		a.units, a.err = expirer.ExpireDue(ctx)
	}()
	pid, held, err := awaitHeld(ctx, h, job)
	if err != nil {
		t.Fatalf("the expiry job: %v", err)
	}
	cut := ""
	if !held {
		h.arm(nil) // the job committed no transaction of its own: hold nothing after it
	}
	if held {
		if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, int32(pid)); err != nil {
			t.Fatalf("pg_terminate_backend of the job's backend: %v", err)
		}
		if err := awaitBackendGone(ctx, admin, int32(pid)); err != nil {
			t.Fatalf("the job's backend after pg_terminate_backend: %v", err)
		}
		h.letGo()
		cut = " (its COMMIT cut)"
	}
	j := <-job
	active := func(when string) {
		t.Helper()
		r, err := node.Lookup(ctx, due.Key)
		if err != nil {
			t.Fatalf("Lookup %s %s: %v", due.Key, when, err)
		}
		n := 0
		if r.Status.Active() {
			n++
		}
		var answers []string
		for i := 0; i < 2; i++ {
			req := strategy.Request{Key: fmt.Sprintf("kit-ecl-%d-%d-%s", len(when), i, sku), User: fmt.Sprintf("kit-ecl-%d-%d", len(when), i), SKU: sku, TTL: time.Hour}
			res, err := reserveUntilAnswered(ctx, node, req)
			answers = append(answers, fmt.Sprintf("%s, %v", res.Outcome, err))
			if err == nil && res.Outcome == strategy.OutcomeHeld {
				n++
			}
		}
		if n > 1 {
			t.Errorf("a SKU of 1 unit whose reservation was due, %s%s (the job gave back %d, %v): the due reservation %s, two new users answered %v: %d reservations active; want at most 1",
				when, cut, j.units, j.err, r.Status, answers, n)
		}
	}
	active("after the job")
	if _, err := expirer.ExpireDue(ctx); err != nil {
		t.Fatalf("ExpireDue run again: %v", err)
	}
	active("after the job ran again")
}

// awaitBackendGone waits until pid has left pg_stat_activity.
func awaitBackendGone(ctx context.Context, admin *pgxpool.Pool, pid int32) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var gone bool
		if err := admin.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&gone); err != nil || gone {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}
