package strategytest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkTwinBetweenStatements: the twin of a request held open (the same
// key, user and SKU), paused in the strategy's own code after its k-th
// statement while the request commits, answers REPLAY, for each k in turn.
// checkTwinBehindTableLock stops the twin at its first read of a table, so
// two reads of one table are never split: a strategy that looks the key up
// and then, on the same table, looks for the user's other reservation
// before its lock answered its own twin USER_LIMIT, and only duplicate-key
// landed in that window, in 2 runs of 3 (outsider round 45's m08). The
// pause is a tracer on the pool the kit hands the strategy that blocks, at
// the end of the k-th statement of the call whose context the kit marked,
// until the request has committed. On a SKU of two units, so that the
// twin goes on past the stock.
func checkTwinBetweenStatements(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tr, dep, stock, closeAll := openPaused(ctx, t, meta, db, rs, "twin-pause", 2, 2)
	defer closeAll()
	opener, ok := dep.Node(0).(strategy.SessionOpener)
	if !ok {
		t.Skip("no attempt held open (strategy.SessionOpener)")
	}
	var wrong []string
	judged := 0
	for k := 1; k <= eachStatementRounds; k++ {
		req := strategy.Request{Key: "kit-tp-" + stock[k-1].SKU, User: "kit-tp-u-" + stock[k-1].SKU, SKU: stock[k-1].SKU, TTL: time.Hour}
		s, pids := holdInSession(ctx, t, opener, req, "the attempt held open")
		paused := tr.arm(k)
		var box panicBox
		done := reserveAsync(withPauseMark(ctx), &box, dep.Node(1), req)
		stopped := false
		err := awaitAnswerOr(ctx, done, func() (bool, error) {
			select {
			case <-paused:
				stopped = true
				return true, nil
			default:
			}
			if lockWaiting(done) {
				return true, nil
			}
			var n int
			err := admin.QueryRow(ctx, sqlBlockedByAny, []int32{int32(pids[0])}).Scan(&n)
			return n > 0, err
		})
		if err != nil {
			tr.release()
			_ = s.Rollback(ctx)
			t.Fatalf("the twin of %q, paused after its statement %d: %v", req.Key, k, err)
		}
		answeredFirst := false
		select {
		case a := <-done:
			done <- a
			answeredFirst = !stopped
		default:
		}
		commitErr := s.Commit(ctx)
		tr.release()
		a := <-done
		box.rethrow()
		if answeredFirst {
			break // fewer than k statements: every pause point is done
		}
		if abortedByConflict(commitErr) {
			continue // at SERIALIZABLE the request may lose to its twin
		} else if commitErr != nil {
			t.Fatalf("Commit of the attempt holding %q: %v", req.Key, commitErr)
		}
		if a.err != nil || a.res.Outcome == strategy.OutcomeBusy {
			continue
		}
		judged++
		if a.res.Outcome != strategy.OutcomeReplay || a.res.Reservation.Key != req.Key {
			where := "waiting behind the attempt"
			if stopped {
				where = fmt.Sprintf("paused after its statement %d", k)
			}
			wrong = append(wrong, fmt.Sprintf("%s: %s (reservation %q)", where, a.res.Outcome, a.res.Reservation.Key))
		}
	}
	if judged == 0 {
		t.Skip("no twin answered after its request committed")
	}
	if len(wrong) > 0 {
		t.Errorf("the twin of a request (the same key, user and SKU, a unit left), held while the request committed, is REPLAY; got %s", strings.Join(wrong, "; "))
	}
	audit, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	for _, st := range audit {
		if st.Drift() != 0 {
			t.Errorf("audit of %s after its twin: total %d, available %d, active %d; want drift 0", st.SKU, st.Total, st.Available, st.Active)
		}
	}
}

// openPaused opens meta over pauseRounds(name, total) on nodes nodes, on
// a pausedPool of db; closeAll closes the deployment and the pool.
func openPaused(ctx context.Context, t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string, name string, total, nodes int) (tr *pauseTracer, dep strategy.Deployment, stock []strategy.Stock, closeAll func()) {
	t.Helper()
	tr, pool := pausedPool(ctx, t, db)
	stock = pauseRounds(name, total)
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: pool, Nodes: nodes, Stock: stock})
	if err != nil {
		closeKitPool(pool)
		t.Fatalf("Open: %v", err)
	}
	return tr, dep, stock, func() { _ = dep.Close(); closeKitPool(pool) }
}

// pausedPool is db's pool again, with a pauseTracer on its connections.
func pausedPool(ctx context.Context, t tester, db *pgxpool.Pool) (*pauseTracer, *pgxpool.Pool) {
	t.Helper()
	tr := &pauseTracer{}
	cfg := db.Config().Copy()
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("a pool with the kit's tracer: %v", err)
	}
	return tr, pool
}

// pauseRounds is a SKU of total units for each statement a check pauses
// after in turn.
func pauseRounds(name string, total int) []strategy.Stock {
	var stock []strategy.Stock
	for k := 1; k <= eachStatementRounds; k++ {
		stock = append(stock, strategy.Stock{SKU: kitSKU(fmt.Sprintf("%s-%d", name, k)), Total: total})
	}
	return stock
}

type pauseMarkKey struct{}

// withPauseMark marks ctx as the call pauseTracer pauses.
func withPauseMark(ctx context.Context) context.Context {
	return context.WithValue(ctx, pauseMarkKey{}, true)
}

// pauseTracer is a pgx.QueryTracer and pgx.BatchTracer that, once armed,
// blocks the end of the k-th statement of the marked call until release.
type pauseTracer struct {
	mu     sync.Mutex
	armed  bool
	k, n   int
	paused chan struct{}
	gate   chan struct{}
	pid    uint32 // the paused call's backend
}

// arm counts the marked call's statements from zero; the channel is closed
// when the k-th has ended and waits.
func (p *pauseTracer) arm(k int) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed, p.k, p.n, p.pid = true, k, 0, 0
	p.paused, p.gate = make(chan struct{}), make(chan struct{})
	return p.paused
}

// release lets the paused statement go, and disarms.
func (p *pauseTracer) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.armed {
		p.armed = false
		close(p.gate)
	}
}

// pausedPID is the backend of the call paused now (0 before it is).
func (p *pauseTracer) pausedPID() uint32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid
}

func (p *pauseTracer) end(ctx context.Context, conn *pgx.Conn) {
	if marked, _ := ctx.Value(pauseMarkKey{}).(bool); !marked {
		return
	}
	p.mu.Lock()
	if !p.armed {
		p.mu.Unlock()
		return
	}
	p.n++
	if p.n != p.k {
		p.mu.Unlock()
		return
	}
	paused, gate := p.paused, p.gate
	p.pid = conn.PgConn().PID()
	p.mu.Unlock()
	close(paused)
	<-gate
}

func (p *pauseTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (p *pauseTracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, _ pgx.TraceQueryEndData) {
	p.end(ctx, conn)
}

func (p *pauseTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (p *pauseTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (p *pauseTracer) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, _ pgx.TraceBatchEndData) {
	p.end(ctx, conn)
}
