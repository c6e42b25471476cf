package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/pgtest/pgproxy"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest/internal/pgcontrol"
)

// checkCutReleaseInNewProcess: a process reserves the one unit of a SKU and
// releases it; a second process attaches and does the same, but
// its release's connection is cut once the server has run the UPDATE (a
// proxy drops the answer). The release is in doubt for the second process,
// which may settle it later from the log. Whatever it marks its moves with
// must be its own: a mark the first process also used (an attempt counter
// that starts again at 1 in every process, or a number from a seed fixed in
// the code) makes the settle give back the first process's unit a second
// time, and the SKU of 1 unit then sells 2 (outsider round 18's attempt
// counter). The partition scenario cuts releases too, but in a process
// whose history is not the first one's, and no other scenario makes a move
// in doubt after a new process attached.
//
// The cut backend is waited out (pg_stat_activity) before anything else
// runs, the release is sent again until it answers, as a client would, and
// then three new users ask for the SKU: one unit is free.
func checkCutReleaseInNewProcess(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	if meta.Attach == nil {
		t.Skip("no Meta.Attach")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	skipWithoutTables(ctx, t, admin) // nothing goes through the proxy
	sku := kitSKU("cut-new-proc")
	stock := []strategy.Stock{{SKU: sku, Total: 1}}
	first, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: stock})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer first.Close()
	if _, ok := first.Node(0).(strategy.Releaser); !ok {
		t.Skip("no Release")
	}
	reserveThenRelease := func(dep strategy.Deployment, key, user, who string) {
		t.Helper()
		req := strategy.Request{Key: key, User: user, SKU: sku, TTL: time.Hour}
		if res, err := reserveUnlessBusy(ctx, dep.Node(0), req); err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Fatalf("%s: Reserve %q, the one unit of a SKU: %s, %v; want HELD", who, key, res.Outcome, err)
		}
	}
	reserveThenRelease(first, "kit-cnp-1-"+sku, "kit-cnp-u1", "the first process")
	if n, err := first.Node(0).(strategy.Releaser).Release(ctx, "kit-cnp-1-"+sku); n != 1 || err != nil {
		t.Fatalf("the first process: Release of its HELD reservation: %d, %v; want 1", n, err)
	}

	p, pool, closeBoth, err := poolThroughProxy(ctx, db, "", 4)
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer closeBoth()
	second, err := meta.Attach(ctx, strategy.Config{Resources: rs, DB: pool, Stock: stock})
	if err != nil {
		t.Fatalf("Attach a second process through a proxy: %v", err)
	}
	defer second.Close()
	key := "kit-cnp-2-" + sku
	reserveThenRelease(second, key, "kit-cnp-u2", "the second process")
	rel := second.Node(0).(strategy.Releaser)
	p.Arm(pgproxy.Fault{Point: pgproxy.Write, Action: pgproxy.Drop, Hits: 1})
	n, relErr := rel.Release(ctx, key)
	p.Arm(pgproxy.Fault{})
	var cut []uint32
	for len(p.Hits()) > 0 {
		cut = append(cut, (<-p.Hits()).Backend)
	}
	if len(cut) > 0 {
		if err := pgcontrol.WaitNone(ctx, admin, "the backend of the cut release", goneBackendsSQL, cut); err != nil {
			t.Fatalf("%v", err)
		}
	}
	answered := relErr == nil
	for try := 0; !answered && try < busyTries; try++ {
		n, relErr = rel.Release(ctx, key)
		answered = relErr == nil
	}
	if !answered {
		t.Fatalf("the second process: Release of %q, cut once the server ran it, then sent again %d times: %v", key, busyTries, relErr)
	}
	held := 0
	for i := 1; i <= 3; i++ {
		req := strategy.Request{Key: fmt.Sprintf("kit-cnp-%d-%s", 2+i, sku), User: fmt.Sprintf("kit-cnp-u%d", 2+i), SKU: sku, TTL: time.Hour}
		res, err := reserveUnlessBusy(ctx, second.Node(0), req)
		if err != nil {
			t.Fatalf("Reserve %q after the cut release: %v", req.Key, err)
		}
		if res.Outcome == strategy.OutcomeHeld {
			held++
		}
	}
	if held > 1 {
		t.Errorf("SKU of 1 unit, reserved and released by one process, then by a second that attached, whose release was cut once the server ran it (%d connection(s) cut; then answered %d): %d of 3 new users HELD it; want 1 (the second process gave back a unit that was not its own)",
			len(cut), n, held)
	}
}
