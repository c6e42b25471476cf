package pgcontrol

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// SetSyncStandbyOf names a standby that is streaming in
// synchronous_standby_names on the primary adminDSN reaches, and waits
// until pg_stat_replication shows it synchronous: from then on every
// COMMIT waits until the standby has flushed it. adminDSN must be a
// superuser's.
func SetSyncStandbyOf(ctx context.Context, adminDSN, name string) error {
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return fmt.Errorf("synchronous standby: %w", err)
	}
	defer conn.Close(ctx)
	stmt := "ALTER SYSTEM SET synchronous_standby_names = " + pgx.Identifier{name}.Sanitize()
	for _, s := range []string{stmt, "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 AND sync_state = 'sync'`, name).Scan(&n); err != nil {
			return fmt.Errorf("pg_stat_replication: %w", err)
		}
		if n > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("standby %s not synchronous within 30s", name)
		}
		time.Sleep(5 * time.Millisecond) // paces the question; the answer decides
	}
}

// ResetSyncStandby empties synchronous_standby_names on the server adminDSN
// reaches, so that its COMMITs wait for no standby again.
func ResetSyncStandby(ctx context.Context, adminDSN string) error {
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return fmt.Errorf("reset synchronous standby: %w", err)
	}
	defer conn.Close(ctx)
	for _, s := range []string{"ALTER SYSTEM RESET synchronous_standby_names", "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}
