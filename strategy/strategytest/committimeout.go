package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/reservebench/reservebench/strategy/strategytest/internal/pgcontrol"
)

// runCommitTimeout makes COMMIT wait (synchronous replication to a standby
// that does not exist), lets each client's deadline expire while its COMMIT
// is in flight, then lets the commits finish. The client saw an error; the
// reservation may well exist. The harness must record it as unknown and the
// check must find what really happened.
func runCommitTimeout(ctx context.Context, t *trial) error {
	if err := pgcontrol.SetSyncStandby(ctx, t.env.Admin, "reservebench_no_such_standby"); err != nil {
		return err
	}
	// A second is far more than a reservation needs to reach its COMMIT, even
	// under -race on a loaded machine; the COMMIT then waits for ever.
	t.load(ctx, t.in.Requests, "slow", time.Second, nil, nil, nil)
	if err := pgcontrol.SetSyncStandby(ctx, t.env.Admin, ""); err != nil {
		return err
	}
	// The clients closed their connections; the committed transactions
	// finish once the wait is lifted. Wait for those backends to go.
	if err := pgcontrol.WaitSyncRepIdle(ctx, t.env.Admin); err != nil {
		return err
	}
	ok, fail, info := t.countTypes()
	t.fact("requests whose deadline expired (at COMMIT, or before it while COMMITs waited)", "%d of %d (acknowledged %d, refused %d)", info, t.in.Requests, ok, fail)
	t.check(Base, "a deadline at commit is an unknown outcome, never a definite one", info == t.in.Requests && ok == 0 && fail == 0,
		fmt.Sprintf("ok %d, fail %d, unknown %d of %d", ok, fail, info, t.in.Requests))
	var unknown []Op
	var keys []string
	for _, op := range t.hist.Ops() {
		if op.Type == OpInfo {
			unknown = append(unknown, op)
			keys = append(keys, op.Req.Key)
		}
	}
	durable, err := t.lookupAll(ctx, keys)
	if err != nil {
		return err
	}
	// The clients then do what the contract tells them to: send each
	// request again with its key. Most deadlines expire at COMMIT, and the
	// row is there (REPLAY); on a loaded machine one can expire before (in
	// Redis, for rediscounter, after its unit was taken and before its row
	// was written), and the resend is what settles that unit (HELD). How
	// many of each is the machine's doing, not the strategy's: counted, not
	// a fact. The trial's audit comes after the resends.
	committed, _ := t.resend(ctx, unknown, durable)
	t.vary("unknown outcomes that had committed", committed)
	t.vary("unknown outcomes that had not committed (sent again: HELD)", len(unknown)-committed)
	return nil
}
