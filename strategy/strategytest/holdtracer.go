package strategytest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// holdTracer is a pgx.QueryTracer on a pool the kit hands a strategy. Once
// armed, it holds the first statement that matches, before it is sent,
// until let go: the kit then acts in the moment between two of the
// strategy's statements, which no lock of the server can pin (after one
// statement ended, before the next begins), and which a strategy without
// SQL of the kit's knowing cannot be asked to show. It sees every statement
// sent through the pool's Query, QueryRow and Exec, a transaction's COMMIT
// included; not batches or pipelines.
type holdTracer struct {
	mu sync.Mutex
	// match decides whether a statement is held: its SQL, and whether
	// the statement before it on the same connection failed on a unique
	// index (23505). nil: disarmed.
	match func(sql string, afterUniqueViolation bool) bool
	// unique holds the connections whose last statement failed on a
	// unique index.
	unique map[*pgx.Conn]bool
	held   chan uint32   // the held statement's backend
	let    chan struct{} // closed to send the held statement on
	once   sync.Once
}

func newHoldTracer() *holdTracer {
	return &holdTracer{unique: map[*pgx.Conn]bool{}, held: make(chan uint32, 1), let: make(chan struct{})}
}

// tracedPool is a pool on db's database whose statements pass through h.
func tracedPool(ctx context.Context, db *pgxpool.Pool, h *holdTracer) (*pgxpool.Pool, error) {
	cfg := db.Config().Copy()
	cfg.ConnConfig.Tracer = h
	return pgxpool.NewWithConfig(ctx, cfg)
}

// openTraced opens meta on a fresh SKU of total units (openOneSKU) over a
// pool whose statements pass through a new holdTracer; done lets any held
// statement go and closes the deployment and the pool.
func openTraced(ctx context.Context, t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string, prefix string, total int) (*holdTracer, strategy.Deployment, string, func()) {
	t.Helper()
	h := newHoldTracer()
	traced, err := tracedPool(ctx, db, h)
	if err != nil {
		t.Fatalf("a pool with the kit's tracer: %v", err)
	}
	opened := false
	defer func() {
		if !opened { // Open failed the check
			closeKitPool(traced)
		}
	}()
	dep, sku := openOneSKU(ctx, t, meta, traced, rs, prefix, total)
	opened = true
	return h, dep, sku, func() {
		h.letGo()
		dep.Close()
		closeKitPool(traced)
	}
}

// arm makes h hold the next statement that matches (once: a tracer is let
// go once); nil disarms it.
func (h *holdTracer) arm(match func(sql string, afterUniqueViolation bool) bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.match = match
}

// isCommit matches a transaction's COMMIT as pgx sends it.
func isCommit(sql string, _ bool) bool { return strings.EqualFold(strings.TrimSpace(sql), "commit") }

// afterUniqueViolation matches the statement that follows a refusal by a
// unique index on the same connection.
func afterUniqueViolation(_ string, after bool) bool { return after }

// TraceQueryStart holds the statement that matches, once.
func (h *holdTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	h.mu.Lock()
	after := h.unique[conn]
	delete(h.unique, conn)
	hold := h.match != nil && h.match(data.SQL, after)
	if hold {
		h.match = nil
	}
	h.mu.Unlock()
	if hold {
		h.held <- conn.PgConn().PID()
		select {
		case <-h.let:
		case <-ctx.Done():
		}
	}
	return ctx
}

// TraceQueryEnd notes a refusal by a unique index.
func (h *holdTracer) TraceQueryEnd(_ context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	var pgErr *pgconn.PgError
	if errors.As(data.Err, &pgErr) && pgErr.Code == pgerrcode.UniqueViolation {
		h.mu.Lock()
		h.unique[conn] = true
		h.mu.Unlock()
	}
}

// awaitHeld returns the backend of the held statement, or ok false when
// done delivered an answer first (left in it): the call sent no statement
// that matched.
func awaitHeld[A any](ctx context.Context, h *holdTracer, done chan A) (pid uint32, ok bool, err error) {
	select {
	case pid := <-h.held:
		return pid, true, nil
	case a := <-done:
		done <- a
		return 0, false, nil
	case <-ctx.Done():
		return 0, false, fmt.Errorf("no statement held and no answer: %w", ctx.Err())
	}
}

// letGo sends the held statement on, and any held later: a tracer holds
// once.
func (h *holdTracer) letGo() { h.once.Do(func() { close(h.let) }) }
