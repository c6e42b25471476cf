package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// counters are the server's cumulative counters at one moment.
type counters struct {
	walLSN                                int64 // pg_current_wal_insert_lsn, bytes
	walRecords, walFPI, walSync, walWrite int64 // pg_stat_wal
	commits, rollbacks                    int64 // pg_stat_database, this database
	inserted, updated, deleted            int64
}

// Cost is what the database did during a trial, from the difference of its
// counters before and after. The trial closes every connection before the
// second reading, because a backend reports its statistics when it exits at
// the latest (PostgreSQL 15 flushes them at most once a second while it
// runs). WAL is server-wide: anything else writing at the time (autovacuum,
// a checkpoint's full-page images) is included.
type Cost struct {
	WALBytes   int64 `json:"wal_bytes"`   // pg_current_wal_insert_lsn delta
	WALRecords int64 `json:"wal_records"` // pg_stat_wal.wal_records delta
	WALFPI     int64 `json:"wal_fpi"`     // full-page images
	WALSyncs   int64 `json:"wal_syncs"`   // pg_stat_wal.wal_sync: WAL flushes to disk (fsync on)
	WALWrites  int64 `json:"wal_writes"`
	Commits    int64 `json:"commits"` // pg_stat_database.xact_commit of the trial's database
	Rollbacks  int64 `json:"rollbacks"`
	// RowsWritten is tup_inserted + tup_updated + tup_deleted of the
	// trial's database.
	RowsWritten int64 `json:"rows_written"`
	Inserted    int64 `json:"inserted"`
	Updated     int64 `json:"updated"`
	Deleted     int64 `json:"deleted"`
	// Queries and Prepares are what the Go client sent (a pgx tracer on the
	// trial's pool): each is a round trip. Zero for pgbench, whose round
	// trips are the statements of its script.
	Queries  int64 `json:"queries"`
	Prepares int64 `json:"prepares"`
	// Connections is the largest number of the database's client backends
	// seen at once by the sampler (0 when sampling was off); PoolConns is
	// the Go pool's size.
	Connections int `json:"connections"`
	PoolConns   int `json:"pool_conns"`
	// RedisCommands is what the strategy's Redis processed during the
	// trial (INFO stats total_commands_processed, less the reading's own
	// INFO). Redis counts a script's EVALSHA and every command the script
	// calls, so this is work done in Redis, not round trips: rediscounter's
	// one round trip per success is 7 commands (EVALSHA and its six calls).
	// Zero for strategies without Redis.
	RedisCommands int64 `json:"redis_commands,omitempty"`
}

// PerSuccess divides every counter by n successes (HELD answers, including
// those after the window: every one of them cost the database).
type PerSuccess struct {
	WALBytes    float64 `json:"wal_bytes"`
	WALSyncs    float64 `json:"wal_syncs"`
	RowsWritten float64 `json:"rows_written"`
	RoundTrips  float64 `json:"round_trips"` // Go only: (queries + prepares) / n
	Commits     float64 `json:"commits"`
	// RedisCommands are the commands Redis ran per success (see
	// Cost.RedisCommands).
	RedisCommands float64 `json:"redis_commands,omitempty"`
}

// Per returns the cost per success.
func (c Cost) Per(n int64) PerSuccess {
	if n <= 0 {
		return PerSuccess{}
	}
	f := float64(n)
	return PerSuccess{
		WALBytes:      float64(c.WALBytes) / f,
		WALSyncs:      float64(c.WALSyncs) / f,
		RowsWritten:   float64(c.RowsWritten) / f,
		RoundTrips:    float64(c.Queries+c.Prepares) / f,
		Commits:       float64(c.Commits) / f,
		RedisCommands: float64(c.RedisCommands) / f,
	}
}

const sqlCounters = `
SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint,
       w.wal_records, w.wal_fpi, w.wal_sync, w.wal_write,
       d.xact_commit, d.xact_rollback, d.tup_inserted, d.tup_updated, d.tup_deleted
FROM pg_stat_wal w, pg_stat_database d
WHERE d.datname = $1`

func readCounters(ctx context.Context, conn *pgx.Conn, database string) (counters, error) {
	var c counters
	if _, err := conn.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		return c, fmt.Errorf("bench: clear stats snapshot: %w", err)
	}
	err := conn.QueryRow(ctx, sqlCounters, database).Scan(&c.walLSN,
		&c.walRecords, &c.walFPI, &c.walSync, &c.walWrite,
		&c.commits, &c.rollbacks, &c.inserted, &c.updated, &c.deleted)
	if err != nil {
		return c, fmt.Errorf("bench: read counters: %w", err)
	}
	return c, nil
}

func (after counters) since(before counters) Cost {
	c := Cost{
		WALBytes:   after.walLSN - before.walLSN,
		WALRecords: after.walRecords - before.walRecords,
		WALFPI:     after.walFPI - before.walFPI,
		WALSyncs:   after.walSync - before.walSync,
		WALWrites:  after.walWrite - before.walWrite,
		Commits:    after.commits - before.commits,
		Rollbacks:  after.rollbacks - before.rollbacks,
		Inserted:   after.inserted - before.inserted,
		Updated:    after.updated - before.updated,
		Deleted:    after.deleted - before.deleted,
	}
	c.RowsWritten = c.Inserted + c.Updated + c.Deleted
	return c
}

const sqlClientBackends = `
SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'`

// waitNoBackends waits until the database has no client backend left, so
// that every one of them has reported its statistics.
func waitNoBackends(ctx context.Context, conn *pgx.Conn, database string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := conn.QueryRow(ctx, sqlClientBackends, database).Scan(&n); err != nil {
			return fmt.Errorf("bench: count backends: %w", err)
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: %d backends of %s still connected after 30s", n, database)
		}
		t := time.NewTimer(5 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}
