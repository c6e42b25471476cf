package strategytest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest/internal/pgcontrol"
)

// runCommitTimeout makes COMMIT wait (synchronous replication to a standby
// that does not exist). First a wave whose COMMITs' backends the harness
// ends as soon as they wait (endedWhileWaiting): each is committed locally,
// and must end unknown. Then it lets each client's deadline expire while its
// COMMIT is in flight. The client saw an error; the reservation may well
// exist. The deployment reaches the server through a proxy that loses the
// clients' cancel requests (a cancel travels on a connection of its own,
// which a load balancer or a partition can lose), so each backend is still
// there, waiting: one waiting for a standby does not notice that its
// client has gone. While those COMMITs wait, a
// second wave of as many requests runs on the same SKUs (a strategy that
// settles its doubts on the next request does it now, before it can know).
// In the even trials, a release sent while the COMMITs wait is in doubt
// the same way; a strategy that claims to survive restarts then restarts
// the node it was sent to before anything else reaches it (a unit given back for that
// release after the restart recounted it is counted twice). In the odd
// trials an expiry job runs while the COMMITs wait, over a hold made due,
// and runs again once they are done, as a job does on its next tick: the
// unit must be back by then (a job that gives units back outside the
// database, after its UPDATE, and learns nothing of an UPDATE whose COMMIT
// outlived its caller, loses it: rediscounter did). Then the
// commits finish. The harness records the first wave as unknown, and the
// checks find what really happened. The scenario gives the deployment an
// internal deadline (strategy.Config.InternalDeadline) shorter than the
// clients' own, so a strategy whose work runs under a deadline of its own
// (combine's batch) reaches it while the COMMIT waits, and the answer it
// gives then is the one checked: it must be unknown too.
func runCommitTimeout(ctx context.Context, t *trial) error {
	t.proxy.LoseCancels(true)
	waves := t.in.Stock[:len(t.in.Stock)-3] // the last three SKUs are the ended wave's, the session's and the release's
	endedSKU := t.in.Stock[len(t.in.Stock)-3]
	sessionSKU := t.sku(t.in.Stock[len(t.in.Stock)-2].SKU)
	relKey, err := t.holdToRelease(ctx)
	if err != nil {
		return err
	}
	dueKey, err := t.holdToExpire(ctx)
	if err != nil {
		return err
	}
	if err := pgcontrol.SetSyncStandby(ctx, t.env.Admin, "reservebench_no_such_standby"); err != nil {
		return err
	}
	// First, while the pool is free (the waves' COMMITs keep their
	// connections until the standby is dropped), the wave whose backends
	// the harness ends.
	ended, err := t.endedWhileWaiting(ctx, endedSKU)
	if err != nil {
		return err
	}
	// A second is far more than a reservation needs to reach its COMMIT, even
	// under -race on a loaded machine; the COMMIT then waits for ever.
	sessionDone := t.commitSessionWhileWaiting(ctx, sessionSKU, time.Second)
	t.loadCancelsOdd = true
	t.loadOver(ctx, waves, t.in.Requests, "slow", time.Second)
	t.loadCancelsOdd = false
	sessionOp, sessionRan := <-sessionDone
	relUnits, relErr := t.releaseWhileWaiting(ctx, relKey)
	expireUnits, expireErr := t.expireWhileWaiting(ctx, dueKey)
	ok, fail, info := t.countTypesOf("slow")
	t.vary("first wave: answered before the clients' deadline (the strategy's own deadline fired first)", t.answeredWithin("slow", time.Second*9/10))
	var waiting int
	if err := t.env.Admin.QueryRow(ctx, syncRepWaitingSQL).Scan(&waiting); err != nil {
		return fmt.Errorf("count waiting COMMITs: %w", err)
	}
	t.fact("COMMITs still waiting, their clients gone, when the second wave began", "%s", yesNo(waiting > 0))
	t.vary("COMMITs still waiting when the second wave began", waiting)
	t.vary("cancel requests lost by the proxy before the second wave", t.proxy.LostCancels())
	// The second wave's first request goes alone: a strategy that settles
	// its doubts on the next request does it now, with the pool and the
	// server to itself. In a crowd, the settle would compete for a
	// connection with requests whose COMMITs all wait too, and on a loaded
	// machine the deadline it runs under (the request's, for memquota)
	// could fire first: ctl-settle-while-running was missed once that way.
	t.loadOver(ctx, waves, 1, "then", time.Second)
	t.loadFrom = 1
	t.loadOver(ctx, waves, t.in.Requests, "then", time.Second)
	t.loadFrom = 0
	if err := pgcontrol.SetSyncStandby(ctx, t.env.Admin, ""); err != nil {
		return err
	}
	// The clients closed their connections; the committed transactions
	// finish once the wait is lifted, and the second wave's backends (some
	// blocked behind the first's locks) run to their end. Wait for them.
	if err := pgcontrol.WaitSyncRepIdle(ctx, t.env.Admin); err != nil {
		return err
	}
	if err := pgcontrol.WaitNone(ctx, t.env.Admin, "backends still busy after the wait was lifted", busyBackendsSQL); err != nil {
		return err
	}
	// A backend whose client left while its COMMIT waited learns of it only
	// once the COMMIT is done, and is idle for a moment before it exits. A
	// strategy may rightly keep a unit in doubt while that backend is there
	// (memquota does): its transaction could, for all it can see, still be
	// running. The clients resend once those backends are gone.
	if err := pgcontrol.WaitNone(ctx, t.env.Admin, "backends of connections their clients closed", goneBackendsSQL, t.proxy.Closed()); err != nil {
		return err
	}
	if err := t.restartAfterRelease(ctx, relKey, relUnits, relErr); err != nil {
		return err
	}
	if err := t.expireAgain(ctx, dueKey, expireUnits, expireErr); err != nil {
		return err
	}
	t.fact("first wave: requests whose deadline expired, or whose caller cancelled (every other one), at COMMIT or before it while COMMITs waited", "%d of %d (acknowledged %d, refused %d)", info, t.in.Requests, ok, fail)
	t.check(Base, "a deadline or a cancel at commit is an unknown outcome, never a definite one", info == t.in.Requests && ok == 0 && fail == 0,
		fmt.Sprintf("ok %d, fail %d, unknown %d of %d", ok, fail, info, t.in.Requests))
	ok3, fail3, _ := t.countTypesOf("ended")
	t.vary("third wave: COMMITs whose backends the harness ended while they waited", ended)
	t.check(Base, "a request whose COMMIT's backend was ended while it waited for the standby (PostgreSQL committed it locally, and says so only in a warning) ends unknown, never with a definite answer",
		ended == 0 || ok3 == 0 && fail3 == 0, fmt.Sprintf("%d backends ended; of %d requests, %d acknowledged and %d refused", ended, t.in.Requests, ok3, fail3))
	ok2, fail2, info2 := t.countTypesOf("then")
	t.vary("second wave: acknowledged", ok2)
	t.vary("second wave: refused", fail2)
	t.vary("second wave: unknown", info2)
	var unknown []Op
	var keys []string
	for _, op := range t.hist.Ops() {
		if op.Kind == "reserve" && op.Type == OpInfo {
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
	// was written), and the resend is what settles that unit (HELD, or
	// SOLD_OUT where the node it reaches has no unit left: then-0000 on
	// memquota's node 0, whose share of sku-a slow-0000 holds, when its
	// deadline expired before its lookup answered). How
	// many of each is the machine's doing, not the strategy's: counted, not
	// a fact. The trial's audit comes after the resends.
	committed, answers := t.resend(ctx, unknown, durable)
	if sessionRan {
		if err := t.sellAfterSession(ctx, sessionOp, sessionSKU); err != nil {
			return err
		}
	}
	t.vary("unknown outcomes that had committed", committed)
	t.vary("unknown outcomes that had not committed", len(unknown)-committed)
	for _, o := range strategy.Outcomes {
		if answers[string(o)] > 0 {
			t.vary("unknown outcomes sent again: "+string(o), answers[string(o)])
		}
	}
	return nil
}

// endedWhileWaiting sends endedRequests requests for sku, all at once to
// node 0, each with a deadline of endedWithin, and ends (pg_terminate_backend) the
// backend of each COMMIT that begins to wait for the standby meanwhile:
// PostgreSQL has then committed it locally, warns of that, and closes the
// connection, which the client reads as an unexpected end of stream. A
// strategy that sends its work again on another connection after that
// error finds its rows and answers REPLAY: a definite answer for a
// reservation that a failover to the standby loses (combine sending a
// batch again after an io.ErrUnexpectedEOF: outsider round 56's m35). It
// returns how many backends it ended.
func (t *trial) endedWhileWaiting(ctx context.Context, sku StockInput) (int, error) {
	var before []int32
	if err := t.env.Admin.QueryRow(ctx, syncRepPIDsSQL).Scan(&before); err != nil {
		return 0, fmt.Errorf("list the COMMITs waiting for the standby: %w", err)
	}
	done := make(chan struct{})
	ended := make(chan int, 1)
	var endErr error
	go func() {
		n := 0
		defer func() { ended <- n }()
		for {
			var waiting []int32
			if err := t.env.Admin.QueryRow(ctx, syncRepPIDsSQL+` AND pid <> ALL($1::int4[])`, before).Scan(&waiting); err != nil {
				endErr = fmt.Errorf("list the third wave's COMMITs waiting for the standby: %w", err)
				return
			}
			for _, pid := range waiting {
				if _, err := t.env.Admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
					endErr = fmt.Errorf("end backend %d: %w", pid, err)
					return
				}
				before = append(before, pid)
				n++
			}
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond): // a poll of pg_stat_activity, not an order
			}
		}
	}()
	// All at once, to one node: one that combines requests sends the first
	// alone and the rest in one batch behind it, which is ended too (a
	// combine that answered the error to the first request of a failed
	// batch only, and sent the rest again, answered them REPLAY: outsider
	// round 56's m17).
	Together(endedRequests, func(i int) {
		rctx, cancel := context.WithTimeout(ctx, endedWithin)
		defer cancel()
		t.reserve(rctx, fmt.Sprintf("ended%d", i), 0, strategy.Request{
			Key: t.key(fmt.Sprintf("ended-%04d", i)), User: t.user(fmt.Sprintf("user-ended-%04d", i)), SKU: t.sku(sku.SKU), TTL: strategy.TTLForever})
	})
	close(done)
	n := <-ended
	return n, endErr
}

// endedWithin is the deadline of each request of endedWhileWaiting's wave:
// far longer than a COMMIT needs to be seen waiting and ended.
const endedWithin = 10 * time.Second

// endedRequests is how many requests endedWhileWaiting sends; its SKU has
// twice as many units, so that a strategy that splits a SKU between its
// nodes has one for each on node 0.
const endedRequests = 3

// syncRepPIDsSQL lists the backends of the database waiting for a
// standby.
const syncRepPIDsSQL = `
SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event = 'SyncRep'`

// syncRepWaitingSQL counts the backends of the database waiting for a
// standby.
const syncRepWaitingSQL = `
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event = 'SyncRep'`

// busyBackendsSQL counts the client backends of the database, other than
// the one asking, that are running a statement or are inside a transaction.
const busyBackendsSQL = `
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
  AND state IS DISTINCT FROM 'idle'`

// goneBackendsSQL counts the backends among these pids that are still
// there.
const goneBackendsSQL = `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int4[])`

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// holdToRelease holds one unit of the scenario's last SKU on node 0, for a
// strategy with Release, in the even trials (the odd ones keep the waves
// alone, so what they find is not charged to a restart); it returns its
// key ("" when there is no release).
func (t *trial) holdToRelease(ctx context.Context) (string, error) {
	if _, ok := t.node(0).(strategy.Releaser); !ok || t.n%2 == 1 {
		return "", nil
	}
	last := t.in.Stock[len(t.in.Stock)-1].SKU
	key := t.key("release-0000")
	op := t.holdForFault(ctx, "r", strategy.Request{Key: key, User: t.user("user-release-0000"), SKU: t.sku(last), TTL: strategy.TTLForever})
	if op.Type != OpOK {
		return "", fmt.Errorf("hold the reservation to release: %s %s %s", op.Type, op.Outcome, op.Err)
	}
	return key, nil
}

// unknownResends bounds how often holdForFault sends a hold again after
// its outcome was unknown.
const unknownResends = 5

// holdForFault reserves req on node 0 for a fault to act on later, before
// any fault. A hold whose outcome is unknown is sent again with its key, as
// the contract allows, and a REPLAY of one that committed is as good as its
// HELD: a strategy's own deadline on a slow moment (combine's batch timeout,
// seen once in a CI rehearsal) is not what this scenario judges, and
// without the resend it ended the trial as a setup error.
func (t *trial) holdForFault(ctx context.Context, proc string, req strategy.Request) Op {
	for i := 0; ; i++ {
		op := t.reserveDefinite(ctx, proc, 0, req)
		if op.Type != OpInfo || i >= unknownResends || ctx.Err() != nil {
			return op
		}
	}
}

// releaseWhileWaiting releases key while COMMITs wait, giving up once its
// COMMIT waits too (untilCommitWaits), and returns its answer: no error
// would mean an answer before its COMMIT.
func (t *trial) releaseWhileWaiting(ctx context.Context, key string) (int, error) {
	if key == "" {
		return 0, nil
	}
	var units int
	err := t.untilCommitWaits(ctx, func(ctx context.Context) (err error) {
		units, err = t.release(ctx, "r", 0, key)
		return err
	})
	return units, err
}

// commitWaitsAtMost bounds untilCommitWaits: a call that never reaches a
// COMMIT (it wrote nothing, or waits for something else) is given up then.
const commitWaitsAtMost = 10 * time.Second

// untilCommitWaits runs call and gives up on it (its context ends as its
// deadline would, context.DeadlineExceeded) once one more COMMIT than
// before waits for the absent standby, or after commitWaitsAtMost, or at
// once when it returns. A fixed deadline of a second let a loaded machine
// give up on the call before its COMMIT was sent: nothing in doubt, and
// ctl-moves-to-restarted went uncaught in 1 of 6 runs beside a table run.
// The COMMIT is read from pg_stat_activity. The waves' requests give up
// both ways; a transition, the way the kit's other give-ups (cancels)
// do not (giveUpKind).
func (t *trial) untilCommitWaits(ctx context.Context, call func(context.Context) error) error {
	var before int
	if err := t.env.Admin.QueryRow(ctx, syncRepWaitingSQL).Scan(&before); err != nil {
		return fmt.Errorf("count waiting COMMITs: %w", err)
	}
	tctx, stop := context.WithTimeout(ctx, commitWaitsAtMost)
	defer stop()
	cctx, cancel := withGiveUp(tctx, byDeadline)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- call(cctx) }()
	_ = awaitAnswerOr(cctx, done, func() (bool, error) {
		var n int
		err := t.env.Admin.QueryRow(ctx, syncRepWaitingSQL).Scan(&n)
		return n > before, err
	})
	cancel()
	err := waitWithin(cctx, t.lateGrace(), done)
	if errors.Is(err, errOutlivedGiveUp) {
		t.noteLate("a call given up on once its COMMIT waited")
	}
	return err
}

// restartAfterRelease reports what the release sent while COMMITs waited
// got, restarts node 0 when the strategy claims to survive restarts, and
// sends the release again as the contract allows: it gives back nothing
// more when the first one committed.
func (t *trial) restartAfterRelease(ctx context.Context, key string, relUnits int, relErr error) error {
	if key == "" {
		if _, ok := t.node(0).(strategy.Releaser); !ok {
			t.fact("release while COMMITs wait", "not applicable: no Release (strategy.Releaser)")
		}
		return nil
	}
	t.fact("release while COMMITs wait", "%s", map[bool]string{true: "ended with an error (unknown)", false: "answered before its COMMIT could return"}[relErr != nil])
	if r, ok := t.dep.(strategy.Restarter); ok && t.env.Meta.Claims.Has(strategy.SurvivesRestart) {
		if err := r.Restart(ctx, 0); err != nil {
			return fmt.Errorf("restart node 0 after the release in doubt: %w", err)
		}
		t.restarted = true
		t.fact("then", "node 0 restarted before it served anything else (the strategy claims survives-restart)")
	}
	durable, err := t.lookupAll(ctx, []string{key})
	if err != nil {
		return err
	}
	was := durable[key].Status
	t.check(strategy.ReturnOnce, "a release that answered while its COMMIT waited, its caller's deadline passed, is borne out: 1 unit if the row was released, 0 if not",
		relErr != nil || (relUnits == 1) == (was == strategy.StatusReleased),
		fmt.Sprintf("the release answered %d units and no error; the row is %s", relUnits, was), key)
	units, err := t.release(ctx, "r-again", 0, key)
	if err != nil {
		return fmt.Errorf("release %s again: %w", t.plain(key), err)
	}
	t.check(strategy.ReturnOnce, "a release sent again after an unknown outcome gives back nothing more when the first committed", was != strategy.StatusReleased || units == 0,
		fmt.Sprintf("the row was %s before the resend, which gave back %d", was, units), key)
	return nil
}

// holdToExpire holds one unit of the scenario's last SKU on node 0 and
// makes it due, for a strategy with an expiry job (strategy.Expirer) and a
// way to age a hold (strategy.Ager), in the odd trials (the even ones
// release a unit of that SKU); it returns its key ("" when there is no
// expiry).
func (t *trial) holdToExpire(ctx context.Context) (string, error) {
	_, expires := t.node(0).(strategy.Expirer)
	ager, ages := t.dep.(strategy.Ager)
	if !expires || !ages || t.n%2 == 0 {
		return "", nil
	}
	last := t.in.Stock[len(t.in.Stock)-1].SKU
	key := t.key("expire-0000")
	op := t.holdForFault(ctx, "x", strategy.Request{Key: key, User: t.user("user-expire-0000"), SKU: t.sku(last), TTL: strategy.TTLForever})
	if op.Type != OpOK {
		return "", fmt.Errorf("hold the reservation to expire: %s %s %s", op.Type, op.Outcome, op.Err)
	}
	if n, err := ager.MakeDue(ctx, []string{key}); err != nil || n != 1 {
		return "", fmt.Errorf("make the reservation to expire due: %d rows, %v", n, err)
	}
	return key, nil
}

// expireWhileWaiting runs the expiry job on node 0 while COMMITs wait,
// giving up once its COMMIT waits too (untilCommitWaits), and returns its
// answer: no error would mean an answer before its COMMIT.
func (t *trial) expireWhileWaiting(ctx context.Context, key string) (int, error) {
	if key == "" {
		return 0, nil
	}
	var units int
	err := t.untilCommitWaits(ctx, func(ctx context.Context) (err error) {
		units, err = t.node(0).(strategy.Expirer).ExpireDue(ctx)
		return err
	})
	return units, err
}

// expireAgain runs the expiry job again once the COMMITs are done, as its
// next tick would, and checks that the hold it moved while they waited has
// its unit back: the SKU's audit balances.
func (t *trial) expireAgain(ctx context.Context, key string, expireUnits int, expireErr error) error {
	if key == "" {
		if _, ok := t.node(0).(strategy.Expirer); !ok {
			t.fact("expiry job while COMMITs wait", "not applicable: no ExpireDue (strategy.Expirer)")
		}
		return nil
	}
	t.fact("expiry job while COMMITs wait", "%s", map[bool]string{true: "ended with an error (unknown)", false: "answered before its COMMIT could return"}[expireErr != nil])
	if expireErr == nil {
		// The one due hold is the trial's only one: a run that answered
		// reported it, or left it HELD.
		durable, err := t.lookupAll(ctx, []string{key})
		if err != nil {
			return err
		}
		was := durable[key].Status
		t.check(strategy.Conserves, "an expiry job that answered while its COMMIT waited, its caller's deadline passed, is borne out: 1 unit if it expired the one due hold, 0 if the hold is still HELD",
			(expireUnits == 1) == (was == strategy.StatusExpired),
			fmt.Sprintf("the job answered %d units and no error; the due hold is %s", expireUnits, was), key)
	}
	if _, err := t.node(0).(strategy.Expirer).ExpireDue(ctx); err != nil {
		return fmt.Errorf("the expiry job's next run: %w", err)
	}
	got, err := t.node(0).Lookup(ctx, key)
	if err != nil {
		return fmt.Errorf("lookup %s: %w", t.plain(key), err)
	}
	sku := t.sku(t.in.Stock[len(t.in.Stock)-1].SKU)
	list, err := t.dep.Audit(ctx)
	if err != nil {
		return fmt.Errorf("audit after the expiry job's next run: %w", err)
	}
	for _, a := range list {
		if a.SKU != sku {
			continue
		}
		t.check(strategy.Conserves, "an expiry job whose COMMIT outlived its caller's deadline, run again once the COMMITs are done, leaves the unit of the hold it expired available (the SKU's audit balances)",
			got.Status != strategy.StatusExpired || a.Drift() == 0,
			fmt.Sprintf("%s is %s; %s: total %d - available %d - active %d = drift %d", t.plain(key), got.Status, t.plain(sku), a.Total, a.Available, a.Active, a.Drift()), key)
	}
	return nil
}

// loadOver is t.load with the requests spread over these SKUs only.
// answeredWithin counts the reserve calls of keys with prefix that were
// answered, by an error or otherwise, sooner than d after they began.
func (t *trial) answeredWithin(prefix string, d time.Duration) int {
	n := 0
	for _, op := range t.hist.Ops() {
		if op.Kind == "reserve" && strings.HasPrefix(op.Req.Key, prefix+"-") && op.Complete-op.Invoke < d {
			n++
		}
	}
	return n
}

func (t *trial) loadOver(ctx context.Context, stock []StockInput, n int, prefix string, timeout time.Duration) {
	t.loadStock = stock
	defer func() { t.loadStock = nil }()
	t.load(ctx, n, prefix, timeout, nil, nil, nil)
}

// commitSessionWhileWaiting, for a strategy with attempts held open
// (strategy.SessionOpener), reserves the session SKU's unit in one on node
// 0 and commits it with a client deadline of d, while COMMITs wait for the
// absent standby: its Commit fails with the deadline although the
// transaction commits once the standby is back. The deadline starts at the
// Commit: with open and Reserve under it too, a loaded machine (CI, beside
// the race suite) spent it before the COMMIT was sent, the attempt rolled
// back, and a strategy that takes a failed COMMIT for a rollback
// (ctl-give-up-is-rollback) passed. The op is recorded like
// any reserve (unknown when Reserve or Commit failed) and sent on the
// channel; the channel is closed without one when there is no session.
// sessionSetupWithin bounds the session's open and Reserve in
// commitSessionWhileWaiting.
const sessionSetupWithin = 30 * time.Second

func (t *trial) commitSessionWhileWaiting(ctx context.Context, sku string, d time.Duration) chan Op {
	done := make(chan Op, 1)
	opener, ok := t.node(0).(strategy.SessionOpener)
	if !ok {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		// Open and Reserve write nothing that waits for the standby; their
		// bound is a hang's, not the test's.
		rctx, cancel := context.WithTimeout(ctx, sessionSetupWithin)
		defer cancel()
		req := strategy.Request{Key: t.key("session-0000"), User: t.user("user-session-0000"), SKU: sku, TTL: strategy.TTLForever}
		op := Op{Process: "session", Node: 0, Req: req, Invoke: t.hist.Begin()}
		sess, err := opener.OpenSession(rctx)
		if err != nil {
			done <- t.hist.End(reserveOp(op, strategy.Result{}, err))
			return
		}
		res, err := sess.Reserve(rctx, req)
		if err == nil {
			cctx, cancel := context.WithTimeout(rctx, d)
			err = sess.Commit(cctx)
			cancel()
		} else {
			_ = sess.Rollback(context.WithoutCancel(ctx))
		}
		done <- t.hist.End(reserveOp(op, res, err))
	}()
	return done
}

// sellAfterSession sends a new request for the session's SKU (one unit)
// on the session's node once every COMMIT is done: where the session's
// reservation committed, it must not be HELD. A strategy that took the
// COMMIT its caller gave up on for a rollback, and gave the unit back to a
// counter, sells it a second time here.
func (t *trial) sellAfterSession(ctx context.Context, session Op, sku string) error {
	got, err := t.node(0).Lookup(ctx, session.Req.Key)
	if err != nil {
		return fmt.Errorf("lookup of the session's reservation: %w", err)
	}
	if session.Type == OpInfo {
		t.vary("session: attempt held open answered unknown", 1)
	}
	op := t.reserve(ctx, "after-session", 0, strategy.Request{Key: t.key("after-session"), User: t.user("user-after-session"), SKU: sku, TTL: strategy.TTLForever})
	if got.Status == strategy.StatusHeld {
		t.check(strategy.NoOversell, "a session whose COMMIT its caller gave up on, and which committed, keeps its unit: a new request for its SKU of one unit is not HELD",
			op.Outcome != strategy.OutcomeHeld, fmt.Sprintf("the session's %s is HELD, and %s got %s", t.plain(session.Req.Key), t.plain(op.Req.Key), op.Outcome), op.Req.Key)
	}
	return nil
}
