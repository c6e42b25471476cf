package pgstrategy

import (
	"context"
	"fmt"
	"time"
)

// sqlBackendsBusy tells whether any of the backends is still in a
// transaction. A pid that is gone, or back idle in a pool, has ended its
// transaction; a pid taken again by another connection only delays the
// answer.
const sqlBackendsBusy = `
SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = ANY($1::int4[]) AND state IS DISTINCT FROM 'idle')`

// backendsPoll paces AwaitBackendsDone's reads.
const backendsPoll = 5 * time.Millisecond

// AwaitBackendsDone waits until none of the backends pids is in a
// transaction. A node that recounts its stock from the rows at a restart
// first waits for the backends of the requests whose outcome it does not
// know (the client gave up, the connection broke after the statement was
// sent): such a backend may still commit its row, and a recount that ran
// before would count that row's unit free and sell it again. The wait is
// as long as the backends take (bounded by ctx); PostgreSQL has no lock
// that a plain INSERT's backend holds for its whole life and that another
// could wait on instead, so it polls pg_stat_activity.
func AwaitBackendsDone(ctx context.Context, q Querier, pids []int32) error {
	if len(pids) == 0 {
		return nil
	}
	tick := time.NewTicker(backendsPoll)
	defer tick.Stop()
	for {
		var busy bool
		if err := q.QueryRow(ctx, sqlBackendsBusy, pids).Scan(&busy); err != nil {
			return fmt.Errorf("wait for the backends of requests of unknown outcome: %w", err)
		}
		if !busy {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the backends %v of requests of unknown outcome: %w", pids, ctx.Err())
		case <-tick.C:
		}
	}
}
