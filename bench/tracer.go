package bench

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// roundTrips counts what a pool's connections send: every Query, QueryRow
// and Exec (BEGIN, SAVEPOINT and COMMIT included: pgx sends them with Exec),
// every batch (SendBatch: its statements go in one round trip) and every
// Prepare (pgx prepares a statement on its first use on a connection, one
// extra round trip). Each is one round trip to the server.
type roundTrips struct {
	queries, prepares atomic.Int64
}

var (
	_ pgx.QueryTracer   = (*roundTrips)(nil)
	_ pgx.PrepareTracer = (*roundTrips)(nil)
	_ pgx.BatchTracer   = (*roundTrips)(nil)
)

func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.queries.Add(1)
	return ctx
}

func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

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
