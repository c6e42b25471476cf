package strategytest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reservebench/reservebench/strategy"
)

// redisPause is how long stallInFlight keeps Redis busy: longer than the
// 3 s a client usually waits for a reply (go-redis's default ReadTimeout),
// so that what is sent early in the pause times out. The request held in
// the database must send its last Redis call (an unlock) within
// redisPause - 3 s of the stall's start for that call to time out; its
// COMMIT comes first, and on a loaded disk a COMMIT can take a second or
// more (with a 4 s pause, ctl-lock-unlock-error-is-busy escaped in 2 of 4
// table runs on 2026-12-03). Redis answers the commands it holds with BUSY
// errors instead of running them once a script has run for its
// busy-reply-threshold (5 s by default), so the stall raises that limit
// for its own pause and puts it back after; a Redis that refuses CONFIG
// SET gets redisPauseShort, as long as the default limit allows.
const (
	redisPause      = 8 * time.Second
	redisPauseShort = 4800 * time.Millisecond
	// busyLimitConfig is the name Redis 7 also accepts for
	// busy-reply-threshold, and the only name Redis 6 knows.
	busyLimitConfig = "lua-time-limit"
)

// stallLockLease is the lease of the locks the stall's deployment takes
// outside PostgreSQL (strategy.Config.LockLease). The SETs of lock takes
// that gave up during the pause run after it, and their takers, gone, can
// neither release nor renew them: with a lease of 30 s the SKU stayed
// locked that long, and redislock's redis-restart took 43 s, 39 of them
// here, every request after the pause BUSY until the lease ran out. The
// locks of a working holder are renewed every third of it, as always.
const stallLockLease = 2 * time.Second

// stallProbe is how long a PING goes unanswered before the stall is taken
// to have begun: a PING that timed out on a loaded machine only means the
// requests may meet a shorter stall.
const stallProbe = 100 * time.Millisecond

// stallReleases is how many reservations stallInFlight releases while Redis
// is paused, and stallDue how many due holds its expiry job meets then.
const (
	stallReleases = 2
	stallDue      = 3
)

// busyScript keeps Redis busy for ARGV[1] microseconds. Redis runs one
// script at a time and reads no socket meanwhile, so the commands clients
// send are run once it ends, also those of a client that gave up waiting
// and closed its connection: Redis reads its command before the close.
var busyScript = redis.NewScript(`
local t = redis.call('TIME')
local stop = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1])
repeat t = redis.call('TIME') until tonumber(t[1]) * 1000000 + tonumber(t[2]) >= stop
return 1
`)

// stallInFlight (redis-restart): Redis is kept busy for redisPause by a
// script of the harness's own while requests are sent to a deployment of
// its own. A request whose client gave up before the reply does not know
// whether its command ran, and it did run, after the script: such a
// request is unknown, to be resolved by sending it again, never BUSY,
// which says nothing was written. The requests that got no answer are sent
// again; the BUSY ones are not, as a client told BUSY may walk away; the
// audit must then balance. A design that keeps nothing in Redis that a
// lost reply leaves behind passes whatever it answers.
func (t *trial) stallInFlight(ctx context.Context) error {
	in := t.in
	plain := in.Stock[0].SKU + "-stall"
	dep, send, err := t.sideDeployment(ctx, plain, stallLockLease)
	if err != nil {
		return err
	}
	defer dep.Close()
	opt, err := redis.ParseURL(t.cfg.Resources[strategy.Redis])
	if err != nil {
		return fmt.Errorf("stall: %w", err)
	}
	opt.ReadTimeout = redisPause + 30*time.Second // the harness's own client waits the pause out
	rdb := redis.NewClient(opt)
	defer rdb.Close()

	req := func(i int) strategy.Request {
		return strategy.Request{Key: t.key(fmt.Sprintf("req-stall-%03d", i)), User: t.user(fmt.Sprintf("user-stall-%03d", i)), SKU: t.sku(plain), TTL: strategy.TTLForever}
	}
	if err := busyScript.Load(ctx, rdb).Err(); err != nil {
		return fmt.Errorf("stall: load the busy script: %w", err)
	}
	// Requests first, sent at once while Redis is paused for less than a
	// client waits: each waits on a connection of its own, so the
	// deployment's pool ends with as many open as the pause below needs,
	// and what that pause holds is a command sent, not a dial (a client's
	// handshake on a new connection times out before its command is ever
	// written, and a command never written tells nothing).
	warmDone, err := pauseRedis(ctx, rdb, opt, warmPause)
	if err != nil {
		return fmt.Errorf("stall: warm-up: %w", err)
	}
	warm := make([]Op, in.Requests)
	Together(len(warm), func(i int) {
		warm[i] = send("s-warm", i, strategy.Request{Key: t.key(fmt.Sprintf("req-stall-warm-%03d", i)), User: t.user(fmt.Sprintf("user-stall-warm-%03d", i)), SKU: t.sku(plain), TTL: strategy.TTLForever})
	})
	if err := <-warmDone; err != nil {
		return fmt.Errorf("stall: warm-up: the busy script: %w", err)
	}
	for _, op := range warm {
		if op.Outcome != strategy.OutcomeHeld {
			return fmt.Errorf("stall: the first requests on a fresh SKU: %s %s", op.Outcome, op.Err)
		}
	}
	// Reservations held before the stall and released while it lasts: a
	// release whose give-back to Redis outlives its client's wait is in
	// doubt, and Redis runs the give-back after the pause all the same. A
	// strategy that "undoes" a release whose give-back failed (the row set
	// back to HELD) then counts the unit twice.
	releaser, canRelease := dep.Node(0).(strategy.Releaser)
	var relKeys []string
	if canRelease {
		for i := 0; i < stallReleases; i++ {
			r := strategy.Request{Key: t.key(fmt.Sprintf("req-stall-rel-%d", i)), User: t.user(fmt.Sprintf("user-stall-rel-%d", i)), SKU: t.sku(plain), TTL: strategy.TTLForever}
			if op := send("s-rel", 0, r); op.Outcome != strategy.OutcomeHeld {
				return fmt.Errorf("stall: the reservation to release: %s %s", op.Outcome, op.Err)
			}
			relKeys = append(relKeys, r.Key)
		}
	}
	relErrs := make([]error, len(relKeys))
	// And an expiry job run while Redis is paused over a hold made due, a
	// job whose give-back Redis runs after the pause; the hold's client
	// then releases it (a cart abandoned as the job ran). A job that gives
	// units back without the markers a release reads gives the unit back
	// twice.
	expirer, canExpire := dep.Node(0).(strategy.Expirer)
	ager, ages := dep.(strategy.Ager)
	canExpire = canExpire && ages && canRelease
	var dueKeys []string
	if canExpire {
		// One job before the pause too, for the same reason as the release
		// below: what it sends Redis must be known there. stallDue holds
		// are due when the pause begins, and only the first is released
		// after it: a job that clears the owed marks of every row it tried,
		// not only of those whose give-back ran, loses the units of the
		// rows after the give-back that timed out, unless their release
		// finds the marker (outsider round 20's owedall passed with one
		// due hold, released). Whichever row the job tries first, one it
		// never tried is not released; a job run after the pause must give
		// its unit back.
		for i := 0; i < 1+stallDue; i++ {
			r := strategy.Request{Key: t.key(fmt.Sprintf("req-stall-due-%d", i)), User: t.user(fmt.Sprintf("user-stall-due-%d", i)), SKU: t.sku(plain), TTL: strategy.TTLForever}
			if op := send("s-due", 0, r); op.Outcome != strategy.OutcomeHeld {
				return fmt.Errorf("stall: the reservation to expire: %s %s", op.Outcome, op.Err)
			}
			if _, err := ager.MakeDue(ctx, []string{r.Key}); err != nil {
				return fmt.Errorf("stall: make due: %w", err)
			}
			if i == 0 {
				if _, err := expirer.ExpireDue(ctx); err != nil {
					return fmt.Errorf("stall: an expiry job before the pause: %w", err)
				}
			}
			if i > 0 {
				dueKeys = append(dueKeys, r.Key)
			}
		}
	}
	var expireErr error
	if canRelease {
		// One release before the pause, so that what a release sends Redis
		// is known there (a script by its SHA: Redis restarted on its files
		// above forgot its script cache, and an EVALSHA it does not know
		// runs nothing).
		if _, err := releaser.Release(ctx, warm[0].Req.Key); err != nil {
			return fmt.Errorf("stall: a release before the pause: %w", err)
		}
	}
	pause, restore := raiseBusyLimit(ctx, rdb)
	defer restore()
	// One request is held in the database while Redis stalls: its writes
	// queue on a lock the harness holds on the strategy's tables, and are
	// let go once Redis has stopped answering. It commits there, and what
	// it asks Redis after its commit (a lock's release, a marker's
	// clean-up) meets the stall: it may end unknown or HELD, never BUSY,
	// which would tell its client that nothing was written.
	n := in.Requests
	ops := make([]Op, n+1)
	tables, err := t.tablesToGate(ctx)
	if err != nil {
		return fmt.Errorf("stall: %w", err)
	}
	release := func() {}
	heldDone := make(chan struct{})
	if len(tables) == 0 {
		close(heldDone)
	} else {
		if release, err = holdTables(ctx, t.env.Admin, "SHARE"); err != nil {
			return fmt.Errorf("stall: %w", err)
		}
		defer func() { release() }()
		var finished atomic.Int64
		var box panicBox
		defer box.rethrow()
		go func() {
			defer close(heldDone)
			defer finished.Add(1)
			defer box.catch()
			ops[n] = send("s-held", 0, req(n+1))
		}()
		if _, err := waitActivity(ctx, t.env.Admin, "the request held in the database before the stall", `wait_event_type = 'Lock'`, 1, &finished); err != nil {
			release()
			<-heldDone
			return fmt.Errorf("stall: %w", err)
		}
	}
	busyDone, err := pauseRedis(ctx, rdb, opt, pause)
	if err != nil {
		release()
		<-heldDone
		return fmt.Errorf("stall: %w", err)
	}
	release()
	release = func() {}
	// The releases first, on connections the warm-up left open, and the
	// requests once they have their answers (a client's timeout, well
	// within the pause): sent together, a release could meet a new
	// connection's handshake instead, and send Redis nothing.
	Together(len(relKeys)+1, func(i int) {
		switch {
		case i < len(relKeys):
			_, relErrs[i] = releaser.Release(ctx, relKeys[i])
		case canExpire:
			_, expireErr = expirer.ExpireDue(ctx)
		}
	})
	Together(n, func(i int) { ops[i] = send(fmt.Sprintf("s-c%d", i), i, req(i+1)) })
	<-heldDone
	if len(tables) == 0 {
		ops = ops[:n]
	}
	if err := <-busyDone; err != nil {
		return fmt.Errorf("stall: the busy script: %w", err)
	}
	// After the script Redis reads what it held; a PING sent now is read
	// after it.
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("stall: PING after the pause: %w", err)
	}
	if canExpire {
		// The job's next tick: what the paused one owes, it gives back.
		if _, err := expirer.ExpireDue(ctx); err != nil {
			return fmt.Errorf("stall: the expiry job after the pause: %w", err)
		}
	}
	busy, unknown, unresolved := 0, 0, 0
	var busyWrote []string
	for _, op := range ops {
		if op.Outcome != strategy.OutcomeBusy {
			continue
		}
		r, err := dep.Node(0).Lookup(ctx, op.Req.Key)
		if err != nil {
			return fmt.Errorf("stall: lookup %s: %w", t.plain(op.Req.Key), err)
		}
		if r.Status != strategy.StatusNotFound {
			busyWrote = append(busyWrote, fmt.Sprintf("%s (%s)", t.plain(op.Req.Key), r.Status))
		}
	}
	for i, op := range ops {
		switch {
		case op.Type == OpInfo:
			unknown++
			for try := 0; ; try++ {
				again := send(op.Process+"'", i, op.Req)
				if again.Type == OpInfo {
					unresolved++
				}
				if again.Outcome != strategy.OutcomeBusy || try >= busyResends || ctx.Err() != nil {
					break
				}
			}
		case op.Outcome == strategy.OutcomeBusy:
			busy++
		}
	}
	// Before any release is sent again, the SKU is sold out: a release whose
	// reply Redis held may have given its unit back, or still owe it (a
	// unit then sells less, which its resend mends), but a unit given back
	// for a row that still holds it sells twice. Then the releases that got
	// no answer are sent again, as the contract allows, and the audit must
	// balance.
	relUnknown := 0
	for _, err := range relErrs {
		if err != nil {
			relUnknown++
		}
	}
	if len(dueKeys) > 0 && !releaseAnswered(ctx, releaser, dueKeys[0]) {
		unresolved++
	}
	soldOut := in.Stock[0].Total
	if len(relKeys) > 0 {
		for i := 0; i <= soldOut; i++ {
			op := send("s-out", i, strategy.Request{Key: t.key(fmt.Sprintf("req-stall-out-%03d", i)), User: t.user(fmt.Sprintf("user-stall-out-%03d", i)), SKU: t.sku(plain), TTL: strategy.TTLForever})
			if op.Outcome == strategy.OutcomeSoldOut {
				break
			}
		}
		out, err := soleAudit(ctx, dep, "stall, sold out")
		if err != nil {
			return err
		}
		t.check(strategy.NoOversell, "stall: after releases whose reply Redis held, and the release of a hold an expiry job moved while Redis held its give-back, the SKU sold out before those releases are sent again has no more active reservations than units", out.Active <= out.Total,
			fmt.Sprintf("%s: %d active for %d units, with %d releases with no answer, the expiry job's answer: %v", plain, out.Active, out.Total, relUnknown, expireErr))
		for i, key := range relKeys {
			if relErrs[i] != nil && !releaseAnswered(ctx, releaser, key) {
				unresolved++
			}
		}
	}
	a, err := soleAudit(ctx, dep, "stall")
	if err != nil {
		return err
	}
	t.vary("stall: releases with no answer while Redis was paused", relUnknown)
	t.vary("stall: BUSY while Redis was paused", busy)
	t.vary("stall: no answer while Redis was paused", unknown)
	t.fact("stall", "%s: Redis kept from serving %s (DEBUG SLEEP, or a busy script where DEBUG is refused) with %d releases%s and then %d requests sent, and one request held in the database as it began; the unanswered requests sent again, the SKU sold out, the unanswered releases sent again, the BUSY requests not", plain, pause, len(relKeys), map[bool]string{true: fmt.Sprintf(" and an expiry job over %d due holds (the first released after the pause, and the job run again)", stallDue), false: ""}[canExpire], n)
	t.check(Base, "stall: a request answered BUSY while Redis was paused has no reservation, also one that committed in the database before its last Redis call", len(busyWrote) == 0,
		fmt.Sprintf("%d BUSY answers with a reservation: %s", len(busyWrote), sample(busyWrote)))
	t.check(Base, "stall: every unanswered request or release gets an answer when sent again", unresolved == 0,
		fmt.Sprintf("%d requests or releases still got no answer once Redis served again", unresolved))
	t.check(Base, "stall: a request answered BUSY while Redis held its command wrote nothing, and a release whose reply it held gave its unit back once (total - available == active)", a.Drift() == 0,
		fmt.Sprintf("%s: total %d - available %d - active %d = drift %d, with %d BUSY answers not sent again and %d releases with no answer", plain, a.Total, a.Available, a.Active, a.Drift(), busy, relUnknown))
	return nil
}

// releaseAnswered sends a release until it answers, at most busyResends
// times more, and reports whether it did.
func releaseAnswered(ctx context.Context, r strategy.Releaser, key string) bool {
	for try := 0; try <= busyResends && ctx.Err() == nil; try++ {
		if _, err := r.Release(ctx, key); err == nil {
			return true
		}
	}
	return false
}

// warmPause is how long stallInFlight's warm-up keeps Redis busy: less
// than a client waits for a reply, so that the requests sent meanwhile all
// succeed, each on a connection of its own.
const warmPause = time.Second

// pauseRedis keeps Redis from serving for d and returns
// once a PING goes unanswered, the pause read from the server rather than
// assumed after a delay (a PING that timed out on a loaded machine only
// means what follows may meet a shorter pause); the channel gets the
// pause's end. It asks for DEBUG SLEEP, whose server sleeps, and where
// Redis refuses DEBUG it runs busyScript (loaded), which spins a core: on
// 2 cores, some 25 stalls of 8 s a table took a fifth of its CPU time.
// Either way Redis reads no socket meanwhile and runs what it finds after,
// also the command of a client that gave up and closed its connection.
func pauseRedis(ctx context.Context, rdb *redis.Client, opt *redis.Options, d time.Duration) (<-chan error, error) {
	done := make(chan error, 1)
	go func() {
		err := rdb.Do(ctx, "DEBUG", "SLEEP", strconv.FormatFloat(d.Seconds(), 'f', 3, 64)).Err()
		if rerr := redis.Error(nil); errors.As(err, &rerr) {
			// DEBUG refused (Redis 7 without enable-debug-command, a
			// managed Redis): the script, which spins a core meanwhile.
			err = busyScript.Run(ctx, rdb, nil, d.Microseconds()).Err()
		}
		done <- err
	}()
	probeOpt := *opt
	probeOpt.ReadTimeout, probeOpt.MaxRetries, probeOpt.PoolSize = stallProbe, -1, 1
	probe := redis.NewClient(&probeOpt)
	defer probe.Close()
	for {
		if err := probe.Ping(ctx).Err(); err != nil {
			return done, nil
		}
		select {
		case err := <-done:
			return nil, fmt.Errorf("the busy script ended before a PING went unanswered: %v", err)
		default:
		}
	}
}

// raiseBusyLimit lets a script run for redisPause without Redis answering
// other clients BUSY, and returns the pause to use and how to put the limit
// back. A Redis that refuses CONFIG (a managed one, or one with the command
// renamed) keeps its limit, and the stall is redisPauseShort.
func raiseBusyLimit(ctx context.Context, rdb *redis.Client) (time.Duration, func()) {
	was, err := rdb.ConfigGet(ctx, busyLimitConfig).Result()
	if err != nil || was[busyLimitConfig] == "" {
		return redisPauseShort, func() {}
	}
	limit := (redisPause + 5*time.Second).Milliseconds()
	if err := rdb.ConfigSet(ctx, busyLimitConfig, fmt.Sprint(limit)).Err(); err != nil {
		return redisPauseShort, func() {}
	}
	return redisPause, func() {
		// After the pause, or after a restart that already reset it: a
		// failure leaves a throwaway Redis with a longer limit, which no
		// other check depends on.
		_ = rdb.ConfigSet(context.WithoutCancel(ctx), busyLimitConfig, was[busyLimitConfig]).Err()
	}
}
