package strategytest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/pgtest/pgproxy"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest/internal/pgcontrol"
)

// KindSoak is the soak's kind: no scenario file has it; Soak builds its
// input.
const KindSoak = "soak"

func init() {
	registerKind(KindSoak, kindSpec{run: runSoak, req: requirement{caps: strategy.Capabilities{Attach: true}}})
}

// SoakOptions configure Soak.
type SoakOptions struct {
	// Duration is how long the load runs; the last cycle finishes after it.
	Duration time.Duration
	// Seed chooses the faults and the load, so a run can be repeated.
	Seed uint64
	// DB (the application role) and Admin (a superuser) are pools on a
	// fresh database on Server.
	DB, Admin *pgxpool.Pool
	// Server is a server of the soak's own: the crash and failover faults
	// need a local cluster pgtest started; without one only the proxy's
	// faults and node restarts are injected.
	Server *pgtest.Server
	// Logf gets a line per cycle.
	Logf func(format string, args ...any)
}

// SoakReport is what a soak did and found.
type SoakReport struct {
	Strategy string
	Seed     uint64
	Cycles   int
	// Faults counts the cycles per fault injected ("none": load alone).
	Faults map[string]int
	// The requests: sent, acknowledged, refused, unknown; the unknown ones
	// resolved by their key, and sent again.
	Requests, Acked, Refused, Unknown int
	ResolvedCommitted, ResolvedAbsent int
	Releases, Replays                 int
	// Result holds the checks, run after every cycle and at the end,
	// judged against the strategy's claims.
	Result  *Result
	Elapsed time.Duration
}

// soakPlan is the soak's part of its Scenario.
type soakPlan struct {
	duration time.Duration
	seed     uint64
	report   *SoakReport
}

// Soak runs a strategy for opts.Duration under a nemesis: cycle after
// cycle, clients send reservations (new keys, replays of acknowledged ones,
// releases) through a proxy (pgtest/pgproxy) while one fault, chosen at
// random from the seed, is injected: a connection cut once its first write
// or its COMMIT was executed (reset, or silent for a while), the proxy dark
// for every connection, the server crashed and restarted, a failover to a
// synchronous standby, a node restarted. After each cycle the load stops,
// every silent connection is reset, every request of unknown outcome is
// resolved by its key and sent again, and the cycle's history and the audit
// are checked; at the end the whole history is checked as every trial's
// is. The report counts what happened; its Result has the checks' verdicts.
func Soak(ctx context.Context, meta strategy.Meta, opts SoakOptions) (*SoakReport, error) {
	rep := &SoakReport{Strategy: meta.Name, Seed: opts.Seed, Faults: map[string]int{}}
	in := &Scenario{
		Name: "soak", Case: "issue 16", Kind: KindSoak, Nodes: 2,
		Title:       "reservations under a nemesis: cuts, partitions, crashes, failovers, restarts",
		Stock:       []StockInput{{SKU: "sku-soak-a", Total: 400}, {SKU: "sku-soak-b", Total: 400}},
		Repetitions: 1, ShortRepetitions: 1, Workers: 6,
	}
	in.soak = &soakPlan{duration: opts.Duration, seed: opts.Seed, report: rep}
	env := Env{Meta: meta, DB: opts.DB, Admin: opts.Admin, Logf: opts.Logf}
	if opts.Server != nil {
		env.Server = opts.Server
	}
	start := time.Now()
	r, err := RunScenario(ctx, env, in)
	rep.Result, rep.Elapsed = r, time.Since(start)
	return rep, err
}

// soakCycleOps bounds the requests of one cycle.
const soakCycleOps = 150

// soakDark is how long a partition lasts.
const soakDark = 400 * time.Millisecond

func runSoak(ctx context.Context, t *trial) error {
	plan := t.in.soak
	if plan == nil {
		return errors.New("the soak kind runs only through Soak")
	}
	rep := plan.report
	p, pool, err := t.behindProxy(ctx)
	if err != nil {
		return err
	}
	s := &soaker{t: t, p: p, pool: pool, rep: rep, rng: rand.New(rand.NewPCG(plan.seed, 0x50a4))}
	s.srv, _ = t.env.Server.(*pgtest.Server)
	faults := []string{"none", "statement-drop", "commit-drop", "statement-blackhole", "commit-blackhole", "dark"}
	if s.srv != nil && s.srv.Kind == pgtest.KindLocal {
		faults = append(faults, "crash", "failover")
	}
	if t.caps.Restart {
		faults = append(faults, "restart")
	}
	deadline := time.Now().Add(plan.duration)
	for cycle := 0; time.Now().Before(deadline); cycle++ {
		fault := faults[s.rng.IntN(len(faults))]
		if t.env.Logf != nil {
			t.env.Logf("soak cycle %d: %s", cycle, fault)
		}
		rep.Cycles++
		rep.Faults[fault]++
		if err := s.cycle(ctx, cycle, fault); err != nil {
			return fmt.Errorf("cycle %d (%s): %w", cycle, fault, err)
		}
	}
	return nil
}

// soaker is the state of a soak across its cycles.
type soaker struct {
	t    *trial
	p    *pgproxy.Proxy
	pool *pgxpool.Pool // the deployment's, through the proxy
	srv  *pgtest.Server
	rep  *SoakReport
	rng  *rand.Rand

	mu    sync.Mutex
	acked []strategy.Request // acknowledged requests, for replays
	held  []string           // keys HELD and not yet released
	gen   int                // standbys started

	unknownReleases []Op // releases of the cycle whose outcome is unknown
}

// cycle runs the load of one cycle with its fault, then quiesces, resolves
// and checks.
func (s *soaker) cycle(ctx context.Context, cycle int, fault string) error {
	t := s.t
	since := t.hist.Begin()
	var done sync.WaitGroup
	var count sync.Mutex
	sent := 0
	stop := make(chan struct{})
	progress := make(chan struct{}, soakCycleOps)
	seeds := make([]uint64, t.in.Workers)
	for i := range seeds {
		seeds[i] = s.rng.Uint64()
	}
	for w := 0; w < t.in.Workers; w++ {
		done.Add(1)
		go func() {
			defer done.Done()
			rng := rand.New(rand.NewPCG(seeds[w], uint64(w)))
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				count.Lock()
				if sent >= soakCycleOps {
					count.Unlock()
					return
				}
				sent++
				count.Unlock()
				s.one(ctx, rng, fmt.Sprintf("c%03d-w%d-%04d", cycle, w, n), w)
				progress <- struct{}{}
			}
		}()
	}
	// The fault comes once a third of the cycle's requests are done, and
	// the load goes on after it: counted, not timed.
	wait := func(n int) {
		for i := 0; i < n; i++ {
			select {
			case <-progress:
			case <-time.After(10 * time.Second): // the load is stuck behind the fault; it ends below
				return
			}
		}
	}
	wait(soakCycleOps / 3)
	ferr := s.inject(ctx, fault, func() { wait(soakCycleOps / 6) })
	close(stop)
	done.Wait()
	s.p.Heal()
	if ferr != nil {
		return ferr
	}
	// Quiet: the deployment's pool drops its connections (some the fault
	// reset: the clients met those already, the checks are not the fault's
	// to disturb), and the server has ended every backend of them, so that
	// whatever a dead one was doing is over: committed or rolled back.
	s.pool.Reset()
	if err := pgcontrol.WaitNone(ctx, t.env.Admin, "backends of the deployment's connections after the cycle",
		`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, t.proxyApp()); err != nil {
		return err
	}
	return s.check(ctx, cycle, since)
}

// one sends one operation of the load: mostly a new reservation, sometimes
// a replay of an acknowledged one or a release of a held one.
func (s *soaker) one(ctx context.Context, rng *rand.Rand, id string, w int) {
	t := s.t
	node := rng.IntN(t.cfg.NodeCount())
	roll := rng.IntN(100)
	s.mu.Lock()
	var replay *strategy.Request
	if roll < 10 && len(s.acked) > 0 {
		r := s.acked[rng.IntN(len(s.acked))]
		replay = &r
	}
	releaseKey := ""
	if roll >= 85 && len(s.held) > 0 && t.caps.Release {
		i := rng.IntN(len(s.held))
		releaseKey = s.held[i]
		s.held[i] = s.held[len(s.held)-1]
		s.held = s.held[:len(s.held)-1]
	}
	s.mu.Unlock()
	switch {
	case replay != nil:
		op := t.reserve(ctx, fmt.Sprintf("w%d", w), node, *replay)
		s.mu.Lock()
		s.rep.Replays++
		s.mu.Unlock()
		_ = op
	case releaseKey != "":
		op := Op{Process: fmt.Sprintf("w%d", w), Kind: "release", Node: node, Req: strategy.Request{Key: releaseKey}, Invoke: t.hist.Begin()}
		units, err := t.node(node).(strategy.Releaser).Release(ctx, releaseKey)
		op.Units, op.Type = units, OpOK
		if err != nil {
			op.Type, op.Err = OpInfo, err.Error()
		}
		op = t.hist.End(op)
		s.mu.Lock()
		s.rep.Releases++
		if op.Type == OpInfo {
			s.unknownReleases = append(s.unknownReleases, op)
		}
		s.mu.Unlock()
	default:
		sku := t.cfg.Stock[rng.IntN(len(t.cfg.Stock))].SKU
		req := strategy.Request{Key: t.key(id), User: t.user("u-" + id), SKU: sku, TTL: strategy.TTLForever}
		op := t.reserve(ctx, fmt.Sprintf("w%d", w), node, req)
		s.mu.Lock()
		if op.Type == OpOK {
			s.acked = append(s.acked, req)
			if op.Outcome == strategy.OutcomeHeld {
				s.held = append(s.held, req.Key)
			}
		}
		s.mu.Unlock()
	}
}

// inject runs one fault while the load goes on; during is called while the
// fault lasts (it waits for some more of the load).
func (s *soaker) inject(ctx context.Context, fault string, during func()) error {
	t := s.t
	if f, ok := partitionFaults[fault]; ok && fault != "dark" {
		f.Hits = 1
		s.p.Arm(f)
		select {
		case h := <-s.p.Hits():
			if f.Action == pgproxy.Blackhole {
				during()
				s.p.Reset(h.Backend)
			}
		case <-time.After(2 * time.Second): // the strategy sends no such statement, or the load ended first
			s.p.Arm(pgproxy.Fault{})
		}
		return nil
	}
	switch fault {
	case "none":
		during()
	case "dark":
		// A partition lasts as long as it lasts: every request meanwhile
		// hangs, so there is no progress to count.
		s.p.Dark()
		time.Sleep(soakDark)
		s.p.Heal()
	case "restart":
		node := s.rng.IntN(t.cfg.NodeCount())
		if err := t.dep.(strategy.Restarter).Restart(ctx, node); err != nil {
			return fmt.Errorf("restart node %d: %w", node, err)
		}
		t.restarted = true
		during()
	case "crash":
		if err := s.srv.Crash(ctx); err != nil {
			return err
		}
		if err := s.srv.Restart(ctx); err != nil {
			return err
		}
		t.env.Admin.Reset()
		during()
	case "failover":
		return s.failover(ctx, during)
	default:
		return fmt.Errorf("unknown fault %q", fault)
	}
	return nil
}

// failover takes a synchronous standby, kills the primary under load and
// promotes the standby; the proxy's new connections and the harness's
// probes go to it.
func (s *soaker) failover(ctx context.Context, during func()) error {
	t := s.t
	s.gen++
	name := fmt.Sprintf("rb_soak_standby_%d", s.gen)
	sb, err := s.srv.StartStandby(ctx, name)
	if err != nil {
		return err
	}
	promoted := false
	defer func() {
		if !promoted {
			_ = pgcontrol.ResetSyncStandby(context.Background(), s.srv.AdminDSN("postgres"))
			_ = sb.Stop()
		}
	}()
	if err := pgcontrol.SetSyncStandbyOf(ctx, s.srv.AdminDSN("postgres"), name); err != nil {
		return err
	}
	during()
	if err := s.srv.Crash(ctx); err != nil {
		return err
	}
	if err := sb.Promote(ctx); err != nil {
		return err
	}
	promoted = true
	host := s.srv.Dir()
	port := t.env.Admin.Config().ConnConfig.Port
	s.p.SetTarget(host, port)
	for _, pool := range []**pgxpool.Pool{&t.env.Admin, &t.env.DB} {
		cfg := (*pool).Config().Copy()
		cfg.ConnConfig.Host = host
		np, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return fmt.Errorf("pool on the promoted standby: %w", err)
		}
		t.onCleanup(np.Close)
		*pool = np
	}
	return nil
}

// resendReleases sends again every release of the cycle whose outcome is
// unknown (Release is safe to replay: it moves the row once) and checks
// that the reservation is RELEASED afterwards.
func (s *soaker) resendReleases(ctx context.Context) error {
	t := s.t
	s.mu.Lock()
	pending := s.unknownReleases
	s.unknownReleases = nil
	s.mu.Unlock()
	var wrong []string
	for i, op := range pending {
		again := Op{Process: fmt.Sprintf("resend%d", i), Kind: "release", Node: op.Node, Req: op.Req, Invoke: t.hist.Begin()}
		units, err := t.node(op.Node).(strategy.Releaser).Release(ctx, op.Req.Key)
		again.Units, again.Type = units, OpOK
		if err != nil {
			again.Type, again.Err = OpInfo, err.Error()
		}
		t.hist.End(again)
		r, err := t.node(op.Node).Lookup(ctx, op.Req.Key)
		if err != nil {
			return err
		}
		if again.Type != OpOK || r.Status != strategy.StatusReleased {
			wrong = append(wrong, fmt.Sprintf("%s: sent again: %d units, %s; now %s", t.plain(op.Req.Key), units, again.Err, r.Status))
		}
	}
	t.check(Base, "a release sent again after an unknown outcome leaves the reservation RELEASED", len(wrong) == 0, sample(wrong), noRequest)
	return nil
}

// check resolves the unknown requests the cycle sent (those invoked since
// `since`: new keys and replays of old ones alike), sending them again
// with their keys, then checks the cycle's history against the durable
// state and the audit.
func (s *soaker) check(ctx context.Context, cycle int, since time.Duration) error {
	t := s.t
	var cycleOps, unknown []Op
	for _, op := range t.hist.Ops() {
		if op.Kind == "reserve" && op.Invoke >= since {
			cycleOps = append(cycleOps, op)
			if op.Type == OpInfo {
				unknown = append(unknown, op)
			}
		}
	}
	keys := make([]string, 0, len(unknown))
	for _, op := range unknown {
		keys = append(keys, op.Req.Key)
	}
	before, err := t.lookupAll(ctx, keys)
	if err != nil {
		return err
	}
	var wrong []string
	for i, op := range unknown {
		was := before[op.Req.Key].Status != strategy.StatusNotFound
		again := t.reserve(ctx, fmt.Sprintf("resend%d", i), op.Node, op.Req)
		switch {
		case was && again.Outcome == strategy.OutcomeReplay:
			s.rep.ResolvedCommitted++
		case !was && (again.Outcome == strategy.OutcomeHeld || again.Outcome == strategy.OutcomeSoldOut):
			s.rep.ResolvedAbsent++
		default:
			wrong = append(wrong, fmt.Sprintf("%s: committed %v, sent again: %s %s", t.plain(op.Req.Key), was, again.Outcome, again.Err))
		}
		if again.Type == OpOK {
			s.mu.Lock()
			s.acked = append(s.acked, op.Req)
			if again.Outcome == strategy.OutcomeHeld {
				s.held = append(s.held, op.Req.Key)
			}
			s.mu.Unlock()
		}
	}
	t.check(Base, "a request sent again after an unknown outcome is REPLAY if the first committed, else HELD or SOLD_OUT", len(wrong) == 0, sample(wrong), noRequest)
	if err := s.resendReleases(ctx); err != nil {
		return err
	}

	// The cycle's requests, resends included, against the durable state.
	var all []string
	for _, op := range t.hist.Ops() {
		if op.Kind == "reserve" && op.Req.Validate() == nil && op.Invoke >= since {
			all = append(all, op.Req.Key)
		}
	}
	durable, err := t.lookupAll(ctx, uniq(all))
	if err != nil {
		return err
	}
	okKey := map[string]bool{}
	for _, op := range t.hist.Ops() {
		if op.Kind == "reserve" && (op.Type == OpOK || op.Type == OpInfo) {
			okKey[op.Req.Key] = true
		}
	}
	var lost, leaked []string
	for _, op := range cycleOps {
		d := durable[op.Req.Key]
		switch op.Type {
		case OpOK:
			s.rep.Acked++
			if d.Status == strategy.StatusNotFound {
				lost = append(lost, t.plain(op.Req.Key))
			}
		case OpFail:
			s.rep.Refused++
			if d.Status != strategy.StatusNotFound && !okKey[op.Req.Key] {
				leaked = append(leaked, t.plain(op.Req.Key))
			}
		case OpInfo:
			s.rep.Unknown++
		}
		s.rep.Requests++
	}
	t.check(t.lossClaim, "every acknowledged reservation is in the database (after each cycle)", len(lost) == 0,
		fmt.Sprintf("%d lost: %s", len(lost), sample(lost)), noRequest)
	t.check(Base, "a refused request leaves no reservation (after each cycle)", len(leaked) == 0,
		fmt.Sprintf("%d leaked: %s", len(leaked), sample(leaked)), noRequest)
	audit, err := t.audit(ctx)
	if err != nil {
		return err
	}
	var over, drift []string
	for _, st := range t.cfg.Stock {
		a := audit[st.SKU]
		if a.Oversold() > 0 {
			over = append(over, fmt.Sprintf("%s: %d active > %d", t.plain(st.SKU), a.Active, a.Total))
		}
		if a.Drift() != 0 {
			drift = append(drift, fmt.Sprintf("%s: drift %d", t.plain(st.SKU), a.Drift()))
		}
	}
	t.check(t.auditClaim(strategy.NoOversell), "active reservations never exceed the stock (after each cycle)", len(over) == 0, sample(over), noRequest)
	t.check(t.auditClaim(strategy.Conserves), "total - available == active (after each cycle)", len(drift) == 0, sample(drift), noRequest)
	if t.env.Logf != nil {
		t.env.Logf("soak cycle %d: %d requests, %d unknown, %d lost, %d leaked, %s %s", cycle, len(cycleOps), len(unknown), len(lost), len(leaked), sample(over), sample(drift))
	}
	return nil
}
