package strategytest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// checkSessionsUntouched: the strategy leaves the connections of the pool
// it was given (strategy.Config.DB) as it found them: no setting of a
// session changed by a SET without LOCAL, which outlives the transaction
// and the call and goes with the connection to whatever borrows it next.
// An expiry job that runs "SET synchronous_commit = off" ("it can be
// redone after a crash") turns the next Reserve on that connection into a
// commit acknowledged before it is durable; a lock_timeout or a
// statement_timeout set for one call answers another's request with an
// error. Run after the deployment contract's other checks, whose calls
// have been through most of the pool's connections.
func checkSessionsUntouched(t tester, db *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conns := db.AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	var changed []string
	for i, c := range conns {
		rows, err := c.Query(ctx, `SELECT name || ' = ' || setting FROM pg_settings WHERE source = 'session' ORDER BY 1`)
		if err != nil {
			t.Fatalf("read the settings of connection %d: %v", i, err)
		}
		set, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("read the settings of connection %d: %v", i, err)
		}
		if len(set) > 0 {
			changed = append(changed, fmt.Sprintf("connection %d: %s", i, strings.Join(set, ", ")))
		}
	}
	if len(changed) > 0 {
		t.Errorf("%d of %d idle connections of the strategy's pool carry settings its calls left on the session (SET without LOCAL): %s", len(changed), len(conns), sample(changed))
	}
}
