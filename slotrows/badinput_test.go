package slotrows_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
)

// TestBadInput: every malformed request, on the plain path and in a session,
// is BAD_REQUEST with a *strategy.RequestError naming the field and writes
// nothing; the session is still usable afterwards.
func TestBadInput(t *testing.T) {
	ctx := testCtx(t)
	db, admin := pgtest.Pools(t)
	const sku = "sku-lab-01"
	dep := deploy(t, db, 1, strategy.Stock{SKU: sku, Total: 3})
	valid := strategy.Request{Key: "req-bad", User: "user-0042", SKU: sku, TTL: time.Minute}
	cases := []struct {
		field string
		edit  func(*strategy.Request)
	}{
		{"key", func(r *strategy.Request) { r.Key = "" }},
		{"key", func(r *strategy.Request) { r.Key = strings.Repeat("k", strategy.MaxKeyLen+1) }},
		{"key", func(r *strategy.Request) { r.Key = "req-\xff" }},
		{"user", func(r *strategy.Request) { r.User = "" }},
		{"user", func(r *strategy.Request) { r.User = "user\x00x" }},
		{"sku", func(r *strategy.Request) { r.SKU = "" }},
		{"sku", func(r *strategy.Request) { r.SKU = "sku-nobody-sells" }},
		{"ttl", func(r *strategy.Request) { r.TTL = 0 }},
		{"ttl", func(r *strategy.Request) { r.TTL = strategy.MaxTTL + time.Second }},
	}
	sess, err := dep.Node(0).(strategy.SessionOpener).OpenSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Rollback(ctx) //nolint:errcheck
	for path, reserve := range map[string]func(strategy.Request) (strategy.Result, error){
		"Reserve":         func(r strategy.Request) (strategy.Result, error) { return dep.Node(0).Reserve(ctx, r) },
		"Session.Reserve": func(r strategy.Request) (strategy.Result, error) { return sess.Reserve(ctx, r) },
	} {
		for _, c := range cases {
			req := valid
			c.edit(&req)
			res, err := reserve(req)
			var rerr *strategy.RequestError
			if res.Outcome != strategy.OutcomeBadRequest || !errors.Is(err, strategy.ErrBadRequest) || !errors.As(err, &rerr) || rerr.Field != c.field {
				t.Errorf("%s(%+q): %+v, %v; want BAD_REQUEST naming %s", path, req, res, err, c.field)
			}
		}
	}
	if res, err := sess.Reserve(ctx, valid); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("a valid request in the same session: %+v, %v", res, err)
	}
	if err := sess.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var rows int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM slotrows_reservation`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if a := auditOf(t, dep, sku); rows != 1 || a.Active != 1 || a.Available != 2 {
		t.Errorf("%d reservation rows, audit %+v; want only the valid request's", rows, a)
	}
}
