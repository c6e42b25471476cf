package slotrows_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/slotrows"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

// testCtx is a context that ends with the test (and after a minute at most),
// so that a step that blocks by mistake fails the test instead of hanging it.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// deploy opens strategy B (LowestFirst) over db with nodes nodes.
func deploy(t testing.TB, db *pgxpool.Pool, nodes int, stock ...strategy.Stock) strategy.Deployment {
	t.Helper()
	return deployWith(t, slotrows.Meta(), db, nodes, stock...)
}

func deployWith(t testing.TB, meta strategy.Meta, db *pgxpool.Pool, nodes int, stock ...strategy.Stock) strategy.Deployment {
	t.Helper()
	dep, err := meta.Open(testCtx(t), strategy.Config{DB: db, Nodes: nodes, Stock: stock})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = dep.Close() })
	return dep
}

// auditOf returns the audit of one SKU and checks that it balances.
func auditOf(t testing.TB, dep strategy.Deployment, sku string) strategy.StockAudit {
	t.Helper()
	list, err := dep.Audit(testCtx(t))
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	for _, a := range list {
		if a.SKU == sku {
			if a.Drift() != 0 || a.Oversold() != 0 {
				t.Errorf("audit of %s: %+v: drift %d, oversold %d", sku, a, a.Drift(), a.Oversold())
			}
			return a
		}
	}
	t.Fatalf("Audit: no row for %s in %+v", sku, list)
	return strategy.StockAudit{}
}

func request(name, user, sku string) strategy.Request {
	return strategy.Request{Key: "req-" + name, User: "user-" + user, SKU: sku, TTL: strategy.TTLForever}
}

// reserveAll sends reqs at once, request i to node i, and returns the
// answers in order. Every request must get an answer.
func reserveAll(t testing.TB, dep strategy.Deployment, nodes int, reqs []strategy.Request) []strategy.Result {
	t.Helper()
	ctx := testCtx(t)
	out := make([]strategy.Result, len(reqs))
	errs := make([]error, len(reqs))
	strategytest.Together(len(reqs), func(i int) {
		out[i], errs[i] = dep.Node(i%nodes).Reserve(ctx, reqs[i])
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("request %s: %v", reqs[i].Key, err)
		}
	}
	return out
}

// count tallies outcomes.
func count(results []strategy.Result) map[strategy.Outcome]int {
	m := map[strategy.Outcome]int{}
	for _, r := range results {
		m[r.Outcome]++
	}
	return m
}

func outcomes(m map[strategy.Outcome]int) string {
	s := ""
	for _, o := range strategy.Outcomes {
		if m[o] > 0 {
			s += fmt.Sprintf(" %s=%d", o, m[o])
		}
	}
	return "{" + s + " }"
}
