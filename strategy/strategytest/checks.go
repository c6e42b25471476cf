package strategytest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkConfig: an invalid Config is refused with ErrConfig and writes
// nothing; a SKU cannot be opened twice; a fresh deployment audits clean;
// nodes can be restarted.
func checkConfig(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("cfg")
	bad := map[string]strategy.Config{
		"no database":                         {Resources: rs, Stock: []strategy.Stock{{SKU: sku, Total: 5}}},
		"no stock":                            {Resources: rs, DB: db},
		"negative total":                      {DB: db, Stock: []strategy.Stock{{SKU: sku, Total: -1}}},
		"sku twice":                           {DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 5}, {SKU: sku, Total: 5}}},
		"empty sku":                           {DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 5}, {SKU: "", Total: 5}}},
		"negative nodes":                      {DB: db, Nodes: -1, Stock: []strategy.Stock{{SKU: sku, Total: 5}}},
		"negative internal deadline":          {DB: db, InternalDeadline: -time.Second, Stock: []strategy.Stock{{SKU: sku, Total: 5}}},
		"shares that do not sum to the total": {DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: sku, Total: 5, Shares: []int{2, 2}}}},
		"shares for another node count":       {DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: sku, Total: 5, Shares: []int{5}}}},
	}
	for name, cfg := range bad {
		dep, err := meta.Open(ctx, cfg)
		if err == nil {
			_ = dep.Close()
			t.Errorf("Open with %s: no error, want one matching strategy.ErrConfig", name)
			continue
		}
		if !errors.Is(err, strategy.ErrConfig) {
			t.Errorf("Open with %s: %v, want an error matching strategy.ErrConfig", name, err)
		}
	}

	// A strategy that needs more than PostgreSQL refuses a config without
	// it, before writing anything.
	if len(meta.Needs) > 0 {
		dep, err := meta.Open(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 5}}})
		if err == nil {
			_ = dep.Close()
			t.Errorf("Open without Config.Resources: no error, want one matching strategy.ErrMissingResource (the strategy needs %v)", strategy.NeedsOf(meta))
		} else if !errors.Is(err, strategy.ErrMissingResource) || !errors.Is(err, strategy.ErrConfig) {
			t.Errorf("Open without Config.Resources: %v, want an error matching strategy.ErrMissingResource and strategy.ErrConfig", err)
		}
	}

	// Nothing was written: the SKU opens now.
	cfg := strategy.Config{Resources: rs, DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: sku, Total: 5}, {SKU: sku + "-b", Total: 0}}}
	dep, err := meta.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("Open after refused configs: %v (did a refused Open write stock?)", err)
	}
	defer dep.Close()

	again, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 7}}})
	if err == nil {
		_ = again.Close()
		t.Errorf("second Open of sku %s: no error, want strategy.ErrStockExists", sku)
	} else if !errors.Is(err, strategy.ErrStockExists) {
		t.Errorf("second Open of sku %s: %v, want strategy.ErrStockExists", sku, err)
	}
	// An Open refused for one SKU writes nothing, for any SKU: a new SKU
	// listed with an existing one opens afterwards on its own.
	fresh := kitSKU("cfg-fresh")
	mixed, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: fresh, Total: 2}, {SKU: sku, Total: 5}}})
	if err == nil {
		_ = mixed.Close()
		t.Errorf("Open of a new sku %s with the existing %s: no error, want strategy.ErrStockExists", fresh, sku)
	} else if !errors.Is(err, strategy.ErrStockExists) {
		t.Errorf("Open of a new sku %s with the existing %s: %v, want strategy.ErrStockExists", fresh, sku, err)
	}
	if alone, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: fresh, Total: 2}}}); err != nil {
		t.Errorf("Open of sku %s alone, after an Open that listed it with an existing SKU was refused: %v; want it to open (the refused Open must write nothing)", fresh, err)
	} else {
		_ = alone.Close()
	}

	checkAudit := func(when string, wantAvail, wantActive int) {
		t.Helper()
		list, err := dep.Audit(ctx)
		if err != nil {
			t.Fatalf("Audit %s: %v", when, err)
		}
		if len(list) != 2 {
			t.Fatalf("Audit %s: %d rows, want one per SKU of the deployment (2): %+v", when, len(list), list)
		}
		for _, a := range list {
			want := strategy.StockAudit{SKU: sku, Total: 5, Available: wantAvail, Active: wantActive}
			if a.SKU == sku+"-b" {
				want = strategy.StockAudit{SKU: sku + "-b"}
			}
			if a.SKU != want.SKU || a.Total != want.Total || a.Available != want.Available || a.Active != want.Active {
				t.Errorf("Audit %s: %+v, want total %d, available %d, active %d", when, a, want.Total, want.Available, want.Active)
			}
		}
	}
	checkAudit("of a fresh deployment", 5, 0)

	for i := 0; i < 2; i++ {
		if dep.Node(i) == nil {
			t.Fatalf("Node(%d) is nil", i)
		}
	}
	r, err := dep.Node(1).Lookup(ctx, "kit-no-such-key-"+sku)
	if err != nil || r.Status != strategy.StatusNotFound {
		t.Errorf("Lookup of an unknown key: %+v, %v; want StatusNotFound, nil", r, err)
	}

	res, err := dep.Node(0).Reserve(ctx, strategy.Request{Key: "kit-k1-" + sku, User: "kit-u1", SKU: sku, TTL: time.Minute})
	if err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("Reserve: %+v, %v; want HELD", res, err)
	}
	if res.Reservation.Key != "kit-k1-"+sku || res.Reservation.Status != strategy.StatusHeld || res.Reservation.User != "kit-u1" || res.Reservation.SKU != sku {
		t.Errorf("Reserve HELD: Result.Reservation %+v does not describe the new reservation", res.Reservation)
	}
	if res.Reservation.ExpiresAt.IsZero() {
		t.Errorf("Reserve HELD: Result.Reservation.ExpiresAt is zero")
	}
	replay, err := dep.Node(1).Reserve(ctx, strategy.Request{Key: "kit-k1-" + sku, User: "kit-u1", SKU: sku, TTL: time.Minute})
	if err != nil || replay.Outcome != strategy.OutcomeReplay || replay.Reservation.Status != strategy.StatusHeld {
		t.Errorf("Reserve again on another node: %+v, %v; want REPLAY with status HELD", replay, err)
	}
	none, err := dep.Node(0).Reserve(ctx, strategy.Request{Key: "kit-k2-" + sku, User: "kit-u2", SKU: sku + "-b", TTL: time.Minute})
	if err != nil || none.Outcome != strategy.OutcomeSoldOut {
		t.Errorf("Reserve on a SKU with 0 units: %+v, %v; want SOLD_OUT", none, err)
	}
	checkAudit("after one reservation", 4, 1)

	// A key PostgreSQL text cannot hold was never stored: a NUL byte, or
	// bytes that are not UTF-8 (strategy.Storable).
	for what, key := range map[string]string{"with a NUL byte": "kit-\x00-" + sku, "that is not UTF-8": "kit-\xff\xfe-" + sku} {
		if r, err := dep.Node(0).Lookup(ctx, key); err != nil || r.Status != strategy.StatusNotFound {
			t.Errorf("Lookup of a key %s: %+v, %v; want StatusNotFound, nil (strategy.Storable)", what, r, err)
		}
		if c, ok := dep.Node(0).(strategy.Confirmer); ok {
			if moved, err := c.Confirm(ctx, key, strategy.ConfirmUntilExpired); err != nil || moved {
				t.Errorf("Confirm of a key %s: %v, %v; want false, nil (strategy.Storable)", what, moved, err)
			}
		}
		if rel, ok := dep.Node(0).(strategy.Releaser); ok {
			if units, err := rel.Release(ctx, key); err != nil || units != 0 {
				t.Errorf("Release of a key %s: %d, %v; want 0, nil (strategy.Storable)", what, units, err)
			}
		}
	}

	// Node(i) out of range panics with strategy.ErrNodeRange, everywhere.
	for _, i := range []int{-1, 2} {
		checkNodeRange(t, dep, i)
	}
	// Every node has the capabilities of node 0.
	caps := strategy.Probe(meta, dep)
	if other := strategy.ProbeNode(dep.Node(1)); other != strategy.ProbeNode(dep.Node(0)) {
		t.Errorf("node 1 has capabilities %+v, node 0 %+v: every node of a deployment must have the same", other, strategy.ProbeNode(dep.Node(0)))
	}
	checkScope(ctx, t, meta, db, rs, dep, sku, "kit-u1")
	checkClosedDeployment(ctx, t, meta, db, rs)

	// A second process attaches to the same stock: nothing written, same state.
	if caps.Attach {
		attached, err := meta.Attach(ctx, strategy.Config{Resources: rs, DB: db, Nodes: 2, Stock: cfg.Stock})
		if err != nil {
			t.Fatalf("Attach over existing stock: %v", err)
		}
		if got, err := attached.Node(1).Lookup(ctx, "kit-k1-"+sku); err != nil || got.Status != strategy.StatusHeld {
			t.Errorf("Lookup through an attached deployment: %+v, %v; want HELD", got, err)
		}
		if err := attached.Close(); err != nil {
			t.Errorf("Close of the attached deployment: %v", err)
		}
		checkAudit("after another deployment attached", 4, 1)
		// The SKU at fault comes second, after one that attaches (outsider
		// round 50: an Attach that checked the first SKU alone passed).
		if d, err := meta.Attach(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 5}, {SKU: kitSKU("never-loaded"), Total: 1}}}); err == nil {
			_ = d.Close()
			t.Errorf("Attach over a SKU that has no stock (after one that has): no error, want strategy.ErrConfig")
		} else if !errors.Is(err, strategy.ErrConfig) {
			t.Errorf("Attach over a SKU that has no stock (after one that has): %v, want strategy.ErrConfig", err)
		}
		// Another total, more or less (outsider round 49: an Attach that
		// refused only a larger one passed), and every config Open refuses
		// (round 49: an Attach that checked the totals but not the config
		// itself attached with a SKU listed twice, or negative nodes).
		for _, total := range []int{6, 4} {
			if d, err := meta.Attach(ctx, strategy.Config{Resources: rs, DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: sku + "-b", Total: 0}, {SKU: sku, Total: total}}}); err == nil {
				_ = d.Close()
				t.Errorf("Attach with total %d, where the stock was loaded with 5: no error, want strategy.ErrConfig", total)
			} else if !errors.Is(err, strategy.ErrConfig) {
				t.Errorf("Attach with total %d, where the stock was loaded with 5: %v, want strategy.ErrConfig", total, err)
			}
		}
		for name, cfg := range bad {
			if d, err := meta.Attach(ctx, cfg); err == nil {
				_ = d.Close()
				t.Errorf("Attach with %s: no error, want one matching strategy.ErrConfig", name)
			} else if !errors.Is(err, strategy.ErrConfig) {
				t.Errorf("Attach with %s: %v, want an error matching strategy.ErrConfig", name, err)
			}
		}
	} else {
		t.Logf("strategy does not set Meta.Attach: kill-release and kill-reserve are not applicable")
	}

	if !caps.Restart {
		t.Logf("deployment does not implement strategy.Restarter: restart and node-death are not applicable")
		return
	}
	for _, i := range []int{-1, 2} {
		checkRestartRange(ctx, t, dep, i, "kit-k1-"+sku)
	}
	old := dep.Node(0)
	for i := 0; i < 2; i++ {
		if err := dep.(strategy.Restarter).Restart(ctx, i); err != nil {
			t.Fatalf("Restart(%d): %v", i, err)
		}
	}
	checkClosedNode(ctx, t, old, "a node that was restarted", "kit-k1-"+sku, strategy.Request{Key: "kit-k3-" + sku, User: "kit-u3", SKU: sku, TTL: time.Minute})
	got, err := dep.Node(0).Lookup(ctx, "kit-k1-"+sku)
	if err != nil || got.Status != strategy.StatusHeld {
		t.Errorf("Lookup after restarting every node: %+v, %v; want HELD", got, err)
	}
	if meta.Claims.Has(strategy.SurvivesRestart) {
		checkAudit("after restarting every node", 4, 1)
	} // otherwise what a restart does to the counts is the restart scenario's to report
}

// checkClosedDeployment: the nodes of a closed deployment answer
// ErrNodeClosed.
func checkClosedDeployment(ctx context.Context, t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "closed", 2)
	node := dep.Node(0)
	known := strategy.Request{Key: "kit-closed-1-" + sku, User: "kit-closed-1", SKU: sku, TTL: time.Hour}
	if res, err := reserveUnlessBusy(ctx, node, known); err != nil || res.Outcome != strategy.OutcomeHeld {
		_ = dep.Close()
		t.Fatalf("Reserve on a fresh SKU of 2: %s, %v; want HELD", res.Outcome, err)
	}
	if err := dep.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	checkClosedNode(ctx, t, node, "a node of a closed deployment", known.Key,
		strategy.Request{Key: "kit-closed-2-" + sku, User: "kit-closed-2", SKU: sku, TTL: time.Hour})
	checkCloseKeepsData(ctx, t, meta, db, rs, sku, known.Key)
}

// checkCloseKeepsData: Close stops a deployment's process, nothing more.
// The reservation it made is HELD for every other reader, and its unit is
// still the holder's: a Close that releases its nodes' holds ("graceful
// shutdown") takes the unit from a customer who is paying for it, while
// the service's other processes (Attach) keep serving.
func checkCloseKeepsData(ctx context.Context, t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string, sku, key string) {
	t.Helper()
	reader, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: kitSKU("closed-reader"), Total: 1}}})
	if err != nil {
		t.Fatalf("Open of a deployment beside the closed one: %v", err)
	}
	defer reader.Close()
	if r, err := reader.Node(0).Lookup(ctx, key); err != nil || r.Status != strategy.StatusHeld {
		t.Errorf("Lookup, through another deployment, of %s, which the closed deployment made HELD: %s, %v; want HELD (Close changes no data)", key, r.Status, err)
	}
	if meta.Attach == nil {
		return
	}
	again, err := meta.Attach(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 2}}})
	if err != nil {
		t.Fatalf("Attach to the closed deployment's stock: %v", err)
	}
	defer again.Close()
	// A process that starts from its configured share (memquota, which
	// does not claim survives-restart) counts its units afresh; the rows
	// are the same for everyone.
	wantAvail := "any"
	if meta.Claims.Has(strategy.SurvivesRestart) {
		wantAvail = "1"
	}
	if list, err := again.Audit(ctx); err != nil || len(list) != 1 || list[0].Active != 1 || wantAvail == "1" && list[0].Available != 1 {
		t.Errorf("Audit, through a process attached after Close, of the SKU of 2 with one HELD: %+v, %v; want active 1, available %s (Close changes no data)", list, err, wantAvail)
	}
}

// checkClosedNode: every method of a node that was restarted, or whose
// deployment was closed, answers ErrNodeClosed. A Lookup answered from the
// old node's memory (a cache of what it sold) would be an answer about a
// state the node no longer follows; the caller must ask the deployment for
// the current node. known is a key the node has seen HELD.
func checkClosedNode(ctx context.Context, t tester, node strategy.Strategy, what, known string, req strategy.Request) {
	t.Helper()
	closed := func(method string, err error) {
		if !errors.Is(err, strategy.ErrNodeClosed) {
			t.Errorf("%s on %s: %v, want an error matching strategy.ErrNodeClosed", method, what, err)
		}
	}
	_, err := node.Reserve(ctx, req)
	closed("Reserve", err)
	_, err = node.Lookup(ctx, known)
	closed("Lookup", err)
	if c, ok := node.(strategy.Confirmer); ok {
		_, err = c.Confirm(ctx, known, strategy.ConfirmUntilExpired)
		closed("Confirm", err)
	}
	if r, ok := node.(strategy.Releaser); ok {
		_, err = r.Release(ctx, known)
		closed("Release", err)
	}
	if e, ok := node.(strategy.Expirer); ok {
		_, err = e.ExpireDue(ctx)
		closed("ExpireDue", err)
	}
	if o, ok := node.(strategy.SessionOpener); ok {
		s, err := o.OpenSession(ctx)
		if err == nil {
			_ = s.Rollback(ctx)
		}
		closed("OpenSession", err)
	}
}

// checkNodeRange: Node(i) out of range panics with strategy.ErrNodeRange.
func checkNodeRange(t tester, dep strategy.Deployment, i int) {
	t.Helper()
	defer func() {
		r := recover()
		err, _ := r.(error)
		if !errors.Is(err, strategy.ErrNodeRange) {
			t.Errorf("Node(%d) of a 2-node deployment: recovered %v, want a panic with an error matching strategy.ErrNodeRange (strategy.CheckNode)", i, r)
		}
	}()
	dep.Node(i)
}

// checkRestartRange: Restart(i) out of range answers an error matching
// strategy.ErrNodeRange, as Node(i) panics with one, and restarts nothing:
// both nodes still answer (outsider round 50's m39 panicked with Go's own
// index error, which the kit had never asked about).
func checkRestartRange(ctx context.Context, t tester, dep strategy.Deployment, i int, known string) {
	t.Helper()
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panicked: %v", r)
			}
		}()
		return dep.(strategy.Restarter).Restart(ctx, i)
	}()
	if !errors.Is(err, strategy.ErrNodeRange) {
		t.Errorf("Restart(%d) of a 2-node deployment: %v, want an error matching strategy.ErrNodeRange (strategy.Restarter)", i, err)
	}
	for n := 0; n < 2; n++ {
		if got, err := dep.Node(n).Lookup(ctx, known); err != nil || got.Status != strategy.StatusHeld {
			t.Errorf("Lookup on node %d after Restart(%d) of a 2-node deployment: %+v, %v; want HELD: a bad index restarts nothing (strategy.Restarter)", n, i, got, err)
		}
	}
}

// checkSession: a held-open attempt is invisible until Commit, gone after
// Rollback, and Rollback after Commit is harmless.
func checkSession(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("sess")
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 3}}})
	if err != nil {
		t.Fatal(err)
	}
	defer dep.Close()
	opener, ok := dep.Node(0).(strategy.SessionOpener)
	if !ok {
		t.Skip("strategy does not implement strategy.SessionOpener: interleavings are skipped")
	}
	avail := func() int {
		t.Helper()
		list, err := dep.Audit(ctx)
		if err != nil || len(list) != 1 {
			t.Fatalf("Audit: %+v, %v", list, err)
		}
		return list[0].Available
	}
	status := func(key string) strategy.Status {
		t.Helper()
		r, err := dep.Node(0).Lookup(ctx, key)
		if err != nil {
			t.Fatalf("Lookup: %v", err)
		}
		return r.Status
	}

	for _, end := range []string{"commit", "rollback"} {
		key := "kit-" + end + "-" + sku
		s, err := opener.OpenSession(ctx)
		if err != nil {
			t.Fatalf("OpenSession: %v", err)
		}
		if len(s.Backends()) == 0 {
			t.Logf("session reports no backends: the harness cannot see it blocked in PostgreSQL")
		}
		res, err := s.Reserve(ctx, strategy.Request{Key: key, User: "kit-" + end, SKU: sku, TTL: time.Minute})
		if err != nil || res.Outcome != strategy.OutcomeHeld {
			_ = s.Rollback(ctx)
			t.Fatalf("Session.Reserve: %+v, %v; want HELD", res, err)
		}
		if st := status(key); st != strategy.StatusNotFound {
			t.Errorf("%s: an uncommitted attempt is visible to Lookup as %s", end, st)
		}
		before := avail()
		if end == "commit" {
			if err := s.Commit(ctx); err != nil {
				t.Fatalf("Commit: %v", err)
			}
			if err := s.Rollback(ctx); err != nil {
				t.Errorf("Rollback after Commit: %v, want nil (a no-op)", err)
			}
			if _, err := s.Reserve(ctx, strategy.Request{Key: key + "-late", User: "kit-late", SKU: sku, TTL: time.Minute}); !errors.Is(err, strategy.ErrSessionEnded) {
				t.Errorf("Session.Reserve after Commit: %v, want an error matching strategy.ErrSessionEnded", err)
			}
			if err := s.Commit(ctx); !errors.Is(err, strategy.ErrSessionEnded) {
				t.Errorf("Commit after Commit: %v, want an error matching strategy.ErrSessionEnded", err)
			}
			if st := status(key); st != strategy.StatusHeld {
				t.Errorf("after Commit: Lookup says %s, want HELD", st)
			}
			continue
		}
		if err := s.Rollback(ctx); err != nil {
			t.Fatalf("Rollback: %v", err)
		}
		if st := status(key); st != strategy.StatusNotFound {
			t.Errorf("after Rollback: Lookup says %s, want NOT_FOUND", st)
		}
		if got := avail(); got != before+1 && got != before {
			t.Errorf("after Rollback: available %d, was %d", got, before)
		}
	}
	if got := avail(); got != 2 {
		t.Errorf("after one committed and one rolled-back attempt on 3 units: available %d, want 2", got)
	}

	// A session refuses what Reserve refuses: a SKU no deployment loaded,
	// one another deployment loaded (whose units it would sell), a
	// malformed request. Each is BAD_REQUEST and writes nothing.
	otherSKU := kitSKU("sess-other")
	other, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: otherSKU, Total: 1}}})
	if err != nil {
		t.Fatalf("Open of a second deployment: %v", err)
	}
	defer other.Close()
	for _, c := range []struct {
		what string
		req  strategy.Request
	}{
		{"a SKU no deployment loaded", strategy.Request{Key: "kit-sess-unknown-" + sku, User: "kit-sess-bad", SKU: sku + "-unknown", TTL: time.Minute}},
		{"a SKU another deployment loaded", strategy.Request{Key: "kit-sess-other-" + sku, User: "kit-sess-bad", SKU: otherSKU, TTL: time.Minute}},
		{"an empty key", strategy.Request{User: "kit-sess-bad", SKU: sku, TTL: time.Minute}},
	} {
		s, err := opener.OpenSession(ctx)
		if err != nil {
			t.Fatalf("OpenSession: %v", err)
		}
		res, err := s.Reserve(ctx, c.req)
		if err := s.Commit(ctx); err != nil && !errors.Is(err, strategy.ErrSessionEnded) {
			t.Logf("Commit after a refused Session.Reserve: %v", err)
		}
		if res.Outcome != strategy.OutcomeBadRequest || !errors.Is(err, strategy.ErrBadRequest) {
			t.Errorf("Session.Reserve for %s: %s, %v; want BAD_REQUEST (strategy.ErrBadRequest)", c.what, res.Outcome, err)
		}
	}
	if list, err := other.Audit(ctx); err != nil || len(list) != 1 || list[0].Available != 1 || list[0].Active != 0 {
		t.Errorf("the other deployment after sessions of this one asked for its SKU: %+v, %v; want its 1 unit available", list, err)
	}
	if got := avail(); got != 2 {
		t.Errorf("after refused session requests: available %d, want 2", got)
	}
}

// checkScope: Confirm, Release and ExpireDue of one deployment touch only
// its own SKUs, while another deployment shares the database (the table
// runs many at once in one database; a service runs one per SKU group).
//
// mine is a SKU of dep with units left, and mine+"-b" one without; holder
// holds a reservation of mine.
func checkScope(ctx context.Context, t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string, dep strategy.Deployment, mine, holder string) {
	t.Helper()
	sku := kitSKU("scope")
	other, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 3}}})
	if err != nil {
		t.Fatalf("Open of a second deployment beside the first: %v", err)
	}
	defer other.Close()
	keys := []string{"kit-scope-1-" + sku, "kit-scope-2-" + sku}
	for i, k := range keys {
		res, err := other.Node(0).Reserve(ctx, strategy.Request{Key: k, User: fmt.Sprintf("kit-scope-%d", i), SKU: sku, TTL: time.Minute})
		if err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Fatalf("Reserve on the second deployment: %+v, %v; want HELD", res, err)
		}
	}
	if c, ok := dep.Node(0).(strategy.Confirmer); ok {
		for _, mode := range []strategy.ConfirmMode{strategy.ConfirmBeforeExpiry, strategy.ConfirmUntilExpired} {
			if moved, err := c.Confirm(ctx, keys[0], mode); err != nil || moved {
				t.Errorf("Confirm (mode %d) of another deployment's reservation: moved %v, %v; want false, nil", mode, moved, err)
			}
		}
	}
	if r, ok := dep.Node(0).(strategy.Releaser); ok {
		if units, err := r.Release(ctx, keys[0]); err != nil || units != 0 {
			t.Errorf("Release of another deployment's reservation: %d units, %v; want 0, nil", units, err)
		}
	}
	if a, ok := other.(strategy.Ager); ok {
		expirer, isExpirer := dep.Node(0).(strategy.Expirer)
		// The expiry job held open too (a maintenance sweep in a
		// transaction): outsider round 22's sweepmem and sweepall left its
		// SKU filter out and were caught only when other checks'
		// deployments happened to share the database.
		sessions, isSessions := dep.Node(0).(strategy.ExpirySessionOpener)
		if isExpirer || isSessions {
			if n, err := a.MakeDue(ctx, keys[1:]); err != nil || n != 1 {
				t.Fatalf("MakeDue on the second deployment: %d, %v; want 1", n, err)
			}
		}
		if isExpirer {
			if units, err := expirer.ExpireDue(ctx); err != nil || units != 0 {
				t.Errorf("ExpireDue beside another deployment's due reservation: %d units, %v; want 0, nil", units, err)
			}
		}
		if isSessions {
			es, err := sessions.OpenExpirySession(ctx)
			if err != nil {
				t.Fatalf("OpenExpirySession: %v", err)
			}
			units, err := es.ExpireDue(ctx)
			if cerr := es.Commit(ctx); err == nil {
				err = cerr
			}
			if err != nil || units != 0 {
				t.Errorf("ExpireDue held open (then committed) beside another deployment's due reservation: %d units, %v; want 0, nil", units, err)
			}
		}
	}
	// A SKU is the deployment's when its config lists it, not when the
	// database has stock for it: a request for the other deployment's SKU
	// is BAD_REQUEST, and sells none of its units.
	stray := strategy.Request{Key: "kit-scope-stray-" + sku, User: "kit-scope-stray", SKU: sku, TTL: time.Minute}
	if res, err := dep.Node(0).Reserve(ctx, stray); res.Outcome != strategy.OutcomeBadRequest || !errors.Is(err, strategy.ErrBadRequest) {
		t.Errorf("Reserve for a SKU another deployment loaded: %s, %v; want BAD_REQUEST (strategy.UnknownSKU)", res.Outcome, err)
	}
	if r, err := other.Node(0).Lookup(ctx, stray.Key); err != nil || r.Status != strategy.StatusNotFound {
		t.Errorf("Reserve for a SKU another deployment loaded wrote %s, %v; want nothing", r.Status, err)
	}
	// So is a known key sent for it: the SKU is checked before the key.
	known := strategy.Request{Key: keys[0], User: "kit-scope-0", SKU: sku, TTL: time.Minute}
	if res, err := dep.Node(0).Reserve(ctx, known); res.Outcome != strategy.OutcomeBadRequest || !errors.Is(err, strategy.ErrBadRequest) {
		t.Errorf("Reserve on the first deployment of the second's key %s, by its user, for the second's SKU: %s, %v; want BAD_REQUEST (strategy.UnknownSKU): the SKU is not this deployment's, whatever the key", known.Key, res.Outcome, err)
	}
	// Reserve knows a key whatever deployment made it, as Lookup does: the
	// other deployment's key sent here, by another user, for a SKU of this
	// deployment with units left, with none, and by a user who holds that
	// SKU, is KEY_REUSED with the reservation that owns it, and writes
	// nothing (a known-key lookup limited to the deployment's own SKUs
	// finds no owner, then meets the key in the unique index).
	for _, req := range []strategy.Request{
		{Key: keys[0], User: "kit-scope-stranger", SKU: mine, TTL: time.Minute},
		{Key: keys[0], User: "kit-scope-stranger", SKU: mine + "-b", TTL: time.Minute},
		{Key: keys[0], User: holder, SKU: mine, TTL: time.Minute},
	} {
		res, err := dep.Node(0).Reserve(ctx, req)
		if err != nil || res.Outcome != strategy.OutcomeKeyReused || res.Reservation.User != "kit-scope-0" || res.Reservation.SKU != sku {
			t.Errorf("Reserve on the first deployment of %s, which the second made for user kit-scope-0 and SKU %q, by user %q for SKU %q: %s (owner user %q, SKU %q), %v; want KEY_REUSED with the owner (Reserve knows a key whatever deployment made it)",
				keys[0], sku, req.User, req.SKU, res.Outcome, res.Reservation.User, res.Reservation.SKU, err)
		}
	}
	for _, k := range keys {
		if r, err := other.Node(0).Lookup(ctx, k); err != nil || r.Status != strategy.StatusHeld {
			t.Errorf("%s, after the first deployment's Confirm, Release, ExpireDue and Reserve: %s, %v; want HELD", k, r.Status, err)
		}
	}
	if list, err := other.Audit(ctx); err != nil || len(list) != 1 || list[0].Available != 1 || list[0].Active != 2 {
		t.Errorf("Audit of the second deployment: %+v, %v; want available 1, active 2", list, err)
	}
	// Lookup finds a key whatever deployment made it: keys are the
	// clients', one namespace in the database, as Reserve's KEY_REUSED
	// across deployments shows.
	if r, err := dep.Node(0).Lookup(ctx, keys[0]); err != nil || r.Status != strategy.StatusHeld || r.SKU != sku {
		t.Errorf("Lookup on the first deployment of %s, which the second made: %s for %q, %v; want HELD for %q (Lookup finds a key whatever deployment made it)", keys[0], r.Status, r.SKU, err, sku)
	}
	// MakeDue too touches only the deployment's own SKUs: outsider round
	// 55's m27 aged another deployment's hold, which that deployment's job
	// then expired.
	if a, ok := dep.(strategy.Ager); ok {
		if n, err := a.MakeDue(ctx, keys[:1]); err != nil || n != 0 {
			t.Errorf("MakeDue on the first deployment of the second's reservation %s: %d, %v; want 0, nil", keys[0], n, err)
		}
		if e, ok := other.Node(0).(strategy.Expirer); ok {
			if _, err := e.ExpireDue(ctx); err != nil {
				t.Fatalf("ExpireDue on the second deployment: %v", err)
			}
			if r, err := other.Node(0).Lookup(ctx, keys[0]); err != nil || r.Status != strategy.StatusHeld {
				t.Errorf("%s (TTL a minute), after the first deployment's MakeDue of it and the second's expiry job: %s, %v; want HELD", keys[0], r.Status, err)
			}
		}
	}
}

// checkAttachBesideAttempt: a process that attaches while an attempt is
// held open on the stock (a service's second process starting during a
// request) changes nothing the attempt then commits: the SKU sells no
// more than its total. An Attach that recounts, or "heals", the stock
// from what it reads writes a count from before the commit. The kit
// attaches elsewhere only with nothing in flight, where a recount is
// right.
func checkAttachBesideAttempt(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("attach-beside")
	const total = 1
	cfg := strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: sku, Total: total}}}
	dep, opener := openToAttachBeside(ctx, t, meta, cfg)
	defer dep.Close()
	session, holder := holdInSession(ctx, t, opener, strategy.Request{Key: "kit-attach-beside-1-" + sku, User: "kit-attach-beside-1", SKU: sku, TTL: time.Hour},
		"the attempt held open")
	defer func() { _ = session.Rollback(ctx) }()
	type attached struct {
		dep strategy.Deployment
		err error
	}
	done := make(chan attached, 1)
	go func() {
		d, err := meta.Attach(ctx, cfg)
		done <- attached{d, err}
	}()
	// Attach either returns or waits for the attempt (pg_blocking_pids);
	// then the attempt commits.
	if _, err := awaitAnswerOrBlocked(ctx, admin, int32(holder[0]), done); err != nil {
		t.Fatalf("Attach beside the attempt: %v", err)
	}
	if err := session.Commit(ctx); err != nil {
		t.Fatalf("Commit of the attempt: %v", err)
	}
	second := <-done
	if second.err != nil {
		t.Fatalf("Attach beside an attempt held open: %v", second.err)
	}
	defer second.dep.Close()
	held := 1
	for i := 2; i <= 3; i++ {
		res, err := reserveUnlessBusy(ctx, second.dep.Node(0), strategy.Request{Key: fmt.Sprintf("kit-attach-beside-%d-%s", i, sku), User: fmt.Sprintf("kit-attach-beside-%d", i), SKU: sku, TTL: time.Hour})
		if err != nil {
			t.Fatalf("Reserve on the attached process: %v", err)
		}
		if res.Outcome == strategy.OutcomeHeld {
			held++
		}
	}
	list, err := second.dep.Audit(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("Audit: %+v, %v", list, err)
	}
	if a := list[0]; held > total || a.Active > total {
		t.Errorf("SKU of %d unit: an attempt held open took it and committed while a second process attached; then that process answered HELD to %d more requests, audit %+v; want none (Attach changes nothing)", total, held-1, a)
	}
}

// openToAttachBeside opens cfg for a check that attaches a second process
// beside an attempt held open in the first, and returns the deployment (the
// caller closes it) and node 0's SessionOpener. It skips a strategy without
// Attach or attempts held open, and one whose nodes count the stock in a
// process's memory, one process a node: a second live process for the same
// node is outside its model (the kit attaches one only after the first has
// gone).
func openToAttachBeside(ctx context.Context, t tester, meta strategy.Meta, cfg strategy.Config) (strategy.Deployment, strategy.SessionOpener) {
	t.Helper()
	if meta.Attach == nil {
		t.Skip("no Meta.Attach")
	}
	dep, err := meta.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	skip := ""
	opener, ok := dep.Node(0).(strategy.SessionOpener)
	if _, inMemory := dep.(strategy.ReserveCrasher); inMemory {
		skip = "the stock is counted in a node process's memory (strategy.ReserveCrasher): one live process a node"
	} else if !ok {
		skip = "no attempt held open (strategy.SessionOpener)"
	}
	if skip != "" {
		dep.Close()
		t.Skip(skip)
	}
	return dep, opener
}
