package bench

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// roundTrips counts what a pool's connections send: every Query, QueryRow
// and Exec (BEGIN, SAVEPOINT and COMMIT included: pgx sends them with Exec)
// and every Prepare (pgx prepares a statement on its first use on a
// connection, one extra round trip). Each is one round trip to the server.
type roundTrips struct {
	queries, prepares atomic.Int64
}

var (
	_ pgx.QueryTracer   = (*roundTrips)(nil)
	_ pgx.PrepareTracer = (*roundTrips)(nil)
)

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.queries.Add(1)
	return ctx
}

func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *roundTrips) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	r.prepares.Add(1)
	return ctx
}

func (r *roundTrips) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}
