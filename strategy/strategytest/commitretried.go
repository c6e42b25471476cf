package strategytest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkRetriedAtCommit: a call whose first COMMIT fails with a
// serialization failure (40001), as SERIALIZABLE's check at commit fails
// a transaction, and which the strategy runs again, answers for the
// attempt that committed alone. A strategy that retries and adds up what
// each attempt's statement returned reports a Release of one unit as 2,
// an expiry run of one due row as 2 (outsider round 40's
// hotrow-serializable: units summed over the attempts), and any count the
// caller keeps drifts from the stock. No scenario failed a COMMIT after
// its statements had run: serialization failures under contention mostly
// end a statement, which returns nothing to add up.
//
// On a SKU of 4 units, three keys are HELD (the fourth unit is the new
// request's, so that a strategy with neither Release nor an expiry job is
// not asked to sell a unit it does not have); then, one call at a time, the
// first commit of a transaction writing a row naming the call's key fails
// (failOnceAtCommit): the Release of the first must report 1 unit, the
// expiry job run with only the second due must report 1, the Confirm of
// the third must report true, and a new request must be HELD. A call that
// answers an error instead (a strategy that does not retry) is sent
// again, and the resend is held to what its key's row then says. Last,
// the audit: no drift.
func checkRetriedAtCommit(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const total = 4
	sku := kitSKU("commit-retried")
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: total}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	node := dep.Node(0)
	key := func(what string) string { return "kit-commit-retried-" + what + "-" + sku }
	for _, what := range []string{"rel", "due", "conf"} {
		req := strategy.Request{Key: key(what), User: key(what), SKU: sku, TTL: time.Hour}
		if res, err := reserveUnlessBusy(ctx, node, req); err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Fatalf("Reserve %q on a SKU of %d units: %s, %v; want HELD", req.Key, total, res.Outcome, err)
		}
	}
	var wrong []string
	done := map[string]bool{} // the calls that ran and answered that they moved their key
	callNames := map[string]string{"rel": "the Release", "due": "the expiry run", "conf": "the Confirm", "new": "the new request"}
	// failing runs call with the first commit naming k failing, then, if
	// it answered an error, once more without the fault.
	failing := func(k string, call func() error) (first error) {
		f, err := failOnceAtCommit(ctx, admin, k)
		if errors.Is(err, errNoTables) {
			t.Skip("the strategy keeps no tables in PostgreSQL: no commit to fail")
		} else if err != nil {
			t.Fatalf("%v", err)
		}
		first = call()
		if err := f.remove(); err != nil {
			t.Fatalf("%v", err)
		}
		return first
	}
	status := func(k string) strategy.Status {
		r, err := node.Lookup(ctx, k)
		if err != nil {
			t.Fatalf("Lookup %q: %v", k, err)
		}
		return r.Status
	}
	// want is what a resend must report: 1 if its key's row is still HELD.
	want := func(k string) int {
		if status(k) == strategy.StatusHeld {
			return 1
		}
		return 0
	}

	if r, ok := node.(strategy.Releaser); ok {
		k := key("rel")
		var units int
		if err := failing(k, func() (err error) { units, err = r.Release(ctx, k); return err }); err == nil {
			done["rel"] = units == 1
			if units != 1 {
				wrong = append(wrong, fmt.Sprintf("Release of a HELD key whose first commit failed with 40001: %d units, want 1", units))
			}
		} else {
			w := want(k)
			units, err := r.Release(ctx, k)
			done["rel"] = err == nil && units == 1
			if err != nil || units != w {
				wrong = append(wrong, fmt.Sprintf("Release of a HELD key sent again after its first answered an error (its first commit failed with 40001): %d, %v; want %d", units, err, w))
			}
		}
	}
	ager, canAge := dep.(strategy.Ager)
	if e, ok := node.(strategy.Expirer); ok && canAge {
		k := key("due")
		if n, err := ager.MakeDue(ctx, []string{k}); err != nil || n != 1 {
			t.Fatalf("MakeDue %q: %d, %v; want 1", k, n, err)
		}
		var units int
		if err := failing(k, func() (err error) { units, err = e.ExpireDue(ctx); return err }); err == nil {
			done["due"] = units == 1
			if units != 1 {
				wrong = append(wrong, fmt.Sprintf("the expiry job with one due reservation, whose first commit failed with 40001: %d units, want 1", units))
			}
		} else {
			w := want(k)
			units, err := e.ExpireDue(ctx)
			done["due"] = err == nil && units == 1
			if err != nil || units != w {
				wrong = append(wrong, fmt.Sprintf("the expiry job run again after its first run answered an error (its first commit failed with 40001): %d, %v; want %d", units, err, w))
			}
		}
	}
	if c, ok := node.(strategy.Confirmer); ok {
		k := key("conf")
		var confirmed bool
		if err := failing(k, func() (err error) { confirmed, err = c.Confirm(ctx, k, strategy.ConfirmBeforeExpiry); return err }); err == nil {
			done["conf"] = confirmed
			if !confirmed {
				wrong = append(wrong, "Confirm of a HELD key whose first commit failed with 40001: false, want true")
			}
		} else {
			confirmed, err := c.Confirm(ctx, k, strategy.ConfirmBeforeExpiry)
			done["conf"] = err == nil && confirmed
			if !done["conf"] {
				wrong = append(wrong, fmt.Sprintf("Confirm of a HELD key sent again after its first answered an error (its first commit failed with 40001): %v, %v; want true", confirmed, err))
			}
		}
	}
	k := key("new")
	req := strategy.Request{Key: k, User: k, SKU: sku, TTL: time.Hour}
	var res strategy.Result
	if rerr := failing(k, func() (err error) { res, err = node.Reserve(ctx, req); return err }); rerr != nil || res.Outcome == strategy.OutcomeBusy {
		res, rerr = reserveUnlessBusy(ctx, node, req)
		done["new"] = rerr == nil && (res.Outcome == strategy.OutcomeHeld || res.Outcome == strategy.OutcomeReplay)
		if !done["new"] {
			wrong = append(wrong, fmt.Sprintf("a new request sent again after its first (its first commit failed with 40001) answered an error or BUSY: %s, %v; want HELD or REPLAY", res.Outcome, rerr))
		}
	} else if res.Outcome != strategy.OutcomeHeld {
		wrong = append(wrong, fmt.Sprintf("a new request whose first commit failed with 40001 on a SKU with a unit: %s, want HELD", res.Outcome))
	} else {
		done["new"] = true
	}
	// Each answer is borne out by its key's row: an attempt that answers
	// for work a failed attempt did, and commits none of it (outsider
	// round 40's m1: a retry that found "already HELD" and committed an
	// empty transaction), reports what no row shows.
	for _, w := range []struct {
		what string
		st   strategy.Status
	}{{"rel", strategy.StatusReleased}, {"due", strategy.StatusExpired}, {"conf", strategy.StatusConfirmed}, {"new", strategy.StatusHeld}} {
		what, st := w.what, w.st
		if !done[what] {
			continue
		}
		if got := status(key(what)); got != st {
			wrong = append(wrong, fmt.Sprintf("%s answered as done, but Lookup of its key says %s, want %s", callNames[what], got, st))
		}
	}
	au, err := soleAudit(ctx, dep, "after the calls whose first commit failed")
	if err != nil {
		t.Fatalf("%v", err)
	}
	if au.Drift() != 0 || au.Active > total {
		wrong = append(wrong, fmt.Sprintf("audit: total %d, available %d, active %d; want drift 0", au.Total, au.Available, au.Active))
	}
	if len(wrong) > 0 {
		t.Errorf("%d calls answered for more than the attempt that committed: %s", len(wrong), strings.Join(wrong, "; "))
	}
}
