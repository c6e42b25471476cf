package strategytest

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/pgtest/pgproxy"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest/internal/pgcontrol"
)

// KindPartition: a node reaches PostgreSQL through a TCP proxy that cuts
// connections mid-statement and mid-COMMIT, or goes dark for all of them.
const KindPartition = "partition"

// The faults of a partition scenario, cycled through by trial: a point and
// an action of pgproxy, or "dark".
var partitionFaults = map[string]pgproxy.Fault{
	"statement-drop":      {Point: pgproxy.Write, Action: pgproxy.Drop},
	"commit-drop":         {Point: pgproxy.Commit, Action: pgproxy.Drop},
	"statement-blackhole": {Point: pgproxy.Write, Action: pgproxy.Blackhole},
	"commit-blackhole":    {Point: pgproxy.Commit, Action: pgproxy.Blackhole},
	"dark":                {},
}

func init() {
	registerKind(KindPartition, kindSpec{
		run:      runPartition,
		req:      requirement{proxyWithoutAttach: true},
		required: []string{"requests", "workers", "faults", "hits"},
		validate: func(in *Scenario) error {
			if in.Requests < 1 || in.Workers < 1 || in.Hits < 1 || len(in.Faults) == 0 {
				return errors.New("need requests, workers, hits >= 1 and faults")
			}
			for _, f := range in.Faults {
				if _, ok := partitionFaults[f]; !ok {
					return fmt.Errorf("fault %q: want one of statement-drop, commit-drop, statement-blackhole, commit-blackhole, dark", f)
				}
			}
			if len(in.Stock) < 1 || len(in.Stock) > 2 || in.Requests+2*in.Hits > in.Stock[0].Total {
				return errors.New("need one SKU with stock for every request, the hits' retries included, and at most one more (the cut transitions')")
			}
			if len(in.Stock) == 2 && in.Stock[1].Total < 3 {
				return errors.New("the cut transitions' SKU needs a unit for each of Confirm, Release and ExpireDue")
			}
			return nil
		},
	})
}

// darkDeadline bounds a request sent while the proxy is dark: it cannot
// get through, and pgx gives up this long after asking.
const darkDeadline = 200 * time.Millisecond

// recoverDeadline bounds each request sent once the proxy heals, until one
// is served: a node that never serves again (combine's batch blocked on
// delivering an answer to a caller that gave up in the dark, outsider round
// 56's m05) would otherwise hold the first of them until the scenario's
// own deadline, minutes later. recoverTries and recoverWithin bound how
// many such requests, and how long, a pool may take to serve again.
const (
	recoverDeadline = 10 * time.Second
	recoverTries    = 20
	recoverWithin   = 30 * time.Second
)

// runPartition puts a proxy (pgtest/pgproxy) between the strategy and
// PostgreSQL: the trial's deployment is replaced by one attached through
// it (Meta.Attach, as a node process that reaches the database over the
// network), or, for a strategy without Attach, was opened through it; the
// harness's own probes go direct. Then, by the trial's fault:
//
//   - statement-* and commit-*: requests run from the workers while the
//     proxy cuts the first `hits` connections once their first write, or
//     their COMMIT, was executed by the server; the answer never reaches
//     the client. drop resets the connection; blackhole leaves it open and
//     silent while the harness reads the server side of it from
//     pg_stat_activity, then resets it. A strategy that sends no such
//     statement (no COMMIT: its writes are autocommit) is never hit.
//   - dark: after half the requests, the proxy goes dark for every
//     connection, old and new, while `hits` requests are sent with a
//     deadline; then it heals, and the time until the pool serves again is
//     measured.
//
// Every request on a cut connection must end unknown, never with a definite
// answer; once the server has ended its backend, the request is sent again
// with the same key (the contract says that is safe): REPLAY when the first
// attempt committed, HELD when it did not. In the drop trials, with a second
// SKU listed, the transitions are cut too (partitionTransitions). The
// trial's history and audit are then checked as every trial's are: nothing
// lost, doubled or drifting.
func runPartition(ctx context.Context, t *trial) error {
	mode := t.in.Faults[(t.n-1)%len(t.in.Faults)]
	fault := partitionFaults[mode]
	fault.Hits = t.in.Hits
	p := t.proxy // a strategy without Meta.Attach was opened through it
	var err error
	if p == nil {
		if p, _, err = t.behindProxy(ctx); err != nil {
			return err
		}
	}
	t.loadStock = t.in.Stock[:1] // a second SKU is the cut transitions' (partitioncuts.go)
	label := "fault " + mode
	var hits []pgproxy.Hit
	var cut, failedAfter []Op // the requests of the cut connections; those that failed once it healed
	if mode == "dark" {
		cut, failedAfter, err = t.partitionDark(ctx, p, label)
	} else {
		hits, err = t.partitionCut(ctx, p, fault, label)
		for _, op := range t.hist.Ops() {
			if op.Kind == "reserve" && op.Type != OpOK && op.Err != "" {
				cut = append(cut, op)
			}
		}
	}
	if err != nil {
		return err
	}
	// want is the number of cut connections (dark: of requests sent into
	// the dark, each with its own deadline). A cut connection carries at
	// least one request, and more when the strategy serves several in one
	// statement (combine's batches): every one of them must end unknown.
	// The harness does not see which requests a connection carried, so it
	// checks what it can: no request that failed was given a definite
	// answer (info == len(cut): an error that says the outcome is known,
	// e.g. one classified as a bad request, counts against it), and at
	// least as many failed as connections were cut (a request on a cut
	// connection that got an answer, SOLD_OUT or HELD, is missing from
	// cut: a strategy with one request per connection then falls short).
	want := len(hits)
	if mode == "dark" {
		want = t.in.Hits
	}
	info := 0
	for _, op := range cut {
		if op.Type == OpInfo {
			info++
		}
	}
	t.check(Base, "a request whose connection was cut ends unknown, never with a definite answer", info == len(cut) && len(cut) >= want,
		fmt.Sprintf("%d connections were cut (at least one request each), %d requests ended with an error, %d of them unknown", want, len(cut), info))
	if err := t.resolveByRetry(ctx, label, cut, hits); err != nil {
		return err
	}
	if err := t.resolveByRetry(ctx, "", failedAfter, nil); err != nil {
		return err
	}
	if len(t.in.Stock) == 2 && fault.Action == pgproxy.Drop {
		return t.partitionTransitions(ctx, p, mode, fault.Point)
	}
	return nil
}

// behindProxy starts a proxy in front of Env.DB's server and replaces the
// trial's deployment by one attached through it, over the returned pool.
// Both are stopped after the trial's final checks.
func (t *trial) behindProxy(ctx context.Context) (*pgproxy.Proxy, *pgxpool.Pool, error) {
	p, pool, err := t.proxyPool(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := t.dep.Close(); err != nil {
		return nil, nil, fmt.Errorf("close the direct deployment: %w", err)
	}
	acfg := t.cfg
	acfg.DB = pool
	dep, err := t.env.Meta.Attach(ctx, acfg)
	if err != nil {
		return nil, nil, fmt.Errorf("attach through the proxy: %w", err)
	}
	t.dep = dep
	return p, pool, nil
}

// proxyPool starts a proxy in front of Env.DB's server and returns a pool
// of Env.DB's role through it; both are stopped after the trial's final
// checks.
func (t *trial) proxyPool(ctx context.Context) (*pgproxy.Proxy, *pgxpool.Pool, error) {
	p, pool, closeBoth, err := poolThroughProxy(ctx, t.env.DB, t.proxyApp(), 8)
	if err != nil {
		return nil, nil, err
	}
	t.onCleanup(closeBoth)
	return p, pool, nil
}

// partitionCut runs the load while the armed fault cuts connections, and
// returns the hits.
func (t *trial) partitionCut(ctx context.Context, p *pgproxy.Proxy, fault pgproxy.Fault, label string) ([]pgproxy.Hit, error) {
	p.Arm(fault)
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		t.load(ctx, t.in.Requests, "load", 0, nil, nil, nil)
	}()
	var hits []pgproxy.Hit
	states := map[string]int{}
	var stateErr error
	for done := false; !done; {
		select {
		case h := <-p.Hits():
			hits = append(hits, h)
			if fault.Action == pgproxy.Blackhole {
				// The connection is silent: its client waits, the server
				// side holds whatever the statement left it holding.
				var state string
				if err := t.env.Admin.QueryRow(ctx, `SELECT coalesce((SELECT state FROM pg_stat_activity WHERE pid = $1), 'gone')`, h.Backend).Scan(&state); err != nil && stateErr == nil {
					stateErr = fmt.Errorf("state of backend %d: %w", h.Backend, err)
				}
				states[state]++
				p.Reset(h.Backend)
			}
		case <-loadDone:
			done = true
		}
	}
	for len(p.Hits()) > 0 {
		hits = append(hits, <-p.Hits())
	}
	if stateErr != nil {
		return nil, stateErr
	}
	if len(hits) == 0 {
		t.fact(label, "never reached: the strategy sent no %s (its writes commit on their own)", fault.Point)
		return nil, nil
	}
	sqls := map[string]bool{}
	for _, h := range hits {
		sqls[firstWord(h.SQL)] = true
	}
	t.fact(label, "%d connections cut once the server had executed their %s (%s)", len(hits), fault.Point, strings.Join(sortedSet(sqls), ", "))
	if fault.Action == pgproxy.Blackhole {
		var parts []string
		for _, s := range sortedSet(boolSet(states)) {
			parts = append(parts, fmt.Sprintf("%s %d", s, states[s]))
		}
		t.fact(label+": the server side while silent", "%s", strings.Join(parts, ", "))
	}
	return hits, nil
}

// partitionDark sends half the requests, darkens the proxy while `hits`
// requests are sent, heals it and measures the pool's recovery; then the
// other half.
func (t *trial) partitionDark(ctx context.Context, p *pgproxy.Proxy, label string) (dark, failedAfter []Op, err error) {
	half := t.in.Requests / 2
	t.load(ctx, half, "before", 0, nil, nil, nil)
	p.Dark()
	sku := t.sku(t.in.Stock[0].SKU)
	ops := make([]Op, t.in.Hits)
	Together(t.in.Hits, func(i int) {
		rctx, cancel := context.WithTimeout(ctx, darkDeadline)
		defer cancel()
		ops[i] = t.reserve(rctx, fmt.Sprintf("dark%d", i), i, strategy.Request{
			Key: t.key(fmt.Sprintf("dark-%02d", i)), User: t.user(fmt.Sprintf("user-dark-%02d", i)), SKU: sku, TTL: strategy.TTLForever})
	})
	healed := time.Now()
	p.Heal()
	failed := 0
	var recovery time.Duration
	for i := 0; ; i++ {
		rctx, cancel := context.WithTimeout(ctx, recoverDeadline)
		op := t.reserve(rctx, "recover", i, strategy.Request{
			Key: t.key(fmt.Sprintf("recover-%02d", i)), User: t.user(fmt.Sprintf("user-recover-%02d", i)), SKU: sku, TTL: strategy.TTLForever})
		cancel()
		if op.Type == OpOK {
			recovery = time.Since(healed)
			break
		}
		failed++
		if i >= recoverTries || time.Since(healed) > recoverWithin {
			t.check(Base, fmt.Sprintf("once a partition heals, a request is served again within %d requests and %v (each given %v)", recoverTries, recoverWithin, recoverDeadline), false,
				fmt.Sprintf("%d requests failed after it healed, the last: %s %s", failed, op.Outcome, op.Err))
			return nil, nil, fmt.Errorf("the pool did not serve again within %d requests and %v after the partition healed", recoverTries, recoverWithin)
		}
	}
	for _, op := range t.hist.Ops() {
		if op.Process == "recover" && op.Type != OpOK {
			failedAfter = append(failedAfter, op)
		}
	}
	t.vary("requests that failed after the partition healed, before the pool served again", failed)
	t.vary("pool recovery after the partition healed (ms)", int(recovery.Milliseconds()))
	t.fact(label, "%d requests sent while every connection was silent (deadline %v)", t.in.Hits, darkDeadline)
	t.load(ctx, t.in.Requests-half, "after", 0, nil, nil, nil)
	return ops, failedAfter, nil
}

// resolveByRetry waits until the server has ended the backends of the
// cut connections, reads what became of each request that ended unknown,
// and sends it again with the same key: REPLAY when it had committed, HELD
// when it had not. The counts are reported as varying, under label (or,
// without one, as the requests that failed while the pool recovered).
func (t *trial) resolveByRetry(ctx context.Context, label string, ops []Op, hits []pgproxy.Hit) error {
	pids := make([]int32, len(hits))
	for i, h := range hits {
		pids[i] = int32(h.Backend)
	}
	if err := pgcontrol.WaitNone(ctx, t.env.Admin, "backends of the cut connections",
		`SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, pids); err != nil {
		return err
	}
	var unknown []Op
	for _, op := range ops {
		if op.Type == OpInfo {
			unknown = append(unknown, op)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	keys := make([]string, len(unknown))
	for i, op := range unknown {
		keys[i] = op.Req.Key
	}
	durable, err := t.lookupAll(ctx, keys)
	if err != nil {
		return err
	}
	committed, answers := t.resend(ctx, unknown, durable)
	// How many requests a cut connection carried is the strategy's timing
	// when it serves several in one statement (combine's batches), so the
	// counts are varying, not facts; the check above is the verdict.
	if label == "" {
		label = "failed while the pool recovered"
	}
	t.vary(label+": resolved committed", committed)
	t.vary(label+": resolved absent", len(unknown)-committed)
	for _, o := range strategy.Outcomes {
		if answers[string(o)] > 0 {
			t.vary(label+": sent again, "+string(o), answers[string(o)])
		}
	}
	return nil
}

// resendTries bounds how often resend sends one request again while its
// answers stay unknown.
const resendTries = 5

// resend sends each request that ended unknown again with its key, as the
// contract tells a client to, and checks the answer against what the
// lookup found (durable): REPLAY when the first attempt had committed, HELD
// when it had not. A strategy that does not claim no-phantom-sold-out may
// answer SOLD_OUT to one that had not: the node it reaches may have no unit
// left while another has (memquota's shares), which is what a new request
// would be told there. It returns how many had committed and the answers.
func (t *trial) resend(ctx context.Context, unknown []Op, durable map[string]strategy.Reservation) (committed int, answers map[string]int) {
	answers = map[string]int{}
	var wrong, keys []string
	var retried int
	mayPhantom := !t.env.Meta.Claims.Has(strategy.NoPhantomSoldOut)
	for i, op := range unknown {
		keys = append(keys, op.Req.Key)
		was := durable[op.Req.Key].Status != strategy.StatusNotFound
		if was {
			committed++
		}
		// A resend may itself end unknown (a strategy's own deadline, on a
		// loaded machine), and a client sends it again, as the contract
		// says; from then on it may have committed, so REPLAY is right too.
		// A bounded number of tries: a strategy that never answers fails.
		var again Op
		unsure := false
		for try := 0; try < resendTries; try++ {
			again = t.reserve(ctx, fmt.Sprintf("retry%d-%d", i, try), op.Node, op.Req)
			if again.Type != OpInfo {
				break
			}
			unsure = true
		}
		if unsure {
			retried++
		}
		answers[string(again.Outcome)]++
		want := strategy.OutcomeHeld
		if was {
			want = strategy.OutcomeReplay
		}
		if again.Outcome != want && !(unsure && again.Outcome == strategy.OutcomeReplay) && !(mayPhantom && !was && again.Outcome == strategy.OutcomeSoldOut) {
			wrong = append(wrong, fmt.Sprintf("%s: %s %s, want %s", t.plain(op.Req.Key), again.Outcome, again.Err, want))
		}
	}
	t.vary("unknown outcomes whose resend ended unknown too, and was sent again", retried)
	t.check(Base, "a request sent again after an unknown outcome is REPLAY if the first committed, HELD if not (or SOLD_OUT, where a phantom sold-out is not claimed against)", len(wrong) == 0,
		sample(wrong), keys...)
	return committed, answers
}

// proxyApp is the application_name of the connections through the
// trial's proxy.
func (t *trial) proxyApp() string { return "rb-proxy" + t.suffix }

func firstWord(sql string) string {
	f := strings.Fields(sql)
	if len(f) == 0 {
		return ""
	}
	return strings.ToUpper(f[0])
}

func boolSet(m map[string]int) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

func sortedSet(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
