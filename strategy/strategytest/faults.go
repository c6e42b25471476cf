package strategytest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
)

// Kill points of the helper-process scenarios.
const (
	KillBefore      = "before"      // the session is open, nothing done yet
	KillUncommitted = "uncommitted" // the work is done inside the session, not committed
)

// The fault scenarios that kill a client run it in a helper process: the
// test binary itself, re-executed with pgtest.EnvHelper (the os/exec test
// pattern). The helper opens the same strategy over the same database
// (Config.Attach), does its work inside a session, prints a STAGE line and
// waits to be killed with SIGKILL.

const helperName = "scenario-fault"

func init() { pgtest.RegisterHelper(helperName, faultHelper) }

// helperMetas holds strategies that are not in strategy's registry (negative
// controls, variants) but must be found by name in a helper process.
var helperMetas sync.Map

// RegisterForHelpers makes a strategy that is not registered with
// strategy.Register findable by name in a helper process; call it from an
// init function of the test binary that runs the fault scenarios.
func RegisterForHelpers(m strategy.Meta) { helperMetas.Store(m.Name, m) }

func lookupMeta(name string) (strategy.Meta, bool) {
	if m, ok := strategy.Lookup(name); ok {
		return m, true
	}
	v, ok := helperMetas.Load(name)
	if !ok {
		return strategy.Meta{}, false
	}
	return v.(strategy.Meta), true
}

func helperCanFind(name string) bool { _, ok := lookupMeta(name); return ok }

const envHelperArgs = "RESERVEBENCH_HELPER_ARGS"

type helperArgs struct {
	Strategy  string             `json:"strategy"`
	DSN       string             `json:"dsn"`
	Stock     []strategy.Stock   `json:"stock"`
	Nodes     int                `json:"nodes"`
	Action    string             `json:"action"` // "expire" or "reserve"
	KillPoint string             `json:"kill_point"`
	Requests  []strategy.Request `json:"requests,omitempty"`
}

// faultHelper is the helper process: it never returns on success, it is
// killed. Output lines: "STAGE <kill point> <details>" or "ERROR <text>".
func faultHelper() int {
	fail := func(format string, args ...any) int {
		fmt.Printf("ERROR "+format+"\n", args...)
		return 2
	}
	var a helperArgs
	if err := json.Unmarshal([]byte(os.Getenv(envHelperArgs)), &a); err != nil {
		return fail("args: %v", err)
	}
	meta, ok := lookupMeta(a.Strategy)
	if !ok {
		return fail("strategy %q is not registered in this binary", a.Strategy)
	}
	ctx := context.Background()
	pool, err := pgtest.OpenPool(ctx, a.DSN, 8)
	if err != nil {
		return fail("%v", err)
	}
	dep, err := meta.Open(ctx, strategy.Config{DB: pool, Stock: a.Stock, Nodes: a.Nodes, Attach: true})
	if err != nil {
		return fail("open with Attach: %v", err)
	}
	opener := dep.Node(0).(strategy.SessionOpener)
	var details []string
	switch a.Action {
	case "expire":
		s, err := opener.OpenSession(ctx)
		if err != nil {
			return fail("session: %v", err)
		}
		if a.KillPoint == KillUncommitted {
			units, err := s.(strategy.SessionExpirer).ExpireDue(ctx)
			if err != nil {
				return fail("expire: %v", err)
			}
			details = append(details, fmt.Sprintf("returned=%d", units))
		}
	case "reserve":
		// One transaction holds them all: a second attempt on the same SKU
		// would wait for the first in strategies that serialise per SKU.
		s, err := opener.OpenSession(ctx)
		if err != nil {
			return fail("session: %v", err)
		}
		for _, req := range a.Requests {
			if a.KillPoint == KillUncommitted {
				res, err := s.Reserve(ctx, req)
				if err != nil {
					return fail("reserve: %v", err)
				}
				details = append(details, string(res.Outcome))
			}
		}
	default:
		return fail("unknown action %q", a.Action)
	}
	fmt.Printf("STAGE %s %s\n", a.KillPoint, strings.Join(details, " "))
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // wait for SIGKILL (or the parent's death)
	return 0
}

// helperProc is a running helper.
type helperProc struct {
	cmd     *exec.Cmd
	stdin   interface{ Close() error }
	appName string
	stage   string
	stderr  *strings.Builder
}

// spawnHelper starts the helper and waits for its STAGE line.
func (t *trial) spawnHelper(ctx context.Context, a helperArgs) (*helperProc, error) {
	appName := fmt.Sprintf("rb-fault-%s", strings.TrimPrefix(t.suffix, "-"))
	a.Strategy, a.Stock, a.Nodes = t.env.Meta.Name, t.cfg.Stock, t.cfg.NodeCount()
	a.DSN = withAppName(t.env.DB.Config().ConnString(), appName)
	b, err := json.Marshal(a)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), pgtest.EnvHelper+"="+helperName, envHelperArgs+"="+string(b))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	h := &helperProc{cmd: cmd, stdin: stdin, appName: appName, stderr: &strings.Builder{}}
	cmd.Stderr = h.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start helper: %w", err)
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "STAGE ") || strings.HasPrefix(l, "ERROR ") {
				lines <- l
				break
			}
		}
		close(lines)
		for sc.Scan() { // drain, so the helper never blocks on a full pipe
		}
	}()
	select {
	case l, ok := <-lines:
		if !ok || strings.HasPrefix(l, "ERROR ") {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, fmt.Errorf("helper failed: %s %s", l, h.stderr.String())
		}
		h.stage = strings.TrimPrefix(l, "STAGE ")
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("helper gave no STAGE line within a minute: %s", h.stderr.String())
	}
	return h, nil
}

// kill sends SIGKILL and reaps the process; it reports whether the process
// died of that signal (exit "137" in a shell).
func (h *helperProc) kill() (bool, error) {
	if err := h.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return false, err
	}
	err := h.cmd.Wait()
	_ = h.stdin.Close()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return true, nil
		}
	}
	return false, fmt.Errorf("helper did not die of SIGKILL: %v", err)
}

// waitBackendsGone waits until PostgreSQL has noticed the dead client: the
// server finds out only at its next socket read or write (docs 20.3.1, no
// client_connection_check_interval), so the seed polls pg_stat_activity by
// application_name, and so do we. Until then the dead session's locks and
// uncommitted work are still there.
func (t *trial) waitBackendsGone(ctx context.Context, appName string) error {
	return t.waitNone(ctx, "backends of the killed helper "+appName,
		`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, appName)
}

// waitNone polls a count from pg_stat_activity until it is 0, for at most
// 30 seconds. It waits for the server to catch up with something that has
// already happened (a client died, a wait was lifted); it orders nothing.
func (t *trial) waitNone(ctx context.Context, what, countSQL string, args ...any) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := t.env.Admin.QueryRow(ctx, countSQL, args...).Scan(&n); err != nil {
			return fmt.Errorf("count %s: %w", what, err)
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d %s still there after 30s", n, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func withAppName(dsn, name string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		return dsn + sep + "application_name=" + name
	}
	return dsn + " application_name=" + name
}

func (t *trial) killPoint() string { return t.in.KillPoints[(t.n-1)%len(t.in.KillPoints)] }

// runKillRelease is C28-09: a separate process runs the expiry job inside a
// transaction and is killed with SIGKILL before it commits. Nothing may come
// back before recovery; rerunning the job returns the units exactly once.
func runKillRelease(ctx context.Context, t *trial) error {
	in, kp := t.in, t.killPoint()
	keys, err := t.holdMany(ctx, in.Held)
	if err != nil {
		return err
	}
	due := keys[:in.FirstDue]
	if err := t.makeDue(ctx, due); err != nil {
		return err
	}
	before, err := t.audit(ctx)
	if err != nil {
		return err
	}
	h, err := t.spawnHelper(ctx, helperArgs{Action: "expire", KillPoint: kp})
	if err != nil {
		return err
	}
	during, err := t.audit(ctx)
	if err != nil {
		_, _ = h.kill()
		return err
	}
	killed, err := h.kill()
	if err != nil {
		return err
	}
	if err := t.waitBackendsGone(ctx, h.appName); err != nil {
		return err
	}
	after, err := t.audit(ctx)
	if err != nil {
		return err
	}
	count, _, err := t.statuses(ctx, due)
	if err != nil {
		return err
	}
	label := "kill point " + kp
	t.fact(label+": helper", "%s; killed by SIGKILL: %v", h.stage, killed)
	backDuring, backAfterKill := sumAvailable(during)-sumAvailable(before), sumAvailable(after)-sumAvailable(before)
	t.fact(label+": units back while the helper held its transaction open", "%d", backDuring)
	t.fact(label+": units back after the kill, before the rerun", "%d", backAfterKill)
	t.check(strategy.ReturnOnce, "an uncommitted release gives nothing back", backDuring == 0,
		fmt.Sprintf("the stock rose by %d while the release was uncommitted", backDuring))
	t.check(strategy.ReturnOnce, "a release killed before commit gives nothing back", backAfterKill == 0 && count[strategy.StatusHeld] == len(due),
		fmt.Sprintf("after the kill: stock rose by %d, statuses %v", backAfterKill, count))

	for i, want := range []int{len(due), 0} {
		name := "rerun"
		if i == 1 {
			name = "second rerun"
		}
		var reported int
		back, err := t.returned(ctx, func() { reported, _ = t.expireUntilDone(ctx, name, i) })
		if err != nil {
			return err
		}
		t.fact(label+": "+name, "%d units back", back)
		t.check(strategy.ReturnOnce, name+" after the kill returns each due unit once", back == want && reported == back,
			fmt.Sprintf("want %d back, the stock rose by %d, the job reported %d", want, back, reported))
	}
	return nil
}

// runKillReserve: a process holding uncommitted reservations (in one
// transaction) is killed; none
// of them may survive, and the units are available again once its backends
// are gone.
func runKillReserve(ctx context.Context, t *trial) error {
	in, kp := t.in, t.killPoint()
	sku := t.sku(in.Stock[0].SKU)
	var reqs []strategy.Request
	var keys []string
	for i := 0; i < in.Held; i++ {
		r := strategy.Request{Key: t.key(fmt.Sprintf("req-dead-%02d", i)), User: t.user(fmt.Sprintf("user-dead-%02d", i)), SKU: sku, TTL: strategy.TTLForever}
		reqs, keys = append(reqs, r), append(keys, r.Key)
	}
	before, err := t.audit(ctx)
	if err != nil {
		return err
	}
	h, err := t.spawnHelper(ctx, helperArgs{Action: "reserve", KillPoint: kp, Requests: reqs})
	if err != nil {
		return err
	}
	visible, err := t.lookupAll(ctx, keys)
	if err != nil {
		_, _ = h.kill()
		return err
	}
	killed, err := h.kill()
	if err != nil {
		return err
	}
	if err := t.waitBackendsGone(ctx, h.appName); err != nil {
		return err
	}
	survived, err := t.lookupAll(ctx, keys)
	if err != nil {
		return err
	}
	after, err := t.audit(ctx)
	if err != nil {
		return err
	}
	count := func(m map[string]strategy.Reservation) int {
		n := 0
		for _, r := range m {
			if r.Status != strategy.StatusNotFound {
				n++
			}
		}
		return n
	}
	label := "kill point " + kp
	t.fact(label+": helper", "%s; killed by SIGKILL: %v", h.stage, killed)
	t.fact(label+": reservations visible while held, after the kill", "%d, %d", count(visible), count(survived))
	t.check(Base, "an uncommitted reservation is invisible to others", count(visible) == 0,
		fmt.Sprintf("%d of the helper's uncommitted reservations were visible", count(visible)))
	t.check(Base, "no reservation of a killed process survives", count(survived) == 0,
		fmt.Sprintf("%d of the killed helper's reservations exist", count(survived)))
	t.check(strategy.Conserves, "the units are available again once its backends are gone", sumAvailable(after) == sumAvailable(before),
		fmt.Sprintf("available %d before, %d after", sumAvailable(before), sumAvailable(after)))

	// The units can be sold again, to someone else.
	sold := 0
	for i := range reqs {
		op := t.reserve(ctx, "c", i, strategy.Request{Key: t.key(fmt.Sprintf("req-after-%02d", i)), User: t.user(fmt.Sprintf("user-after-%02d", i)), SKU: sku, TTL: strategy.TTLForever})
		if op.Outcome == strategy.OutcomeHeld {
			sold++
		}
	}
	t.fact(label+": sold again afterwards", "%d of %d", sold, len(reqs))
	t.check(Base, "the killed process's units can be sold again", sold == len(reqs), fmt.Sprintf("%d of %d", sold, len(reqs)))
	return nil
}

// load sends n requests from the workers, request i for SKU i modulo the
// stock's SKUs, each with its own deadline when timeout > 0. It counts
// acknowledged reservations in acked, and stops taking new requests once
// stop is closed.
func (t *trial) load(ctx context.Context, n int, prefix string, timeout time.Duration, stop <-chan struct{}, acked *atomic.Int64, onError func()) {
	queue := make(chan int, n)
	for i := 0; i < n; i++ {
		queue <- i
	}
	close(queue)
	var wg sync.WaitGroup
	for w := 0; w < t.in.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range queue {
				select {
				case <-stop:
					return
				default:
				}
				rctx, cancel := ctx, context.CancelFunc(func() {})
				if timeout > 0 {
					rctx, cancel = context.WithTimeout(ctx, timeout)
				}
				sku := t.sku(t.in.Stock[i%len(t.in.Stock)].SKU)
				op := t.reserve(rctx, fmt.Sprintf("w%d", w), i, strategy.Request{
					Key: t.key(fmt.Sprintf("%s-%04d", prefix, i)), User: t.user(fmt.Sprintf("user-%s-%04d", prefix, i)), SKU: sku, TTL: strategy.TTLForever})
				cancel()
				if op.Type == OpOK && acked != nil {
					acked.Add(1)
				}
				if op.Type == OpInfo && onError != nil {
					onError()
				}
			}
		}()
	}
	wg.Wait()
}

// countTypes counts the reserve operations by type.
func (t *trial) countTypes() (ok, fail, info int) {
	for _, op := range t.hist.Ops() {
		if op.Kind != "reserve" {
			continue
		}
		switch op.Type {
		case OpOK:
			ok++
		case OpFail:
			fail++
		case OpInfo:
			info++
		}
	}
	return ok, fail, info
}

// resetPools drops every connection of the harness's pools: after a server
// restart they are all dead.
func (t *trial) resetPools() {
	t.env.DB.Reset()
	if t.env.Admin != t.env.DB {
		t.env.Admin.Reset()
	}
}

// runServerCrash stops the server with pg_ctl stop -m immediate while
// reservations run, starts it again on the same data, and checks the history
// against what survived: acknowledged reservations are there, refused ones
// are not, unknown ones are resolved, the audit balances, and the strategy
// serves again.
func runServerCrash(ctx context.Context, t *trial) error {
	in := t.in
	crashAfter := in.CrashAfter[(t.n-1)%len(in.CrashAfter)]
	var acked atomic.Int64
	stop := make(chan struct{})
	var stopOnce sync.Once
	halt := func() { stopOnce.Do(func() { close(stop) }) }
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		// The first error means the server is going: the workers finish
		// what is in flight and send nothing more.
		t.load(ctx, in.Requests, "load", 0, stop, &acked, halt)
	}()
	// Crash once crashAfter reservations are acknowledged (counted, not timed).
	tick := time.NewTicker(time.Millisecond)
	for acked.Load() < int64(crashAfter) {
		select {
		case <-loadDone:
			tick.Stop()
			return fmt.Errorf("the load finished before %d acknowledgements", crashAfter)
		case <-tick.C:
		}
	}
	tick.Stop()
	if err := t.env.Server.Crash(ctx); err != nil {
		halt()
		<-loadDone
		return fmt.Errorf("crash: %w", err)
	}
	halt()
	<-loadDone
	if err := t.env.Server.Restart(ctx); err != nil {
		return fmt.Errorf("restart after crash: %w", err)
	}
	t.resetPools()
	ok, fail, info := t.countTypes()
	t.fact(fmt.Sprintf("crash after %d acknowledged", crashAfter), "the server was stopped with pg_ctl stop -m immediate and started again")
	t.vary("acknowledged before the crash", ok)
	t.vary("refused before the crash", fail)
	t.vary("outcome unknown at the crash", info)

	// What the crash left: acknowledged reservations must all be there, and
	// the audit right after the restart shows what in-memory counters made
	// of the requests in flight (memquota holds their units in doubt).
	var ackedKeys []string
	for _, op := range t.hist.Ops() {
		if op.Kind == "reserve" && op.Type == OpOK {
			ackedKeys = append(ackedKeys, op.Req.Key)
		}
	}
	present, err := t.lookupAll(ctx, ackedKeys)
	if err != nil {
		return err
	}
	missing := 0
	for _, d := range present {
		if d.Status == strategy.StatusNotFound {
			missing++
		}
	}
	if missing == 0 {
		t.fact("acknowledged before the crash, present after recovery", "all")
	} else {
		t.fact("acknowledged before the crash, present after recovery", "%d missing", missing)
	}
	early, err := t.audit(ctx)
	if err != nil {
		return err
	}
	t.vary("drift right after the restart, before any request", early[t.sku(in.Stock[0].SKU)].Drift())

	// The strategy serves again once the server is back.
	sku := t.sku(in.Stock[0].SKU)
	served := 0
	for i := 0; i < 3; i++ {
		op := t.reserve(ctx, "after", i, strategy.Request{Key: t.key(fmt.Sprintf("req-after-%d", i)), User: t.user(fmt.Sprintf("user-after-%d", i)), SKU: sku, TTL: strategy.TTLForever})
		if op.Type == OpOK {
			served++
		}
	}
	t.fact("served after restart", "%d of 3", served)
	late, err := t.audit(ctx)
	if err != nil {
		return err
	}
	t.fact("drift once it serves again", "%d", late[sku].Drift())
	t.check(Base, "the strategy serves requests again after the server restarts", served == 3, fmt.Sprintf("%d of 3 requests acknowledged", served))
	return nil
}

// runCommitTimeout makes COMMIT wait (synchronous replication to a standby
// that does not exist), lets each client's deadline expire while its COMMIT
// is in flight, then lets the commits finish. The client saw an error; the
// reservation may well exist. The harness must record it as unknown and the
// check must find what really happened.
func runCommitTimeout(ctx context.Context, t *trial) error {
	if err := t.syncStandby(ctx, "reservebench_no_such_standby"); err != nil {
		return err
	}
	// A second is far more than a reservation needs to reach its COMMIT, even
	// under -race on a loaded machine; the COMMIT then waits for ever.
	t.load(ctx, t.in.Requests, "slow", time.Second, nil, nil, nil)
	if err := t.syncStandby(ctx, ""); err != nil {
		return err
	}
	// The clients closed their connections; the committed transactions
	// finish once the wait is lifted. Wait for those backends to go.
	if err := t.waitIdle(ctx); err != nil {
		return err
	}
	ok, fail, info := t.countTypes()
	t.fact("requests whose deadline expired during COMMIT", "%d of %d (acknowledged %d, refused %d)", info, t.in.Requests, ok, fail)
	t.check(Base, "a deadline at commit is an unknown outcome, never a definite one", info == t.in.Requests && ok == 0 && fail == 0,
		fmt.Sprintf("ok %d, fail %d, unknown %d of %d", ok, fail, info, t.in.Requests))
	resolved := 0
	var keys []string
	for _, op := range t.hist.Ops() {
		if op.Type == OpInfo {
			keys = append(keys, op.Req.Key)
		}
	}
	durable, err := t.lookupAll(ctx, keys)
	if err != nil {
		return err
	}
	for _, d := range durable {
		if d.Status != strategy.StatusNotFound {
			resolved++
		}
	}
	t.fact("unknown outcomes that had committed", "%d of %d", resolved, len(keys))
	return nil
}

// syncStandby sets synchronous_standby_names and waits until commits behave
// accordingly: a canary transaction's COMMIT hangs (name set) or returns
// (name empty). The checkpointer publishes the setting to committing
// backends after the reload, so the effect is observed, not assumed.
func (t *trial) syncStandby(ctx context.Context, name string) error {
	stmt := "ALTER SYSTEM RESET synchronous_standby_names"
	if name != "" {
		stmt = "ALTER SYSTEM SET synchronous_standby_names = " + pgx.Identifier{name}.Sanitize()
	}
	if _, err := t.env.Admin.Exec(ctx, stmt); err != nil {
		return fmt.Errorf("%s: %w", stmt, err)
	}
	if _, err := t.env.Admin.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		hangs, err := canaryCommitHangs(ctx, t.env.Admin)
		if err != nil {
			return err
		}
		if hangs == (name != "") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("synchronous_standby_names=%q did not take effect within 30s", name)
		}
		time.Sleep(10 * time.Millisecond) // paces the probe; the decision is the canary's
	}
}

// canaryCommitHangs commits a transaction that has an xid and wrote WAL (a
// transaction that wrote none never waits for a standby) and reports whether
// its COMMIT was still waiting after 100ms.
func canaryCommitHangs(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, "SELECT pg_logical_emit_message(true, 'reservebench', 'canary')"); err != nil {
		_ = tx.Rollback(ctx)
		return false, err
	}
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	err = tx.Commit(cctx)
	if err == nil {
		return false, nil
	}
	if cctx.Err() != nil {
		conn.Conn().Close(ctx) // it timed out mid-COMMIT: this connection is unusable
		return true, nil
	}
	return false, err
}

// waitIdle waits until no backend of the database is still in a commit.
func (t *trial) waitIdle(ctx context.Context) error {
	return t.waitNone(ctx, "backends waiting for synchronous replication", `
		SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event = 'SyncRep'`)
}

// runNodeDeath: node 0 sells some units, then requests die on it between
// the in-memory decrement and the durable write. The lost units are counted
// from the audit; then node 0 restarts and sells again, and the final audit
// shows whether the restart restored exactly the right count.
func runNodeDeath(ctx context.Context, t *trial) error {
	in := t.in
	sku := t.sku(in.Stock[0].SKU)
	req := func(prefix string, i int) strategy.Request {
		return strategy.Request{Key: t.key(fmt.Sprintf("%s-%03d", prefix, i)), User: t.user(fmt.Sprintf("user-%s-%03d", prefix, i)), SKU: sku, TTL: strategy.TTLForever}
	}
	for i := 0; i < in.Held; i++ {
		if op := t.reserve(ctx, "c", 0, req("sold", i)); op.Outcome != strategy.OutcomeHeld {
			return fmt.Errorf("setup: %s answered %s %s", op.Req.Key, op.Outcome, op.Err)
		}
	}
	// From the first death on, what the audit finds is the restart's to answer for.
	t.restarted = true
	crasher := t.dep.(strategy.ReserveCrasher)
	for i := 0; i < in.Crashes; i++ {
		r := req("dies", i)
		op := Op{Process: "dying", Node: 0, Req: r, Invoke: t.hist.Begin()}
		err := crasher.CrashMidReserve(ctx, 0, r)
		op = reserveOp(op, strategy.Result{}, err)
		if err == nil {
			op.Type, op.Err = OpInfo, "the request did not die"
		}
		t.hist.End(op)
	}
	lost, err := t.audit(ctx)
	if err != nil {
		return err
	}
	a := lost[sku]
	t.fact("units lost while node 0 runs on (drift)", "%d after %d requests died mid-reserve", a.Drift(), in.Crashes)
	if err := t.dep.Restart(ctx, 0); err != nil {
		return fmt.Errorf("restart node 0: %w", err)
	}
	back, err := t.audit(ctx)
	if err != nil {
		return err
	}
	t.fact("after restarting node 0", "available %d, active %d, drift %d", back[sku].Available, back[sku].Active, back[sku].Drift())
	held := 0
	for i := 0; i < in.Requests; i++ {
		if op := t.reserve(ctx, "c", 0, req("after", i)); op.Outcome == strategy.OutcomeHeld {
			held++
		}
	}
	share := strategy.ShareOf(in.Stock[0].Total, in.Nodes, 0)
	t.fact("node 0 sells after the restart", "%d (its share %d, %d sold before)", held, share, in.Held)
	t.check(strategy.SurvivesRestart, "a restarted node sells exactly what is left of its share", held == share-in.Held,
		fmt.Sprintf("node 0 sold %d after the restart; %d of its %d were sold before", held, in.Held, share))
	return nil
}
