package strategytest

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkSessionSeesGiveBack: an attempt held open sees a unit given back
// since its last request. On a SKU of 2 units, a plain request holds one;
// an attempt takes the other; the plain reservation is released outside
// the attempt (where the release does not wait for it); then the attempt
// asks for the SKU again, for another user: a unit is free, so not
// SOLD_OUT. An attempt that counts a SKU once and reuses the count ("it
// holds the SKU's lock") answers from before the release (outsider round
// 49's m18): no check asked twice in an attempt with a give-back between.
func checkSessionSeesGiveBack(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "session-give-back", 2)
	defer dep.Close()
	node := dep.Node(0)
	opener, ok := node.(strategy.SessionOpener)
	rel, releases := node.(strategy.Releaser)
	if !ok || !releases {
		t.Skip("no attempt held open (strategy.SessionOpener) or no Release")
	}
	plain := holdForCheck(ctx, t, node, strategy.Request{Key: "kit-give-back-plain-" + sku, User: "kit-give-back-plain", SKU: sku, TTL: time.Hour})
	s, backends := holdInSession(ctx, t, opener, strategy.Request{Key: "kit-give-back-a-" + sku, User: "kit-give-back-a", SKU: sku, TTL: time.Hour},
		"Session.Reserve of the second unit of a SKU of 2")
	defer func() { _ = s.Rollback(context.Background()) }()
	done := make(chan answer, 1)
	go func() {
		units, err := rel.Release(ctx, plain)
		done <- answer{res: strategy.Result{Reservation: strategy.Reservation{Key: plain}}, err: errUnits(units, err)}
	}()
	waited, err := awaitAnswerOrBlocked(ctx, admin, int32(backends[0]), done)
	if err != nil {
		t.Fatalf("read the lock waits: %v", err)
	}
	if waited {
		return // the release waits for the attempt: nothing came back to it
	}
	if a := <-done; a.err != nil {
		return // no unit came back
	}
	res, err := s.Reserve(ctx, strategy.Request{Key: "kit-give-back-b-" + sku, User: "kit-give-back-b", SKU: sku, TTL: time.Hour})
	if err == nil && res.Outcome == strategy.OutcomeSoldOut {
		t.Errorf("an attempt held open holding one unit of a SKU of 2 asked for it again after the other unit was released outside it: SOLD_OUT; want HELD (the attempt counted from before the release)")
	}
}

// errUnits is nil when a Release gave back exactly one unit, else why not.
func errUnits(units int, err error) error {
	switch {
	case err != nil:
		return err
	case units != 1:
		return errNotOneUnit
	}
	return nil
}

var errNotOneUnit = errors.New("the release gave back no unit")
