package ssicount

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
)

// TestPhantomOrderingNeitherWaitsNorSellsOut plays seed C28-14 by hand,
// since the kit's phantom interleaving needs a strategy.SessionOpener: 2
// units, t1 reserves inside a transaction it holds open, then t2 and t3
// reserve. Neither waits for t1 and neither is told SOLD_OUT (the package
// doc's no-wait and no-phantom-sold-out claims). What t1 did is then lost
// either way: rolled back (the seed's ending), or refused at COMMIT with
// 40001 because t2 and t3 committed first, so nothing is oversold.
func TestPhantomOrderingNeitherWaitsNorSellsOut(t *testing.T) {
	db, _ := pgtest.Pools(t)
	for _, end := range []string{"rollback", "commit"} {
		t.Run("t1 "+end, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			sku := fmt.Sprintf("phantom-%s-%d", end, time.Now().UnixNano())
			dep := open(t, ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 2}}})
			req := func(name string) strategy.Request {
				return strategy.Request{Key: sku + "-" + name, User: name, SKU: sku, TTL: time.Minute}
			}

			t1, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
			if err != nil {
				t.Fatal(err)
			}
			defer t1.Rollback(ctx)
			if res, err := decide(ctx, t1, req("t1")); err != nil || res.Outcome != strategy.OutcomeHeld {
				t.Fatalf("t1 inside its transaction: %+v, %v; want HELD", res, err)
			}

			for _, name := range []string{"t2", "t3"} {
				// Were t2 or t3 to wait for t1, they would wait until this
				// deadline: t1 stays open until both have answered.
				rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
				start := time.Now()
				res, err := dep.Node(0).Reserve(rctx, req(name))
				rcancel()
				if err != nil || res.Outcome != strategy.OutcomeHeld {
					t.Fatalf("%s while t1 is open: %+v, %v (after %v); want HELD without waiting", name, res, err, time.Since(start))
				}
				t.Logf("%s HELD in %v while t1 was open", name, time.Since(start).Round(time.Microsecond))
			}

			if end == "rollback" {
				if err := t1.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
			} else {
				err := t1.Commit(ctx)
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
					t.Fatalf("t1 COMMIT after t2 and t3 took both units: %v; want SQLSTATE 40001", err)
				}
				t.Logf("t1 COMMIT refused: %v", err)
			}
			audit := auditOne(t, ctx, dep)
			if audit.Active != 2 || audit.Available != 0 {
				t.Errorf("after t1's %s: %+v; want 2 active, 0 free", end, audit)
			}
		})
	}
}

// TestConflictIsNotAboutStock shows the cost in the package doc's boundary:
// SSI aborts on the overlap of reads and writes, not on the stock. With 2
// units, t1 held open and t2 both fit, yet t1's COMMIT is refused; the plain
// Reserve would have run it again and got the second unit.
func TestConflictIsNotAboutStock(t *testing.T) {
	db, _ := pgtest.Pools(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := fmt.Sprintf("overlap-%d", time.Now().UnixNano())
	dep := open(t, ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 2}}})
	t1req := strategy.Request{Key: sku + "-t1", User: "t1", SKU: sku, TTL: time.Minute}

	t1, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Rollback(ctx)
	if res, err := decide(ctx, t1, t1req); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("t1: %+v, %v", res, err)
	}
	if res, err := dep.Node(0).Reserve(ctx, strategy.Request{Key: sku + "-t2", User: "t2", SKU: sku, TTL: time.Minute}); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("t2: %+v, %v", res, err)
	}
	err = t1.Commit(ctx)
	if !retryable(err) {
		t.Fatalf("t1 COMMIT with a unit still free: %v; want a serialization failure", err)
	}
	t.Logf("t1 COMMIT refused with a unit still free: %v", err)
	if res, err := dep.Node(0).Reserve(ctx, t1req); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("t1 again: %+v, %v; want HELD", res, err)
	}
}

func open(t *testing.T, ctx context.Context, cfg strategy.Config) strategy.Deployment {
	t.Helper()
	dep, err := Open(ctx, cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dep.Close() })
	return dep
}

func auditOne(t *testing.T, ctx context.Context, dep strategy.Deployment) strategy.StockAudit {
	t.Helper()
	list, err := dep.Audit(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("audit: %+v, %v", list, err)
	}
	return list[0]
}
