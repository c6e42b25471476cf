package strategytest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest/internal/pgcontrol"
)

// KindFailover: the primary is killed under load and a streaming standby
// is promoted; the strategy reaches it through its own pool.
const KindFailover = "failover"

func init() {
	registerKind(KindFailover, kindSpec{
		run:      runFailover,
		req:      requirement{server: true, caps: strategy.Capabilities{Attach: true}},
		required: []string{"replication", "requests", "lag_requests", "workers", "exclusive_server"},
		validate: func(in *Scenario) error {
			switch {
			case in.Replication != "async" && in.Replication != "sync":
				return errors.New(`replication must be "async" or "sync"`)
			case in.Requests < 1 || in.LagRequests < 1 || in.Workers < 1 || !in.ExclusiveServer:
				return errors.New("need requests, lag_requests, workers >= 1 and exclusive_server")
			case len(in.Stock) != 1 || in.Stock[0].Total < in.Requests+in.LagRequests+in.Workers:
				return errors.New("need one SKU with a unit for every request before the failover")
			case in.Repetitions != 1 || in.ShortRepetitions != 1:
				return errors.New("a failover consumes its primary: one trial per scenario")
			}
			return nil
		},
	})
}

// standbyName is the standby's application_name on the primary.
const standbyName = "rb_standby"

// waitingForStandby selects, in pg_stat_activity, backends waiting for a
// synchronous standby or for a lock (the harness's, or one a COMMIT waiting
// for the standby still holds).
const waitingForStandby = `(wait_event = 'SyncRep' OR wait_event_type = 'Lock')`

// runFailover takes a streaming standby of the scenario's own server
// (pgtest: pg_basebackup), synchronous (named in synchronous_standby_names)
// or asynchronous, and replaces the trial's deployment by one attached
// through a pool whose DSN names both servers with
// target_session_attrs=read-write, as a service behind a failover-aware DSN
// runs: the deployment, and whatever it keeps in memory, lives through the
// failover, and its pool reaches whichever server accepts writes. (Reopening
// it with Meta.Attach on the promoted standby would be a restart, which the
// restart and node-death scenarios already cover.) Then:
//
//  1. `requests` reservations from `workers` clients, and the standby has
//     replayed them all (its replay LSN reaches the primary's flush LSN);
//  2. the standby stops receiving: `lag_requests` more are sent. Async:
//     they are acknowledged, on the primary alone. Sync: their COMMITs wait
//     for the standby (seen as SyncRep waits in pg_stat_activity);
//  3. under load: `workers` more are sent, and held in flight until the
//     server shows them all waiting: on a lock the harness holds on the
//     strategy's tables (async), for the standby like the ones before them
//     (sync);
//  4. the primary is killed (pg_ctl stop -m immediate) and the standby
//     promoted; the pool reaches it.
//
// Then every request whose outcome is unknown is resolved and sent again
// with its key, and the SKU is sold out on the promoted standby. Lost:
// acknowledged, and absent after the failover. Sold twice: units the
// clients believe held (every acknowledgement, lost ones included) beyond
// the stock. Asynchronous replication loses the lag window: that, and what
// the audit finds after it, is charged to SurvivesFailover, which no
// strategy that commits on the primary alone can claim. With synchronous
// replication nothing acknowledged may be lost: the contract's check.
func runFailover(ctx context.Context, t *trial) error {
	if t.env.Short {
		return notApplicable("a failover takes a standby and a promotion, seconds each: not under -short (go test ./compare and make soak run it)")
	}
	srv, ok := t.env.Server.(*pgtest.Server)
	if !ok || srv.Kind != pgtest.KindLocal {
		return notApplicable("a failover needs a local cluster started by pgtest, to take a standby of")
	}
	in := t.in
	synchronous := in.Replication == "sync"
	sb, err := srv.StartStandby(ctx, standbyName)
	if errors.Is(err, pgtest.ErrNotSupported) {
		return notApplicable(err.Error())
	}
	if err != nil {
		return fmt.Errorf("start a standby: %w", err)
	}
	db, admin, err := t.failoverPools(ctx, srv, sb)
	if err != nil {
		_ = sb.Stop()
		return err
	}
	// Registered after the pools, so it runs before they close: a run that
	// failed before the failover lets the COMMITs waiting for the standby
	// finish, or the pools would wait for their connections.
	promoted := false
	t.onCleanup(func() {
		if !promoted {
			_ = pgcontrol.ResetSyncStandby(context.Background(), srv.AdminDSN("postgres"))
		}
		_ = sb.Stop()
	})
	if synchronous {
		if err := pgcontrol.SetSyncStandbyOf(ctx, srv.AdminDSN("postgres"), standbyName); err != nil {
			return err
		}
	}
	if err := t.dep.Close(); err != nil {
		return fmt.Errorf("close the direct deployment: %w", err)
	}
	acfg := t.cfg
	acfg.DB = db
	dep, err := t.env.Meta.Attach(ctx, acfg)
	if err != nil {
		return fmt.Errorf("attach through the failover pool: %w", err)
	}
	t.dep = dep
	t.env.Admin = admin

	// 1. Replicated.
	t.load(ctx, in.Requests, "replicated", 0, nil, nil, nil)
	if err := waitReplayed(ctx, admin, sb); err != nil {
		return err
	}
	// 2. The lag window.
	if err := sb.StopReceiving(ctx); err != nil {
		return err
	}
	var inFlight sync.WaitGroup
	var finished atomic.Int64 // requests of steps 2 and 3 that came back before the kill
	// A request that panics is the strategy's panic, rethrown here once
	// every request is back.
	var box panicBox
	defer box.rethrow()
	lagged := make([]Op, in.LagRequests)
	sku := t.sku(in.Stock[0].SKU)
	req := func(prefix string, i int) strategy.Request {
		return strategy.Request{Key: t.key(fmt.Sprintf("%s-%03d", prefix, i)), User: t.user(fmt.Sprintf("user-%s-%03d", prefix, i)), SKU: sku, TTL: strategy.TTLForever}
	}
	if synchronous {
		inFlight.Add(in.LagRequests)
		for i := range lagged {
			go func() {
				defer inFlight.Done()
				defer finished.Add(1)
				defer box.catch()
				lagged[i] = t.reserve(ctx, fmt.Sprintf("lag%d", i), i, req("lag", i))
			}()
		}
		// A COMMIT waiting for the standby still holds its locks: the
		// requests behind it wait on those. One that did not wait (a
		// strategy that commits asynchronously) has come back.
		if _, err := waitActivity(ctx, admin, "requests waiting for the standby, or for one that does", waitingForStandby, in.LagRequests, &finished); err != nil {
			return err
		}
	} else {
		Together(in.LagRequests, func(i int) { lagged[i] = t.reserve(ctx, fmt.Sprintf("lag%d", i), i, req("lag", i)) })
	}
	// 3. Under load: requests held in flight, queued on a lock the harness
	// holds (async), or waiting for the standby like the ones before (sync:
	// a lock on the tables would queue behind those COMMITs).
	release := func() {}
	if !synchronous {
		if release, err = holdTables(ctx, admin, "ACCESS EXCLUSIVE"); err != nil {
			return err
		}
	}
	queued := make([]Op, in.Workers)
	inFlight.Add(in.Workers)
	for i := range queued {
		go func() {
			defer inFlight.Done()
			defer finished.Add(1)
			defer box.catch()
			queued[i] = t.reserve(ctx, fmt.Sprintf("q%d", i), i, req("queued", i))
		}()
	}
	waiting := in.Workers
	if synchronous {
		waiting += in.LagRequests
	}
	if _, err := waitActivity(ctx, admin, "requests queued on the harness's lock", waitingForStandby, waiting, &finished); err != nil {
		release()
		return err
	}
	// 4. Failover.
	killedAt := time.Now()
	if err := srv.Crash(ctx); err != nil {
		release()
		return fmt.Errorf("kill the primary: %w", err)
	}
	release()
	inFlight.Wait()
	if err := sb.Promote(ctx); err != nil {
		return err
	}
	promoted = true
	db.Reset()
	admin.Reset()
	t.vary("primary killed to standby promoted (ms)", int(time.Since(killedAt).Milliseconds()))
	if synchronous {
		t.lossClaim = Base
	} else {
		t.lossClaim = strategy.SurvivesFailover
	}
	return t.afterFailover(ctx, lagged, queued)
}

// afterFailover resolves, sells out and reports.
func (t *trial) afterFailover(ctx context.Context, lagged, queued []Op) error {
	in := t.in
	var replicated, unknown []Op
	for _, op := range t.hist.Ops() {
		if op.Kind == "reserve" && strings.HasPrefix(op.Req.Key, "replicated-") {
			replicated = append(replicated, op)
		}
	}
	present := func(ops []Op) (acked, there int, err error) {
		var keys []string
		for _, op := range ops {
			if op.Type == OpOK {
				keys = append(keys, op.Req.Key)
			}
		}
		d, err := t.lookupAll(ctx, keys)
		for _, r := range d {
			if r.Status != strategy.StatusNotFound {
				there++
			}
		}
		return len(keys), there, err
	}
	acked, there, err := present(replicated)
	if err != nil {
		return err
	}
	t.fact("replicated before the standby fell behind", "%d acknowledged, %d present after the failover", acked, there)
	acked, there, err = present(lagged)
	if err != nil {
		return err
	}
	lost := acked - there
	for _, op := range append(append([]Op(nil), lagged...), queued...) {
		if op.Type == OpInfo {
			unknown = append(unknown, op)
		}
	}
	lagUnknown := 0
	for _, op := range lagged {
		if op.Type == OpInfo {
			lagUnknown++
		}
	}
	queuedUnknown := 0
	for _, op := range queued {
		if op.Type == OpInfo {
			queuedUnknown++
		}
	}
	how := "queued on a lock"
	if in.Replication == "sync" {
		how = "waiting for the standby"
	}
	// Which requests the kill met and which reached the promoted standby
	// is timing: a request still outside the server (behind a lock in
	// Redis, in a batch, or in a pool opening a connection on a busy
	// machine) when the harness saw the queue settle. The counts are
	// varying; what is acknowledged and lost is a fact.
	lagName := fmt.Sprintf("%d sent while the standby was behind (%s)", in.LagRequests, in.Replication)
	inFlightName := fmt.Sprintf("%d in flight at the kill (%s)", in.Workers, how)
	t.fact(lagName, "%d acknowledged, %d of them lost in the failover", acked, lost)
	t.vary(lagName+": unknown at the kill", lagUnknown)
	t.vary(inFlightName+": unknown", queuedUnknown)
	if err := t.resolveByRetry(ctx, "unknown at the kill", unknown, nil); err != nil {
		return err
	}

	// Sell out on the promoted standby.
	t.load(ctx, in.Stock[0].Total, "after", 0, nil, nil, nil)
	held, failed := 0, 0
	for _, op := range t.hist.Ops() {
		if op.Kind != "reserve" || !strings.HasPrefix(op.Req.Key, "after-") {
			continue
		}
		if op.Outcome == strategy.OutcomeHeld {
			held++
		}
		if op.Type == OpInfo {
			failed++
		}
	}
	believed := 0
	for _, op := range t.hist.Ops() {
		if op.Kind == "reserve" && op.Outcome == strategy.OutcomeHeld {
			believed++
		}
	}
	total := in.Stock[0].Total
	t.vary("sold on the promoted standby: HELD", held)
	t.fact("sold on the promoted standby", "the rest of %d units; %d acknowledged holds in all, %d units sold twice", total, believed, max(0, believed-total))
	a, err := t.audit(ctx)
	if err != nil {
		return err
	}
	sa := a[t.sku(in.Stock[0].SKU)]
	t.fact("audit after the failover", "total %d, available %d, active %d, drift %d", sa.Total, sa.Available, sa.Active, sa.Drift())
	t.check(Base, "the strategy serves on the promoted standby", failed == 0 && held > 0,
		fmt.Sprintf("%d HELD, %d without a known outcome", held, failed))
	t.check(t.lossClaim, "nothing acknowledged is lost in the failover", lost == 0,
		fmt.Sprintf("%d acknowledged reservations are missing after the failover", lost))
	return nil
}

// failoverPools opens the pools the trial goes on with: as Env.DB's and
// Env.Admin's roles, with both servers in the DSN and
// target_session_attrs=read-write, so they reach the primary now and the
// promoted standby after the failover.
func (t *trial) failoverPools(ctx context.Context, srv *pgtest.Server, sb *pgtest.Standby) (db, admin *pgxpool.Pool, err error) {
	open := func(base *pgxpool.Pool, maxConns int32) (*pgxpool.Pool, error) {
		cfg := base.Config().Copy()
		cc := cfg.ConnConfig
		cc.Host = srv.Dir()
		cc.Fallbacks = []*pgconn.FallbackConfig{{Host: sb.Dir(), Port: cc.Port}}
		cc.ValidateConnect = pgconn.ValidateConnectTargetSessionAttrsReadWrite
		cfg.MaxConns = maxConns
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("failover pool: %w", err)
		}
		t.onCleanup(p.Close)
		return p, nil
	}
	if db, err = open(t.env.DB, int32(t.in.LagRequests+t.in.Workers+4)); err != nil {
		return nil, nil, err
	}
	if admin, err = open(t.env.Admin, 4); err != nil {
		return nil, nil, err
	}
	return db, admin, nil
}

// waitReplayed waits until the standby has replayed everything the primary
// has flushed.
func waitReplayed(ctx context.Context, primary *pgxpool.Pool, sb *pgtest.Standby) error {
	var lsn string
	if err := primary.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&lsn); err != nil {
		return fmt.Errorf("primary's flush LSN: %w", err)
	}
	conn, err := pgx.Connect(ctx, sb.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("connect to the standby: %w", err)
	}
	defer conn.Close(ctx)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var done bool
		if err := conn.QueryRow(ctx, `SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)`, lsn).Scan(&done); err != nil {
			return fmt.Errorf("standby's replay LSN: %w", err)
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the standby did not replay up to %s within 30s", lsn)
		}
		time.Sleep(5 * time.Millisecond) // paces the question; the answer decides
	}
}

// queueSettle is how long the count of requests waiting in the server (and
// of those that came back) may stay unchanged, with at least one waiting
// and some not seen, before waitActivity takes the requests as queued.
//
// A strategy that batches (combine: a node serves the concurrent requests
// for a SKU with one statement at a time) has one backend for a whole
// batch, and the requests that arrive while it waits queue in the node's
// memory behind it, where pg_stat_activity cannot see them: the count
// stops short of n for good. They are in flight all the same (sent, not
// answered), which is all the scenarios need of them: what they decide is
// judged from the history and the durable state, not from where the
// requests waited. The period only bounds how long a strategy that does
// not batch gets to bring its stragglers to the server (on a busy machine,
// a pool opening connections); it is well above the gate's (gateSettle),
// which only provokes an ordering, because here the requests are to be
// caught in flight, and it costs only the strategies that batch.
const queueSettle = 500 * time.Millisecond

// waitActivity waits until at least n requests are accounted for: backends
// of the database (other than the asker) that match cond in
// pg_stat_activity, and requests that came back (done); or until at least
// one matches and the count has not changed for queueSettle: the others
// wait inside the strategy, behind a batch that does (see queueSettle), or
// outside PostgreSQL (a lock in Redis); short says so. A count that stays
// at zero still fails after 30s: no request reached the server.
func waitActivity(ctx context.Context, admin *pgxpool.Pool, what, cond string, n int, done *atomic.Int64) (short bool, err error) {
	start := time.Now()
	deadline := start.Add(30 * time.Second)
	last, lastChange := -1, start
	for {
		var got int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND `+cond).Scan(&got); err != nil {
			return false, fmt.Errorf("count %s: %w", what, err)
		}
		seen := got + int(done.Load())
		if seen >= n {
			return false, nil
		}
		if seen != last {
			last, lastChange = seen, time.Now()
		}
		if got > 0 && time.Since(lastChange) >= queueSettle {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, fmt.Errorf("%d of %d %s after 30s", got, n, what)
		}
		time.Sleep(5 * time.Millisecond) // paces the question; the answer decides
	}
}

// holdTables locks every table of the strategy's schema in mode (a LOCK
// TABLE mode: "ACCESS EXCLUSIVE" queues every statement, "SHARE" only the
// writes) in a transaction of the harness's own (as the gate does) until
// release is called.
func holdTables(ctx context.Context, admin *pgxpool.Pool, mode string) (release func(), err error) {
	conn, err := admin.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("hold the tables: %w", err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		conn.Release()
		return nil, fmt.Errorf("hold the tables: %w", err)
	}
	release = func() {
		_ = tx.Rollback(context.Background())
		conn.Release()
	}
	_, err = tx.Exec(ctx, `SET LOCAL lock_timeout = '10s'`)
	var tables []string
	if err == nil {
		tables, err = gateTables(ctx, tx)
	}
	if err == nil && len(tables) == 0 {
		err = errors.New("the strategy has no table to queue requests on")
	}
	if err == nil {
		_, err = tx.Exec(ctx, "LOCK TABLE "+strings.Join(tables, ", ")+" IN "+mode+" MODE")
	}
	if err != nil {
		release()
		return nil, fmt.Errorf("hold the tables: %w", err)
	}
	return release, nil
}
