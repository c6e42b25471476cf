package strategytest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/admission"
	"github.com/reservebench/reservebench/pgtest/pgproxy"
	"github.com/reservebench/reservebench/resourcetest"
	"github.com/reservebench/reservebench/service"
	"github.com/reservebench/reservebench/strategy"
)

// Env is what a scenario run needs besides its input.
type Env struct {
	Meta strategy.Meta
	// DB is handed to the strategy (Config.DB): the application role, a
	// bounded pool. Its MaxConns must leave room for the sessions of the
	// largest interleaving (4 is enough).
	DB *pgxpool.Pool
	// Admin is a pool on the same database for the harness's own probes
	// (pg_blocking_pids); it may be DB itself.
	Admin *pgxpool.Pool
	// Short runs short_repetitions and scales request counts by short_scale.
	Short bool
	// Repetitions overrides the input's repetitions when > 0 (the strategy
	// packages' own tests run the races at least 50 times).
	Repetitions int
	// Logf, when set, gets one progress line per trial.
	Logf func(format string, args ...any)
	// StepTimeout bounds how long an interleaving step may neither finish
	// nor be seen blocked in PostgreSQL (default 20s).
	StepTimeout time.Duration
	// Server lets scenarios marked exclusive_server crash, restart and
	// reconfigure the server DB lives on. Only for a server nothing else
	// uses; without it those scenarios are skipped.
	Server ServerControl
	// Admission, when set, makes the admission the http-* scenarios put
	// in front of the strategy, in place of admission.New: a negative
	// control passes one that does not bound.
	Admission func(inner strategy.Strategy, l admission.Limits) (service.Admission, error)
	// Resources are what the strategy needs besides PostgreSQL
	// (Meta.Needs), e.g. its Redis; the scenarios put their addresses into
	// Config.Resources and the fault scenarios kill and restart them. A
	// resource the strategy needs and Resources lacks is started for the
	// scenario (resourcetest.Start) and stopped after it. Scenarios that
	// kill a resource run on instances nothing else uses: give each
	// strategy its own.
	Resources resourcetest.Set
	// StopOnViolation, when set, ends the scenario once a check of one of
	// these claims has failed: after that trial, and within the
	// deployment contract after that part. A negative control needs one
	// violation of what it breaks to be caught; the trials and parts after
	// it only spend the run's time (they were a third of go test
	// ./compare's).
	StopOnViolation []strategy.Claims
	// Checks, when set, are the only checks of the deployment contract
	// that scenario runs, in this order (Check.Name, the names
	// docs/detection.md gives, e.g. "checkKeyOnItsWay"); the checks every
	// trial ends with still run. A negative control runs the check it is
	// made to fail (and any that must run before it), not the sixty
	// others. A name that is no check's ends the scenario with
	// ErrUnknownCheck.
	Checks []string

	// lp is how a strategy with Meta.Setup is served (roles.go); nil: RunScenario prepares it.
	lp *leastPriv
}

// ServerControl is what the exclusive-server scenarios do to the server
// (pgtest.Server implements it for clusters it started).
type ServerControl interface {
	Crash(ctx context.Context) error
	Restart(ctx context.Context) error
}

// notApplicable is returned by a runner that finds only mid-run that the
// strategy cannot do what the scenario needs (a helper process reports a
// missing capability): the scenario is n/a, not an error.
type notApplicable string

func (n notApplicable) Error() string { return string(n) }

// ErrSetup is matched by errors of the harness or the database, as opposed to
// checks that failed: the scenario could not be run.
var ErrSetup = errors.New("scenario setup failed")

// Run runs one scenario against one strategy, every trial, and returns the
// judged result. An error means the scenario could not be run at all.
func RunScenario(ctx context.Context, env Env, in *Scenario) (*Result, error) {
	r := &Result{
		Scenario: in.Name, Case: in.Case, Title: in.Title,
		Strategy: env.Meta.Name, Claims: env.Meta.Claims, Seed: in.SeedFor(env.Meta.Name),
	}
	if env.Admin == nil {
		env.Admin = env.DB
	}
	if env.StepTimeout == 0 {
		env.StepTimeout = 20 * time.Second
	}
	if missing := missingResources(env.Meta, env.Resources); len(missing) > 0 {
		own, err := resourcetest.Start(ctx, strategy.Meta{Name: env.Meta.Name, Needs: missing})
		if err != nil {
			return nil, fmt.Errorf("%w: %s/%s: %v", ErrSetup, env.Meta.Name, in.Name, err)
		}
		defer own.Close()
		set := resourcetest.Set{}
		for k, v := range env.Resources {
			set[k] = v
		}
		for k, v := range own {
			set[k] = v
		}
		env.Resources = set
	}
	closeRoles, err := env.serveLeastPrivileged(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %s/%s: least privilege: %v", ErrSetup, env.Meta.Name, in.Name, err)
	}
	defer closeRoles()
	runner, req := runnerFor(in)
	reps := in.Repetitions
	if env.Short {
		reps = in.ShortRepetitions
	}
	if env.Repetitions > 0 {
		reps = env.Repetitions
	}
	start := time.Now()
	runID := randomID()
	var trials []*trial
	for n := 1; n <= reps; n++ {
		t := &trial{env: &env, in: in, n: n, suffix: fmt.Sprintf("-%s-%d", runID, n), hist: NewHistory()}
		t.cfg = strategy.Config{DB: env.DB, Stock: in.stock(t.suffix), Nodes: in.Nodes, Resources: env.Resources.Addrs(),
			InternalDeadline: time.Duration(in.InternalDeadlineMS) * time.Millisecond}
		if req.proxy || req.proxyWithoutAttach && env.Meta.Attach == nil {
			if t.proxy, t.cfg.DB, err = t.proxyPool(ctx); err != nil {
				t.runCleanups()
				return nil, fmt.Errorf("%w: %s/%s trial %d: %v", ErrSetup, env.Meta.Name, in.Name, n, err)
			}
		}
		if t.cfg.DB != nil {
			t.acquiredBefore = t.cfg.DB.Stat().AcquiredConns()
		}
		dep, err := env.Meta.Open(ctx, t.cfg)
		if err != nil {
			t.runCleanups()
			return nil, fmt.Errorf("%w: %s/%s trial %d: open: %v", ErrSetup, env.Meta.Name, in.Name, n, err)
		}
		t.dep, t.caps = dep, strategy.Probe(env.Meta, dep)
		if missing := req.unmet(&env, t.caps); missing != "" {
			_ = dep.Close()
			t.runCleanups()
			r.Skipped = missing
			r.Elapsed = time.Since(start)
			return r, nil
		}
		if err := req.errUnfindable(&env); err != nil {
			_ = dep.Close()
			t.runCleanups()
			return nil, fmt.Errorf("%s: %w", in.Name, err)
		}
		err = runner(ctx, t)
		if err == nil {
			err = t.checkDurable(ctx)
		}
		if n := t.aborted.Load(); n > 0 {
			t.vary("transitions aborted by a conflict (40001, 40P01) and rerun", int(n))
		}
		if n := t.busyResent.Load(); n > 0 {
			t.vary("BUSY answers sent again", int(n))
		}
		if cerr := t.dep.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close: %w", cerr)
		}
		if err == nil {
			t.checkPoolReturned(ctx)
		}
		t.runCleanups()
		var na notApplicable
		if errors.As(err, &na) {
			r.Skipped = string(na)
			r.Elapsed = time.Since(start)
			return r, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s/%s trial %d: %v", ErrSetup, env.Meta.Name, in.Name, n, err)
		}
		trials = append(trials, t)
		stop := t.violated(env.StopOnViolation)
		if env.Logf != nil {
			failed := 0
			for _, c := range t.checks {
				if !c.ok {
					failed++
				}
			}
			env.Logf("%-16s %-18s trial %d/%d: %d checks, %d failed (%v)", env.Meta.Name, in.Name, n, reps, len(t.checks), failed, time.Since(start).Round(time.Millisecond))
		}
		if stop {
			break
		}
	}
	aggregate(r, trials)
	r.Elapsed = time.Since(start)
	return r, nil
}

type runnerFunc func(ctx context.Context, t *trial) error

// requirement is what a scenario needs beyond the core contract: the
// strategy's optional capabilities, and what only the harness can provide.
type requirement struct {
	caps strategy.Capabilities
	// server: a PostgreSQL server of the scenario's own (Env.Server).
	server bool
	// helper: the strategy can be found by name in a helper process.
	helper bool
	// resource: the strategy needs this resource (Meta.Needs), and the
	// harness started it, so it can kill and restart it.
	resource strategy.Resource
	// proxy: the trial's deployment is opened through a pgproxy of its own
	// (trial.proxy), so the runner can cut or silence what reaches the
	// server without Meta.Attach.
	proxy bool
	// proxyWithoutAttach: as proxy, for a strategy without Meta.Attach; the
	// runner attaches one that has it through a proxy of its own
	// (partition: a node process that reaches the database over the
	// network).
	proxyWithoutAttach bool
}

// runnerFor returns the runner of a kind and what it needs. Restart phases
// add the Restarter capability to a requests scenario.
func runnerFor(in *Scenario) (runnerFunc, requirement) {
	if k, ok := extraKinds[in.Kind]; ok {
		return k.run, k.req
	}
	switch in.Kind {
	case KindRequests:
		var r requirement
		for _, p := range in.Phases {
			if len(p.Restart) > 0 {
				r.caps.Restart = true
			}
		}
		return runRequests, r
	case KindExpiryReplay:
		return runExpiryReplay, requirement{caps: strategy.Capabilities{Expire: true, Age: true}}
	case KindConfirmVsExpire:
		return runConfirmVsExpire, requirement{caps: strategy.Capabilities{Expire: true, Age: true, Confirm: true}}
	case KindReleaseReplay:
		return runReleaseReplay, requirement{caps: strategy.Capabilities{Release: true}}
	case KindReleaseConfirm:
		return runReleaseVsConfirm, requirement{caps: strategy.Capabilities{Release: true, Confirm: true}}
	case KindInterleave:
		return runInterleave, requirement{caps: strategy.Capabilities{Sessions: true}}
	case KindBadInput:
		return runBadInput, requirement{}
	case KindKillRelease:
		return runKillRelease, requirement{caps: strategy.Capabilities{Expire: true, Age: true, ExpirySession: true, Attach: true}, helper: true}
	case KindKillReserve:
		return runKillReserve, requirement{caps: strategy.Capabilities{Sessions: true, Attach: true}, helper: true}
	case KindServerCrash:
		return runServerCrash, requirement{server: true}
	case KindCommitTimeout:
		return runCommitTimeout, requirement{server: true, proxy: true}
	case KindExpiryRace:
		return runExpiryRace, requirement{caps: strategy.Capabilities{Expire: true, Age: true}}
	case KindNodeDeath:
		return runNodeDeath, requirement{caps: strategy.Capabilities{CrashMidReserve: true, Restart: true}}
	case KindHTTPAdmission:
		return runHTTPAdmission, requirement{}
	case KindHTTPDisconnect:
		return runHTTPDisconnect, requirement{}
	case KindHTTPOverload:
		return runHTTPOverload, requirement{}
	case KindHTTPBadInput:
		return runHTTPBadInput, requirement{}
	case KindLockFault:
		return runLockFault, requirement{caps: strategy.Capabilities{Lock: true, Sessions: true}}
	case KindRedisRestart:
		return runRedisRestart, requirement{resource: strategy.Redis}
	}
	panic("strategytest: no runner for kind " + in.Kind) // Validate rejects unknown kinds
}

// unmet says why a requirement is not met by a strategy whose deployment
// has caps, or "" when it is.
func (r requirement) unmet(env *Env, caps strategy.Capabilities) string {
	var why []string
	if m := caps.Missing(r.caps); m != "" {
		why = append(why, "strategy does not implement "+m)
	}
	if r.caps.CrashMidReserve && !caps.CrashMidReserve {
		why = append(why, "it keeps no state in memory that a dying request could lose")
	}
	if r.server && env.Server == nil {
		why = append(why, "needs a server of its own (compare starts one; the conformance kit and a server named by "+pgtestEnvDSN+" cannot be crashed)")
	}
	if r.resource != "" {
		if srv, ok := env.Resources[r.resource]; !ok {
			why = append(why, fmt.Sprintf("it needs no %s", r.resource))
		} else if !srv.Controllable() {
			why = append(why, fmt.Sprintf("its %s is not one the harness started, so it cannot be killed", r.resource))
		}
	}
	return strings.Join(why, "; ")
}

// errUnfindable is the setup error of a scenario that runs the strategy in
// helper processes when they cannot find it: a strategy the run can serve
// that was not made findable is a mistake of the test binary, not a
// design's boundary, so it fails the cell (ERROR) rather than leaving it
// n/a, where a conformance run would pass without the scenario.
func (r requirement) errUnfindable(env *Env) error {
	if !r.helper || helperCanFind(env.Meta.Name) {
		return nil
	}
	return fmt.Errorf("%w: %s: a helper process cannot find the strategy by name: register it with strategy.Register, or call strategytest.RegisterForHelpers(meta) from an init of the test binary (docs/adding-a-strategy.md)", ErrSetup, env.Meta.Name)
}

// trial is one repetition of a scenario on its own deployment, with its own
// SKUs, keys and users (all suffixed), so trials never see each other.
type trial struct {
	env    *Env
	in     *Scenario
	n      int
	suffix string
	cfg    strategy.Config
	dep    strategy.Deployment
	caps   strategy.Capabilities // of dep, probed once at Open
	// acquiredBefore is how many of cfg.DB's connections were acquired
	// before Open (checkPoolReturned).
	acquiredBefore int32
	// proxy stands between dep and the server when the kind asks for it
	// (requirement.proxy); the harness's own pools go direct.
	proxy *pgproxy.Proxy
	// loadStock, when set, are the SKUs t.load spreads its requests over
	// instead of the scenario's.
	loadStock []StockInput
	// loadFrom, when set, is the first request index t.load sends: the
	// requests below it went out before (committimeout.go's lone request).
	loadFrom int
	// loadCancelsOdd, when set, makes t.load give up on its odd requests
	// by cancelling their context at their timeout, not by a deadline.
	loadCancelsOdd bool
	hist           *History

	facts   []Fact
	varying []varyingCount
	checks  []checkOutcome

	// gateTables are the tables the gate locks, listed at its first round
	// (the deployment's tables exist from Open on).
	gateMu     sync.Mutex
	gateTables []string
	// settled is what a runner looked up as its last act, once every call
	// of the trial had returned: checkDurable, which runs next, reads those
	// keys from it instead of asking the strategy again (storm would look
	// up its 2,000 keys twice).
	settled map[string]strategy.Reservation

	// nodesCompared counts the lookups statuses made on nodes other than
	// node 0, nodesApart those that read another status than node 0.
	nodesCompared int
	nodesApart    []string

	// aborted counts transitions PostgreSQL aborted to resolve a conflict
	// (40001, 40P01): allowed, and rerun; reported in Varying.
	aborted atomic.Int64

	// panics are panics of the strategy caught where the harness could
	// carry on (a step of an interleaving); checkDurable reports them.
	panicMu sync.Mutex
	panics  []string
	// late are calls that had not returned returnGrace after their caller
	// gave up (callWithin): the harness went on without their answer.
	late []string
	// madeDue are the keys whose expires_at the trial moved into the past
	// (Ager): their ExpiresAt no longer follows from their TTL.
	madeDueMu sync.Mutex
	madeDue   map[string]bool
	// busyResent counts BUSY answers reserveDefinite sent again.
	busyResent atomic.Int64

	// restarted is set once a node was restarted: from then on, what the
	// audit finds is charged to SurvivesRestart, not to NoOversell or
	// Conserves, so a strategy that does not survive a restart can still
	// claim that it never oversells while it runs.
	restarted bool

	// cleanups run after the trial's deployment is closed (cleanup.go).
	cleanups []func()
	// lossClaim, when set, is the claim an acknowledged reservation that
	// is missing, and what the audit finds, are charged to instead of the
	// contract and the audit's own claims: SurvivesFailover after a
	// failover to a standby that was behind (failover.go).
	lossClaim strategy.Claims
}

// auditClaim is the claim an audit check is judged against.
func (t *trial) auditClaim(c strategy.Claims) strategy.Claims {
	if t.lossClaim != Base {
		return t.lossClaim
	}
	if t.restarted {
		return strategy.SurvivesRestart
	}
	return c
}

type varyingCount struct {
	name  string
	value int
}

type checkOutcome struct {
	name    string // the check's name, where it has one (deployment-contract's parts)
	claim   strategy.Claims
	what    string
	ok      bool
	detail  string
	history string
}

func (t *trial) node(i int) strategy.Strategy { return t.dep.Node(i % t.cfg.NodeCount()) }

func (t *trial) sku(name string) string  { return name + t.suffix }
func (t *trial) key(name string) string  { return name + t.suffix }
func (t *trial) user(name string) string { return name + t.suffix }

// plain strips the trial suffix for display.
func (t *trial) plain(s string) string { return strings.TrimSuffix(s, t.suffix) }

func (t *trial) fact(name, format string, args ...any) {
	t.facts = append(t.facts, Fact{Name: name, Value: fmt.Sprintf(format, args...)})
}

func (t *trial) vary(name string, v int) { t.varying = append(t.varying, varyingCount{name, v}) }

// check records one assertion. keys select the history excerpt shown when it
// fails (all operations when empty).
func (t *trial) check(claim strategy.Claims, what string, ok bool, detail string, keys ...string) {
	t.checkNamed("", claim, what, ok, detail, keys...)
}

// checkNamed is check for a check that has a name (Check.Name).
func (t *trial) checkNamed(name string, claim strategy.Claims, what string, ok bool, detail string, keys ...string) {
	o := checkOutcome{name: name, claim: claim, what: what, ok: ok}
	if !ok {
		o.detail = detail
		o.history = Excerpt(t.hist.Ops(), keys, 40)
	}
	t.checks = append(t.checks, o)
}

// violated reports whether a check of one of claims has failed in the trial.
func (t *trial) violated(claims []strategy.Claims) bool {
	for _, c := range t.checks {
		if !c.ok && slices.Contains(claims, c.claim) {
			return true
		}
	}
	return false
}

func (t *trial) audit(ctx context.Context) (map[string]strategy.StockAudit, error) {
	list, err := t.dep.Audit(ctx)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	out := make(map[string]strategy.StockAudit, len(list))
	for _, a := range list {
		out[a.SKU] = a
	}
	for _, s := range t.cfg.Stock {
		if _, ok := out[s.SKU]; !ok {
			return nil, fmt.Errorf("audit: no row for sku %s", s.SKU)
		}
	}
	return out, nil
}

func sumAvailable(a map[string]strategy.StockAudit) int {
	n := 0
	for _, s := range a {
		n += s.Available
	}
	return n
}

// busyResends bounds how often reserveDefinite sends a request again after
// BUSY.
const busyResends = 20

// reserveDefinite sends req and, while the answer is BUSY (nothing written,
// try again: a lock not granted within its bound), sends it again, as a
// client told 429 does, at most busyResends times. Every attempt is in the
// history; the resends are a varying count, since how many requests a
// lock's queue outlasts depends on scheduling.
func (t *trial) reserveDefinite(ctx context.Context, proc string, node int, req strategy.Request) Op {
	for i := 0; ; i++ {
		op := t.reserve(ctx, proc, node, req)
		if op.Outcome != strategy.OutcomeBusy || op.Type != OpFail || i >= busyResends || ctx.Err() != nil {
			return op
		}
		t.busyResent.Add(1)
	}
}

// reserve sends one request and records it.
func (t *trial) reserve(ctx context.Context, proc string, node int, req strategy.Request) Op {
	op := Op{Process: proc, Node: node % t.cfg.NodeCount(), Req: req, Invoke: t.hist.Begin()}
	res, err := callWithin(ctx, t.lateGrace(), func() (strategy.Result, error) { return t.node(node).Reserve(ctx, req) })
	if errors.Is(err, errOutlivedGiveUp) {
		t.noteLate(fmt.Sprintf("Reserve %s on node %d", t.plain(req.Key), op.Node))
	}
	return t.hist.End(reserveOp(op, res, err))
}

// lookupAll returns the durable reservation of every key, using a few
// concurrent lookups on node 0.
func (t *trial) lookupAll(ctx context.Context, keys []string) (map[string]strategy.Reservation, error) {
	return t.lookupOn(ctx, 0, keys)
}

// lookupOn returns the durable reservation of every key as node reads it.
func (t *trial) lookupOn(ctx context.Context, node int, keys []string) (map[string]strategy.Reservation, error) {
	out := make(map[string]strategy.Reservation, len(keys))
	var mu sync.Mutex
	var firstErr error
	ch := make(chan string)
	var wg sync.WaitGroup
	var box panicBox
	defer box.rethrow()
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer box.catch()
			for k := range ch {
				r, err := t.node(node).Lookup(ctx, k)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("lookup %s on node %d: %w", k, node%t.cfg.NodeCount(), err)
				}
				out[k] = r
				mu.Unlock()
			}
		}()
	}
	for _, k := range keys {
		ch <- k
	}
	close(ch)
	wg.Wait()
	return out, firstErr
}

// noteLate records a call that outlived its caller's giving up by
// returnGrace; checkDurable reports them.
func (t *trial) noteLate(what string) {
	t.panicMu.Lock()
	defer t.panicMu.Unlock()
	t.late = append(t.late, what)
}

// notePanic records a panic of the strategy that the harness survived.
func (t *trial) notePanic(what string) {
	t.panicMu.Lock()
	defer t.panicMu.Unlock()
	t.panics = append(t.panics, what)
}

// checkDurable checks the whole history of the trial against the durable
// state: acknowledged reservations exist, refused ones do not, unknown ones
// are resolved, keys and users are never doubled, and the audit balances.
func (t *trial) checkDurable(ctx context.Context) error {
	t.panicMu.Lock()
	panics := append([]string(nil), t.panics...)
	late := append([]string(nil), t.late...)
	t.panicMu.Unlock()
	t.check(Base, "the strategy never panics", len(panics) == 0, sample(panics))
	t.check(Base, "a call returns once its caller gives up (its context's deadline passes, or it is cancelled), within 20 s", len(late) == 0,
		fmt.Sprintf("%d calls had not returned %v after their caller gave up: %s", len(late), returnGrace, sample(late)))
	if t.nodesCompared > 0 {
		t.check(Base, "every node's Lookup reads the status node 0 reads", len(t.nodesApart) == 0,
			fmt.Sprintf("%d of %d lookups on other nodes read otherwise: %s", len(t.nodesApart), t.nodesCompared, sample(t.nodesApart)))
	}

	ops := t.hist.Ops()
	var keys []string
	seen := map[string]bool{}
	for _, op := range ops {
		if op.Kind == "reserve" && op.Req.Key != "" && !seen[op.Req.Key] && op.Req.Validate() == nil {
			seen[op.Req.Key] = true
			keys = append(keys, op.Req.Key)
		}
	}
	var missing []string
	for _, k := range keys {
		if _, ok := t.settled[k]; !ok {
			missing = append(missing, k)
		}
	}
	durable, err := t.lookupAll(ctx, missing)
	if err != nil {
		return err
	}
	for k, r := range t.settled {
		if seen[k] {
			durable[k] = r
		}
	}

	var lost, leaked, mismatched, unknownCommitted, unknownAbsent, ownerless []string
	heldBy := map[string][]Op{} // key -> HELD answers
	for _, op := range ops {
		if op.Kind != "reserve" || !seen[op.Req.Key] {
			continue
		}
		d := durable[op.Req.Key]
		switch op.Type {
		case OpOK:
			if op.Outcome == strategy.OutcomeHeld {
				heldBy[op.Req.Key] = append(heldBy[op.Req.Key], op)
			}
			if d.Status == strategy.StatusNotFound {
				lost = append(lost, op.Req.Key)
			} else if d.User != op.Req.User || d.SKU != op.Req.SKU {
				mismatched = append(mismatched, op.Req.Key)
			}
		case OpInfo:
			if d.Status == strategy.StatusNotFound {
				unknownAbsent = append(unknownAbsent, op.Req.Key)
			} else {
				unknownCommitted = append(unknownCommitted, op.Req.Key)
			}
		case OpFail:
			// Rows are never deleted: a key no reservation has at the end
			// had none when it was answered KEY_REUSED, unless a fault lost
			// it (lossClaim).
			if op.Outcome == strategy.OutcomeKeyReused && d.Status == strategy.StatusNotFound {
				ownerless = append(ownerless, op.Req.Key)
			}
		}
	}
	for _, op := range ops {
		if op.Kind == "reserve" && op.Type == OpFail && seen[op.Req.Key] &&
			len(heldBy[op.Req.Key]) == 0 && durable[op.Req.Key].Status != strategy.StatusNotFound &&
			!answeredOKElsewhere(ops, op.Req.Key) {
			leaked = append(leaked, op.Req.Key)
		}
	}
	t.check(t.lossClaim, "every acknowledged reservation is in the database", len(lost) == 0,
		fmt.Sprintf("%d acknowledged HELD/REPLAY answers have no reservation: %s", len(lost), sample(t.plainSorted(lost))), lost...)
	t.check(t.lossClaim, "a key answered KEY_REUSED has a reservation in the database", len(ownerless) == 0,
		fmt.Sprintf("%d KEY_REUSED answers name an owner the database does not have: %s", len(ownerless), sample(t.plainSorted(ownerless))), ownerless...)
	t.check(Base, "a refused request leaves no reservation", len(leaked) == 0,
		fmt.Sprintf("%d refused requests left a reservation: %s", len(leaked), sample(t.plainSorted(leaked))), leaked...)
	t.check(Base, "an acknowledged reservation belongs to its request", len(mismatched) == 0,
		fmt.Sprintf("%d keys answered HELD/REPLAY but stored with another user or sku: %s", len(mismatched), sample(t.plainSorted(mismatched))), mismatched...)
	t.checkExpiresAt(heldBy, durable)
	t.checkAnswerContents(ops, durable)
	t.checkUserLimitAnswers(ops, durable)
	t.vary("unknown outcomes resolved committed", len(unknownCommitted))
	t.vary("unknown outcomes resolved absent", len(unknownAbsent))

	// Requirement 2: one reservation per key; a repeat is REPLAY, another
	// user or SKU is KEY_REUSED.
	var doubled, misanswered []string
	for k, held := range heldBy {
		if len(held) > 1 {
			doubled = append(doubled, k)
		}
	}
	for _, op := range ops {
		// BUSY says nothing about the key ("try again"), like an unknown
		// outcome says nothing about the reservation.
		if op.Kind != "reserve" || !seen[op.Req.Key] || op.Type == OpInfo || op.Outcome == strategy.OutcomeBusy {
			continue
		}
		d := durable[op.Req.Key]
		held := heldBy[op.Req.Key]
		if d.Status == strategy.StatusNotFound || len(held) == 0 || held[0].Invoke > op.Complete || held[0] == op {
			continue // nothing stored, or this answer was given before the owner even started
		}
		same := d.User == op.Req.User && d.SKU == op.Req.SKU
		afterOwner := op.Invoke > held[0].Complete
		switch {
		case same && op.Outcome != strategy.OutcomeReplay && op.Outcome != strategy.OutcomeHeld:
			misanswered = append(misanswered, fmt.Sprintf("%s got %s, want REPLAY", t.plain(op.Req.Key), op.Outcome))
		case !same && afterOwner && op.Outcome != strategy.OutcomeKeyReused:
			misanswered = append(misanswered, fmt.Sprintf("%s (user %s, sku %s) got %s, want KEY_REUSED", t.plain(op.Req.Key), t.plain(op.Req.User), t.plain(op.Req.SKU), op.Outcome))
		case !same && (op.Outcome == strategy.OutcomeHeld || op.Outcome == strategy.OutcomeReplay):
			misanswered = append(misanswered, fmt.Sprintf("%s (user %s) got %s for another user's key", t.plain(op.Req.Key), t.plain(op.Req.User), op.Outcome))
		}
	}
	sort.Strings(doubled)
	sort.Strings(misanswered)
	t.check(strategy.IdempotentKey, "one key yields at most one reservation", len(doubled) == 0,
		fmt.Sprintf("%d keys answered HELD more than once: %s", len(doubled), sample(doubled)), doubled...)
	t.check(strategy.IdempotentKey, "a repeated key is answered REPLAY, a reused one KEY_REUSED", len(misanswered) == 0,
		fmt.Sprintf("%d misanswered: %s", len(misanswered), sample(misanswered)))

	// Requirement 3: one active reservation per user and SKU.
	perUser := map[string][]string{}
	activeBySKU := map[string]int{}
	for _, k := range keys {
		d := durable[k]
		if d.Status.Active() {
			perUser[d.User+"\x00"+d.SKU] = append(perUser[d.User+"\x00"+d.SKU], k)
			activeBySKU[d.SKU]++
		}
	}
	var twice []string
	var twiceKeys []string
	for u, ks := range perUser {
		if len(ks) > 1 {
			user, sku, _ := strings.Cut(u, "\x00")
			twice = append(twice, fmt.Sprintf("%s holds %d of %s", t.plain(user), len(ks), t.plain(sku)))
			twiceKeys = append(twiceKeys, ks...)
		}
	}
	sort.Strings(twice)
	t.check(strategy.OneActivePerUser, "a user holds at most one active reservation per SKU", len(twice) == 0,
		fmt.Sprintf("%d users over the limit: %s", len(twice), sample(twice)), twiceKeys...)

	// Requirement 1 and conservation, from the audit.
	audit, err := t.audit(ctx)
	if err != nil {
		return err
	}
	var over, drift, unaccounted, misreported []string
	for _, s := range t.cfg.Stock {
		a := audit[s.SKU]
		// The bound is the configured stock as well as the audit's total:
		// an audit reads the total from where the strategy stored it, so a
		// stock loaded wrong (41 for 40) would vouch for its own oversell.
		switch {
		case a.Oversold() > 0:
			over = append(over, fmt.Sprintf("%s: %d active > %d total", t.plain(s.SKU), a.Active, a.Total))
		case activeBySKU[s.SKU] > s.Total:
			over = append(over, fmt.Sprintf("%s: the history's keys hold %d active of the %d units configured", t.plain(s.SKU), activeBySKU[s.SKU], s.Total))
		}
		if a.Total != s.Total {
			misreported = append(misreported, fmt.Sprintf("%s: audit total %d, configured %d", t.plain(s.SKU), a.Total, s.Total))
		}
		if a.Drift() != 0 {
			drift = append(drift, fmt.Sprintf("%s: total %d - available %d - active %d = drift %d", t.plain(s.SKU), a.Total, a.Available, a.Active, a.Drift()))
		}
		if a.Active != activeBySKU[s.SKU] {
			unaccounted = append(unaccounted, fmt.Sprintf("%s: audit counts %d active, the history's keys hold %d", t.plain(s.SKU), a.Active, activeBySKU[s.SKU]))
		}
	}
	t.check(t.auditClaim(strategy.NoOversell), "active reservations never exceed the stock", len(over) == 0, strings.Join(over, "; "))
	t.check(t.auditClaim(strategy.Conserves), "total - available == active (drift 0)", len(drift) == 0, strings.Join(drift, "; "))
	t.check(Base, "every active reservation in the audit comes from the history", len(unaccounted) == 0, strings.Join(unaccounted, "; "))
	t.check(Base, "the audit's total is the configured stock", len(misreported) == 0, strings.Join(misreported, "; "))
	return nil
}

// answeredOKElsewhere reports whether some request with this key was
// acknowledged (or is unknown), so a row under the key is explained.
func answeredOKElsewhere(ops []Op, key string) bool {
	for _, op := range ops {
		if op.Kind == "reserve" && op.Req.Key == key && (op.Type == OpOK || op.Type == OpInfo) {
			return true
		}
	}
	return false
}

func sample(xs []string) string {
	if len(xs) > 5 {
		return strings.Join(xs[:5], ", ") + fmt.Sprintf(" (and %d more)", len(xs)-5)
	}
	return strings.Join(xs, ", ")
}

func randomID() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// scaled applies short_scale to a count (never below 1).
func (t *trial) scaled(n int) int {
	if !t.env.Short || t.in.ShortScale == 0 {
		return n
	}
	return max(1, int(math.Round(float64(n)*t.in.ShortScale)))
}

// Together runs f(0), ..., f(n-1) in n goroutines released at once (each
// waits until all have started) and waits for them all: the way every
// concurrent scenario starts its requests. A panic in f is raised again in
// the caller once every call has returned, so it can be recovered there (the
// harness turns it into the strategy's ERROR instead of dying of it).
func Together(n int, f func(i int)) {
	var ready, done sync.WaitGroup
	var box panicBox
	start := make(chan struct{})
	ready.Add(n)
	done.Add(n)
	for i := 0; i < n; i++ {
		go func() {
			defer done.Done()
			defer box.catch()
			ready.Done()
			<-start
			f(i)
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
	box.rethrow()
}

// panicBox carries the first panic of goroutines the harness started back
// to the goroutine that waits for them: a strategy that panics in a
// concurrent call must cost its own cell of the table, not the test binary.
type panicBox struct {
	mu    sync.Mutex
	value any
	stack []byte
}

// catch is deferred in each goroutine.
func (b *panicBox) catch() {
	if p := recover(); p != nil {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.value == nil {
			b.value, b.stack = p, debug.Stack()
		}
	}
}

// rethrow panics in the caller with the first caught panic, if any.
func (b *panicBox) rethrow() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.value != nil {
		panic(fmt.Sprintf("%v (in a concurrent call)\n%s", b.value, b.stack))
	}
}

// missingResources lists the needs of meta that set does not provide.
func missingResources(meta strategy.Meta, set resourcetest.Set) []strategy.Need {
	var out []strategy.Need
	for _, n := range meta.Needs {
		if _, ok := set[n.Resource]; !ok {
			out = append(out, n)
		}
	}
	return out
}
