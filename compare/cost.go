package compare

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/redistest"
	"github.com/reservebench/reservebench/resourcetest"
	"github.com/reservebench/reservebench/strategy"
)

// Cost is what one successful reservation costs a strategy, counted on one
// client sending reservations one after another: deterministic facts (the
// same code counts the same), no timings. Timings, and what the counts
// become under contention, are docs/performance.md's.
type Cost struct {
	// Reservations is how many HELD reservations were counted (after a
	// warm-up that prepared the statements).
	Reservations int `json:"reservations"`
	// RoundTrips: what the client sent and waited for (each Query or Exec,
	// each batch), counted by a pgx tracer; Statements: the SQL statements
	// in them (BEGIN, SAVEPOINT and COMMIT included). Prepares are not
	// counted: pgx prepares each statement once per connection.
	RoundTrips int64 `json:"round_trips"`
	Statements int64 `json:"statements"`
	// RowsWritten: heap rows inserted, updated or deleted in the strategy's
	// tables; WALFlushes: commit records of the transactions that wrote
	// them, each a WAL flush on one client (nothing to share it with). Both
	// read from the WAL itself (pg_walinspect), so other databases' work on
	// the same server does not count.
	RowsWritten int64 `json:"rows_written"`
	WALFlushes  int64 `json:"wal_flushes"`
	// RedisCommands: the commands the strategy's Redis ran (INFO stats),
	// for a strategy that needs one; each is one more round trip, to Redis.
	RedisCommands int64 `json:"redis_commands,omitempty"`
	// Unmeasured says why there is no cost (the server has no
	// pg_walinspect, or a reservation was not HELD); the counts are then 0.
	Unmeasured string `json:"unmeasured,omitempty"`
}

// costReservations is how many reservations a cost counts: enough that
// a cost paid once in a while (none today) would show as a fraction.
const costReservations = 20

// sqlCostFromWAL reads what the transactions that touched the strategy's
// relations ($3, in database $2) wrote from WAL position $1 to the flush
// position:
// commit records (a transaction's own xid, or one of its subtransactions'
// when it wrote under a savepoint) and heap rows written. Vacuum and
// analyze work never counts: vacuum writes without an xid, and analyze
// writes only pg_statistic, a catalog.
const sqlCostFromWAL = `
WITH rec AS (
    SELECT start_lsn, xid::text AS xid, resource_manager AS rm, record_type AS type, description, block_ref
    FROM pg_get_wal_records_info($1::pg_lsn, pg_current_wal_flush_lsn())
), touched AS (
    SELECT DISTINCT rec.start_lsn, rec.xid, rec.rm, rec.type
    FROM rec, regexp_matches(rec.block_ref, 'rel [0-9]+/([0-9]+)/([0-9]+)', 'g') AS m
    WHERE m[1]::oid = $2 AND m[2]::oid = ANY ($3::oid[])
), mine AS (
    SELECT DISTINCT xid FROM touched WHERE xid <> '0'
)
SELECT
    (SELECT count(*) FROM rec
      WHERE rm = 'Transaction' AND type LIKE 'COMMIT%'
        AND (xid IN (SELECT xid FROM mine)
             OR EXISTS (SELECT 1 FROM regexp_split_to_table(substring(description FROM 'subxacts: ([0-9 ]+)'), ' ') AS s (x)
                        WHERE s.x IN (SELECT xid FROM mine)))),
    (SELECT count(*) FROM touched
      WHERE xid IN (SELECT xid FROM mine) AND rm = 'Heap' AND type ~ '^(INSERT|UPDATE|HOT_UPDATE|DELETE)')`

// sqlStrategyRelations lists the filenodes of the relations in the
// database's own schemas: the strategy's tables and indexes.
const sqlStrategyRelations = `
SELECT coalesce(array_agg(pg_relation_filenode(c.oid)), '{}'), (SELECT oid FROM pg_database WHERE datname = current_database())
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'i', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'`

// measureCost deploys meta over a SKU of its own on db's database and
// counts what costReservations HELD reservations cost, one at a time
// through one connection. admin must be a superuser pool on the same
// database (pg_walinspect). A Cost with Unmeasured set says why it could
// not count; an error is the harness's own. res are the strategy's
// resources besides PostgreSQL (its Redis), for the cost run alone.
// attempt names the SKU and keys (a second attempt must not meet the first's).
func measureCost(ctx context.Context, meta strategy.Meta, db, admin *pgxpool.Pool, res resourcetest.Set, attempt int) (*Cost, error) {
	if _, err := admin.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`); err != nil {
		return &Cost{Unmeasured: "pg_walinspect is not available: " + err.Error()}, nil
	}
	cfg := db.Config().Copy()
	cfg.MaxConns = 1 // one connection: prepared once in the warm-up, then every statement is counted alike
	tr := &costTracer{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("cost: pool: %w", err)
	}
	defer pool.Close()
	sku := fmt.Sprintf("cost-%d-%s", attempt, meta.Name)
	dep, err := meta.Open(ctx, strategy.Config{DB: pool, Stock: []strategy.Stock{{SKU: sku, Total: 2 * costReservations}}, Resources: res.Addrs()})
	if err != nil {
		return nil, fmt.Errorf("cost: open: %w", err)
	}
	if dep == nil {
		return nil, errors.New("cost: open returned no deployment and no error")
	}
	defer dep.Close()
	node := dep.Node(0)
	reserve := func(i int) (bool, string, error) {
		key := fmt.Sprintf("%s-%03d", sku, i)
		res, err := node.Reserve(ctx, strategy.Request{Key: key, User: key, SKU: sku, TTL: strategy.TTLForever})
		if err != nil {
			return false, "", fmt.Errorf("cost: reserve: %w", err)
		}
		return res.Outcome == strategy.OutcomeHeld, string(res.Outcome), nil
	}
	for i := 0; i < 2; i++ { // warm-up: connect, prepare
		if _, _, err := reserve(-1 - i); err != nil {
			return nil, err
		}
	}
	var filenodes []uint32
	var dbOID uint32
	if err := admin.QueryRow(ctx, sqlStrategyRelations).Scan(&filenodes, &dbOID); err != nil {
		return nil, fmt.Errorf("cost: relations: %w", err)
	}
	defer holdWAL(ctx, admin)()
	var from string
	if err := admin.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&from); err != nil {
		return nil, fmt.Errorf("cost: wal position: %w", err)
	}
	var redisCount *redistest.CommandCounter
	if srv, ok := res[strategy.Redis]; ok {
		if redisCount, err = redistest.CountCommands(ctx, srv.Addr()); err != nil {
			return nil, fmt.Errorf("cost: %w", err)
		}
	}
	tr.trips.Store(0)
	tr.statements.Store(0)
	for i := 0; i < costReservations; i++ {
		held, outcome, err := reserve(i)
		if err != nil {
			return nil, err
		}
		if !held {
			return &Cost{Unmeasured: fmt.Sprintf("reservation %d of a fresh stock was answered %s, not HELD", i+1, outcome)}, nil
		}
	}
	c := &Cost{Reservations: costReservations, RoundTrips: tr.trips.Load(), Statements: tr.statements.Load()}
	if redisCount != nil {
		if c.RedisCommands, err = redisCount.Since(ctx); err != nil {
			return nil, fmt.Errorf("cost: %w", err)
		}
	}
	// Every reservation has committed (its answer came after its COMMIT),
	// so its records lie before the flush position.
	err = admin.QueryRow(ctx, sqlCostFromWAL, from, dbOID, filenodes).Scan(&c.WALFlushes, &c.RowsWritten)
	if err != nil {
		return nil, fmt.Errorf("cost: read the WAL: %w", err)
	}
	return c, nil
}

// holdWAL keeps the server's WAL from here on until the returned function
// is called, by a replication slot that reserves it: the other cells of a
// table write WAL fast enough that a checkpoint recycled the measurement's
// segment before it was read, three attempts in a row once 24 cells ran at
// once (2026-12-07). A server that refuses the slot (no free one, no
// privilege) is measured without it, and walGone's retry remains.
func holdWAL(ctx context.Context, admin *pgxpool.Pool) (release func()) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "reservebench_cost_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(ctx, `SELECT pg_create_physical_replication_slot($1, true)`, name); err != nil {
		return func() {}
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _ = admin.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, name)
	}
}

// walGone says the WAL from the measurement's start was removed before it
// was read: a checkpoint, driven by other cells' writes on the same
// server, recycled the segment (seen once in a table run, SQLSTATE 58P01).
// The counts do not depend on when they are taken, so measuring again on a
// fresh SKU gives the same ones.
func walGone(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedFile
}

// costTracer counts round trips and statements on a pool's connections.
type costTracer struct{ trips, statements atomic.Int64 }

var (
	_ pgx.QueryTracer = (*costTracer)(nil)
	_ pgx.BatchTracer = (*costTracer)(nil)
)

func (c *costTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.trips.Add(1)
	c.statements.Add(1)
	return ctx
}

func (c *costTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *costTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.trips.Add(1)
	return ctx
}

func (c *costTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.statements.Add(1)
}

func (c *costTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
