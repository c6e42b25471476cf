package strategytest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/pgtest/pgproxy"
	"github.com/reservebench/reservebench/strategy"
)

// orphan is a call the kit gave up on while its COMMIT was held: its
// caller was answered (first), and its backend (pid) goes on, waiting at
// the COMMIT until hold is released.
type orphan struct {
	hold  *writeHold
	pid   int32
	first answer
}

// orphanAtCommit makes call an orphan: the COMMIT of the first write
// naming key is held (holdCommitNaming), the proxy p loses every cancel
// from now on (so a backend goes on once its caller gives up), call runs
// with a context the kit gives up on once the call's backend is seen
// waiting at that COMMIT, and its answer is awaited. The caller defers
// o.hold.removeOrReport and releases the hold when its scenario says.
// It skips when the strategy keeps no tables in PostgreSQL, and when call
// was answered without being seen at such a COMMIT (what names the call).
// The restart, attach and release checks beside an orphan share it.
func orphanAtCommit(ctx context.Context, t tester, p *pgproxy.Proxy, admin *pgxpool.Pool, key, what string, call func(ctx context.Context) answer) orphan {
	t.Helper()
	hold, err := holdCommitNaming(ctx, admin, key)
	if errors.Is(err, errNoTables) {
		t.Skip("the strategy keeps no tables in PostgreSQL: no commit to hold")
	} else if err != nil {
		t.Fatalf("%v", err)
	}
	kept := false
	defer func() {
		if !kept { // a skip or a failure below: the caller never saw the hold
			hold.removeOrReport(t)
		}
	}()
	p.LoseCancels(true)
	callCtx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	var box panicBox
	done := make(chan answer, 1)
	go func() {
		var a answer
		defer func() { done <- a }()
		defer box.catch()
		a = call(callCtx)
	}()
	pid, err := awaitWaiter(ctx, hold, done, besideWithin)
	if err != nil {
		t.Fatalf("%s held at its COMMIT: %v", what, err)
	}
	if pid == 0 {
		a := <-done
		box.rethrow()
		// No error text: it names the key, and a skip's reason goes into
		// table 28-1, which must not change from run to run.
		t.Skip(fmt.Sprintf("%s was answered (%s) without being seen at a COMMIT after writing a row naming its key: no orphan to make", what, summary(a)))
	}
	giveUp()
	first := givenUpAnswer(t, done, what)
	box.rethrow()
	kept = true
	return orphan{hold: hold, pid: pid, first: first}
}

// summary is an answer without its error's text.
func summary(a answer) string {
	s := fmt.Sprintf("an error: %v", a.err != nil)
	if a.res.Outcome != "" {
		s = string(a.res.Outcome) + ", " + s
	}
	return s
}

// sellAfter asks new users for sku through node until SOLD_OUT, at most
// three, and returns how many were HELD. Their keys and users start with
// prefix; after says what happened before, for the errors.
func sellAfter(ctx context.Context, t tester, node strategy.Strategy, sku, prefix, after string) int {
	t.Helper()
	held := 0
	for i := range 3 {
		more := strategy.Request{Key: fmt.Sprintf("%s-after-%d-%s", prefix, i, sku), User: fmt.Sprintf("%s-after-%d", prefix, i), SKU: sku, TTL: time.Hour}
		res, err := reserveUnlessBusy(ctx, node, more)
		if err != nil {
			t.Fatalf("Reserve %q after %s: %v", more.Key, after, err)
		}
		if res.Outcome == strategy.OutcomeHeld {
			held++
		}
		if res.Outcome == strategy.OutcomeSoldOut {
			break
		}
	}
	return held
}

// openBehindProxy opens meta with one SKU of one unit, named after name,
// over a pool whose connections go through a proxy the check can cut, as
// the checks beside an orphan start. The caller defers closeAll.
func openBehindProxy(ctx context.Context, t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string, name string) (p *pgproxy.Proxy, dep strategy.Deployment, cfg strategy.Config, closeAll func()) {
	t.Helper()
	p, pool, closeBoth, err := poolThroughProxy(ctx, db, "", 8)
	if err != nil {
		t.Fatalf("%v", err)
	}
	cfg = strategy.Config{Resources: rs, DB: pool, Stock: []strategy.Stock{{SKU: kitSKU(name), Total: 1}}}
	dep, err = meta.Open(ctx, cfg)
	if err != nil {
		closeBoth()
		t.Fatalf("Open: %v", err)
	}
	return p, dep, cfg, func() { dep.Close(); closeBoth() }
}
