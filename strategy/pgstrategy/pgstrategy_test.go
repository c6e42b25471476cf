package pgstrategy_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

func TestPgbenchScript(t *testing.T) {
	got := pgstrategy.PgbenchScript(
		`\set first 1`,
		"begin",
		"  "+pgstrategy.PgbenchSQL("INSERT INTO t VALUES ($1, $12, $2) RETURNING id", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l")+` \gset`,
		pgstrategy.PgbenchSQL("UPDATE t SET x = $2 WHERE id = $1\n", "id", "x"),
		"commit",
	)
	want := `\set first 1
begin;
INSERT INTO t VALUES (:a, :l, :b) RETURNING id \gset
UPDATE t SET x = :x WHERE id = :id;
commit;
`
	if got != want {
		t.Errorf("script:\n%s\nwant:\n%s", got, want)
	}
}

type fakeNode struct {
	strategy.Strategy
	h *pgstrategy.Handle
}

func TestHandles(t *testing.T) {
	ctx := context.Background()
	hs := pgstrategy.NewHandles("fake", 2, func(h *pgstrategy.Handle) strategy.Strategy { return &fakeNode{h: h} })
	old := hs.Node(1).(*fakeNode)
	if err := old.h.Check(); err != nil {
		t.Fatalf("a new node: %v", err)
	}
	if err := hs.Restart(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := old.h.Check(); !errors.Is(err, strategy.ErrNodeClosed) {
		t.Errorf("the restarted node's old handle: %v, want ErrNodeClosed", err)
	}
	if hs.Node(1) == strategy.Strategy(old) || hs.Node(1).(*fakeNode).h.Check() != nil {
		t.Errorf("Restart did not put a live node in place")
	}
	if err := hs.Restart(ctx, 2); !errors.Is(err, strategy.ErrNodeRange) {
		t.Errorf("Restart(2) of 2: %v, want ErrNodeRange", err)
	}
	func() {
		defer func() {
			if err, _ := recover().(error); !errors.Is(err, strategy.ErrNodeRange) {
				t.Errorf("Node(-1) panicked with %v, want ErrNodeRange", err)
			}
		}()
		hs.Node(-1)
	}()
	if err := hs.Close(); err != nil {
		t.Fatal(err)
	}
	if err := hs.Node(0).(*fakeNode).h.Check(); !errors.Is(err, strategy.ErrNodeClosed) {
		t.Errorf("after Close: %v, want ErrNodeClosed", err)
	}
	if err := hs.Restart(ctx, 0); !errors.Is(err, strategy.ErrNodeClosed) {
		t.Errorf("Restart after Close: %v, want ErrNodeClosed", err)
	}
}

func TestHandleChecks(t *testing.T) {
	var h pgstrategy.Handle
	skus := pgstrategy.NewSKUs(strategy.Config{Stock: []strategy.Stock{{SKU: "a", Total: 3}}})
	req := strategy.Request{Key: "k", User: "u", SKU: "a", TTL: time.Minute}
	if _, err := h.Admit(skus, req); err != nil {
		t.Errorf("Admit of a valid request: %v", err)
	}
	other := req
	other.SKU = "b"
	if res, err := h.Admit(skus, other); !errors.Is(err, strategy.ErrBadRequest) || res.Outcome != strategy.OutcomeBadRequest {
		t.Errorf("Admit of an unknown SKU: %+v, %v; want BAD_REQUEST", res, err)
	}
	if ok, err := h.CheckKey("k\x00"); ok || err != nil {
		t.Errorf("CheckKey of a key with NUL: %v, %v; want not ok, no error", ok, err)
	}
	h.MarkClosed()
	if ok, err := h.CheckKey("k"); ok || !errors.Is(err, strategy.ErrNodeClosed) {
		t.Errorf("CheckKey on a closed node: %v, %v; want ErrNodeClosed", ok, err)
	}
	if res, err := h.Admit(skus, req); !errors.Is(err, strategy.ErrNodeClosed) || res.Outcome != "" {
		t.Errorf("Admit on a closed node: %+v, %v; want ErrNodeClosed", res, err)
	}
}

func TestKnownKey(t *testing.T) {
	req := strategy.Request{Key: "k", User: "u", SKU: "a", TTL: time.Minute}
	r := strategy.Reservation{Key: "k", User: "u", SKU: "a", Status: strategy.StatusConfirmed}
	if got := pgstrategy.KnownKey(req, r); got.Outcome != strategy.OutcomeReplay || got.Reservation != r {
		t.Errorf("same user and SKU: %+v, want REPLAY of %+v", got, r)
	}
	r.User = "v"
	if got := pgstrategy.KnownKey(req, r); got.Outcome != strategy.OutcomeKeyReused || got.Reservation != r {
		t.Errorf("another user: %+v, want KEY_REUSED with %+v", got, r)
	}
}
