package strategytest

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/reservebench/reservebench/strategy"
)

// An interleaving is driven the way PostgreSQL's isolation tester drives a
// spec: sessions hold attempts open, steps run one at a time in a given
// order, and a step that does not finish is classified from the server's
// lock table (pg_blocking_pids on the step's backends) as blocked, after
// which the next step runs. With no permutation given, every ordering of the
// steps that keeps each session's own steps in order is run.

// step is one step of an interleaving: a held session's "reserve" or "end",
// or an atomic session's single reserve-and-commit.
type step struct {
	Name    string
	Session int
	End     bool
}

func (in *Scenario) steps() []step {
	var out []step
	for i, s := range in.Sessions {
		if s.Hold {
			out = append(out, step{Name: s.Name + ".reserve", Session: i}, step{Name: s.Name + ".end", Session: i, End: true})
		} else {
			out = append(out, step{Name: s.Name, Session: i})
		}
	}
	return out
}

// orderings returns every permutation of steps in which each session's
// reserve comes before its end, in lexicographic order of step indexes.
func orderings(steps []step) [][]step {
	var out [][]step
	used := make([]bool, len(steps))
	var cur []step
	var rec func()
	rec = func() {
		if len(cur) == len(steps) {
			out = append(out, append([]step(nil), cur...))
			return
		}
		for i, s := range steps {
			if used[i] {
				continue
			}
			if s.End && !used[i-1] { // a session's end follows its reserve in steps()
				continue
			}
			used[i] = true
			cur = append(cur, s)
			rec()
			cur = cur[:len(cur)-1]
			used[i] = false
		}
	}
	rec()
	return out
}

func orderName(o []step) string {
	names := make([]string, len(o))
	for i, s := range o {
		names[i] = s.Name
	}
	return strings.Join(names, " ")
}

// sessionRun is the state of one session during one ordering.
type sessionRun struct {
	in      SessionInput
	req     strategy.Request
	sess    strategy.Session
	pids    []int32
	outcome strategy.Outcome
	err     error
	waited  bool
	ended   bool
	retry   strategy.Outcome
	busy    *inflight
	// group names the sessions that were all blocked when one step ran
	// and all finished because of it (this one included), when there were
	// two or more: which of them PostgreSQL let through first is the
	// server's choice, so the label does not say which got what.
	group []string
}

// inflight is a step running in its own goroutine.
type inflight struct {
	step step
	done chan struct{}
	err  error
}

var errNotRunnable = errors.New("the step's session is still waiting")

func runInterleave(ctx context.Context, t *trial) error {
	all := orderings(t.in.steps())
	outcomes := map[string]int{}
	var labels []string
	notRunnable := 0
	for oi, order := range all {
		child := &trial{env: t.env, in: t.in, n: t.n, suffix: fmt.Sprintf("%s-o%d", t.suffix, oi), hist: NewHistory()}
		child.cfg = strategy.Config{DB: t.env.DB, Stock: t.in.stock(child.suffix), Nodes: t.in.Nodes, Resources: t.cfg.Resources}
		dep, err := t.env.Meta.Open(ctx, child.cfg)
		if err != nil {
			return fmt.Errorf("ordering %q: open: %w", orderName(order), err)
		}
		child.dep = dep
		label, err := runOrdering(ctx, child, order)
		if err == nil {
			err = child.checkDurable(ctx)
		}
		if cerr := dep.Close(); err == nil && cerr != nil {
			err = cerr
		}
		switch {
		case errors.Is(err, errNotRunnable):
			notRunnable++
			continue
		case err != nil:
			return fmt.Errorf("ordering %q: %w", orderName(order), err)
		}
		if outcomes[label] == 0 {
			labels = append(labels, label)
		}
		outcomes[label]++
		for _, c := range child.checks {
			if !c.ok {
				c.detail = fmt.Sprintf("ordering %q: %s", orderName(order), c.detail)
			}
			t.checks = append(t.checks, c)
		}
		if t.in.SeedOrder != nil && orderName(order) == strings.Join(t.in.SeedOrder, " ") {
			t.fact("seed order: "+strings.Join(t.in.SeedOrder, ", "), "%s", label)
		}
	}
	t.fact("orderings", "%d run, %d not runnable (a step's session was still waiting)", len(all)-notRunnable, notRunnable)
	sort.SliceStable(labels, func(i, j int) bool { return outcomes[labels[i]] > outcomes[labels[j]] })
	for _, l := range labels {
		t.fact("outcome: "+l, "%d of %d orderings", outcomes[l], len(all)-notRunnable)
	}
	return nil
}

// runOrdering runs the steps in order and returns the outcome label.
func runOrdering(ctx context.Context, t *trial, order []step) (string, error) {
	sessions := make([]*sessionRun, len(t.in.Sessions))
	sku := t.sku(t.in.Stock[0].SKU)
	for i, s := range t.in.Sessions {
		if s.SKU != "" {
			sku = t.sku(s.SKU)
		}
		sessions[i] = &sessionRun{in: s, req: strategy.Request{Key: t.key(s.Key), User: t.user(s.User), SKU: sku, TTL: strategy.TTLForever}}
	}
	defer func() { // whatever happened, leave no transaction open
		for _, s := range sessions {
			if s.busy != nil {
				<-s.busy.done
			}
			if s.sess != nil && !s.ended {
				_ = s.sess.Rollback(context.Background())
			}
		}
	}()
	opener := t.node(0).(strategy.SessionOpener)

	var runErr error
	for _, st := range order {
		s := sessions[st.Session]
		if s.busy != nil {
			runErr = fmt.Errorf("%w: %s", errNotRunnable, st.Name)
			break
		}
		var blocked []*sessionRun
		for _, o := range sessions {
			if o.busy != nil {
				blocked = append(blocked, o)
			}
		}
		if err := t.launch(ctx, opener, s, st); err != nil {
			return "", err
		}
		if err := t.settle(ctx, sessions); err != nil {
			return "", err
		}
		var woken []*sessionRun
		for _, o := range blocked {
			if o.busy == nil {
				woken = append(woken, o)
			}
		}
		if len(woken) > 1 {
			var names []string
			for _, o := range woken {
				names = append(names, o.in.Name)
			}
			for _, o := range woken {
				o.group = names
			}
		}
	}
	if runErr != nil {
		// Release what the waiting sessions wait for, then let them finish.
		for _, s := range sessions {
			if s.busy == nil && s.sess != nil && !s.ended {
				_ = s.sess.Rollback(ctx)
				s.ended = true
			}
		}
		for _, s := range sessions {
			if s.busy != nil {
				<-s.busy.done
				s.busy = nil
			}
		}
		return "", runErr
	}
	for _, s := range sessions {
		if s.busy != nil {
			return "", fmt.Errorf("step %s still waiting after every step ran", s.busy.step.Name)
		}
	}

	audit, err := t.audit(ctx)
	if err != nil {
		return "", err
	}
	free := sumAvailable(audit)
	var phantom []string
	var waited []string
	for _, s := range sessions {
		if s.waited {
			waited = append(waited, s.in.Name)
		}
		if s.outcome == strategy.OutcomeSoldOut && free > 0 {
			phantom = append(phantom, s.in.Name)
		}
	}
	// Waiting is only a boundary when the attempts compete for stock alone.
	// A repeated key or user must wait for the attempt that holds it: its
	// answer (REPLAY, USER_LIMIT or HELD) depends on whether that commits.
	if sharesOnlyStock(sessions) {
		t.check(strategy.NoWait, "no attempt waits for another's uncommitted work", len(waited) == 0,
			fmt.Sprintf("%s waited (blocked in PostgreSQL, seen in pg_blocking_pids, or on a lock the strategy takes outside it)", strings.Join(waited, ", ")))
	}
	t.check(strategy.NoPhantomSoldOut, "no SOLD_OUT while a unit is free once every attempt finished", len(phantom) == 0,
		fmt.Sprintf("%s told SOLD_OUT, %d unit(s) free at the end", strings.Join(phantom, ", "), free))

	// What the sessions were told against what was committed.
	keys := map[string]bool{}
	for _, s := range sessions {
		keys[s.req.Key] = true
	}
	var keyList []string
	for k := range keys {
		keyList = append(keyList, k)
	}
	durable, err := t.lookupAll(ctx, keyList)
	if err != nil {
		return "", err
	}
	var lostHeld, keptRolledBack, doubled, misanswered []string
	for _, s := range sessions {
		d := durable[s.req.Key]
		committed := !s.in.Hold || s.in.End != "rollback"
		shared := 0
		for _, o := range sessions {
			if o.req.Key == s.req.Key {
				shared++
			}
		}
		switch {
		case s.err != nil:
		case committed && s.outcome == strategy.OutcomeHeld && d.Status == strategy.StatusNotFound:
			lostHeld = append(lostHeld, s.in.Name)
		case !committed && shared == 1 && d.Status != strategy.StatusNotFound:
			keptRolledBack = append(keptRolledBack, s.in.Name)
		}
		if shared > 1 && committed && s.err == nil {
			held := 0
			for _, o := range sessions {
				if o.req.Key == s.req.Key && o.outcome == strategy.OutcomeHeld && (!o.in.Hold || o.in.End != "rollback") {
					held++
				}
			}
			if held > 1 {
				doubled = append(doubled, s.in.Name)
			}
			if s.outcome != strategy.OutcomeHeld && s.outcome != strategy.OutcomeReplay && s.outcome != strategy.OutcomeBusy && d.User == s.req.User && d.SKU == s.req.SKU {
				misanswered = append(misanswered, fmt.Sprintf("%s got %s", s.in.Name, s.outcome))
			}
		}
	}
	t.check(Base, "a committed HELD attempt is in the database", len(lostHeld) == 0, strings.Join(lostHeld, ", ")+" lost")
	t.check(Base, "a rolled-back attempt leaves nothing", len(keptRolledBack) == 0, strings.Join(keptRolledBack, ", ")+" kept a reservation after rollback")
	t.check(strategy.IdempotentKey, "one key yields at most one reservation", len(doubled) == 0, strings.Join(doubled, ", ")+" all committed HELD for one key")
	t.check(strategy.IdempotentKey, "a repeated key is answered REPLAY, a reused one KEY_REUSED", len(misanswered) == 0, strings.Join(misanswered, ", ")+" for a key its user holds (want REPLAY)")

	// A rejected request retried after everyone finished: does it get the unit?
	for _, s := range sessions {
		if s.outcome == strategy.OutcomeSoldOut {
			op := t.reserveDefinite(ctx, s.in.Name+"'", 0, s.req)
			s.retry = op.Outcome
		}
	}

	var parts []string
	grouped := map[string][]string{} // first member's name -> the group's answers
	for _, s := range sessions {
		p := string(s.outcome)
		if s.err != nil {
			p = "error"
		}
		if s.waited {
			p += " after waiting"
		}
		if s.in.End == "rollback" {
			p += " (rolled back)"
		}
		if s.retry != "" {
			p += fmt.Sprintf(", retried: %s", s.retry)
		}
		if len(s.group) > 0 {
			grouped[s.group[0]] = append(grouped[s.group[0]], p)
			if s.group[0] == s.in.Name {
				parts = append(parts, "") // the group's place, filled below
			}
			continue
		}
		parts = append(parts, s.in.Name+" "+p)
	}
	// A group's answers, sorted: which member got which is not the
	// strategy's to decide (see sessionRun.group).
	i := 0
	for _, s := range sessions {
		if len(s.group) > 0 && s.group[0] == s.in.Name {
			for parts[i] != "" {
				i++
			}
			answers := grouped[s.in.Name]
			sort.Strings(answers)
			parts[i] = fmt.Sprintf("%s woken together: %s", strings.Join(s.group, ", "), strings.Join(answers, ", "))
		}
	}
	return fmt.Sprintf("%s; %d free at end", strings.Join(parts, "; "), free), nil
}

// sharesOnlyStock reports whether no two sessions share a key or a user.
func sharesOnlyStock(sessions []*sessionRun) bool {
	keys, users := map[string]bool{}, map[string]bool{}
	for _, s := range sessions {
		u := s.req.User + "\x00" + s.req.SKU
		if keys[s.req.Key] || users[u] {
			return false
		}
		keys[s.req.Key], users[u] = true, true
	}
	return true
}

// launch starts one step in its own goroutine.
func (t *trial) launch(ctx context.Context, opener strategy.SessionOpener, s *sessionRun, st step) error {
	if !st.End {
		sess, err := opener.OpenSession(ctx)
		if err != nil {
			return fmt.Errorf("open session %s: %w", s.in.Name, err)
		}
		s.sess = sess
		s.pids = nil
		for _, p := range sess.Backends() {
			s.pids = append(s.pids, int32(p))
		}
	}
	f := &inflight{step: st, done: make(chan struct{})}
	s.busy = f
	go func() {
		defer close(f.done)
		defer func() {
			if p := recover(); p != nil {
				f.err = fmt.Errorf("the strategy panicked in step %s: %v", st.Name, p)
				s.err = f.err
				t.notePanic(fmt.Sprintf("step %s: %v", st.Name, p))
			}
		}()
		if st.End {
			op := Op{Process: s.in.Name, Kind: s.in.End, Req: s.req, Invoke: t.hist.Begin()}
			if s.in.End == "rollback" {
				f.err = s.sess.Rollback(ctx)
				op.Type = OpFail
			} else {
				f.err = s.sess.Commit(ctx)
				op.Type = OpOK
			}
			if f.err != nil {
				op.Type, op.Err = OpInfo, f.err.Error()
			}
			t.hist.End(op)
			return
		}
		op := Op{Process: s.in.Name, Req: s.req, Invoke: t.hist.Begin()}
		res, err := s.sess.Reserve(ctx, s.req)
		op = reserveOp(op, res, err)
		if s.in.Hold {
			// Held open: its effect is decided by the end step. Record the
			// answer as unknown until then; the durable check resolves it.
			if op.Type == OpOK {
				op.Type = OpInfo
			}
			t.hist.End(op)
			s.outcome, s.err = res.Outcome, err
			f.err = err
			return
		}
		if err == nil {
			err = s.sess.Commit(ctx)
			if err != nil {
				op.Type, op.Err = OpInfo, err.Error()
			}
		} else {
			// The step ends here either way (settle marks it ended), so
			// its transaction must end too: a session whose Reserve
			// failed (40001 under REPEATABLE READ) would otherwise keep
			// its connection for ever.
			_ = s.sess.Rollback(ctx)
		}
		t.hist.End(op)
		s.outcome, s.err, f.err = res.Outcome, err, err
	}()
	return nil
}

// settle waits until every step in flight has finished or is seen blocked.
// A step that finishes can wake others, which may then block on each other
// (after t1 rolls back, t2 and t3 both wake and one waits for the other), so
// it repeats until a pass finishes nothing.
func (t *trial) settle(ctx context.Context, sessions []*sessionRun) error {
	for {
		progress := false
		for _, s := range sessions {
			if s.busy == nil {
				continue
			}
			finished, err := t.await(ctx, s)
			if err != nil {
				return err
			}
			if !finished {
				s.waited = true
				continue
			}
			if s.busy.step.End || !s.in.Hold {
				s.ended = true
			}
			s.busy = nil
			progress = true
		}
		if !progress {
			return nil
		}
	}
}

// await reports whether the session's step finished (true) or is blocked in
// PostgreSQL (false), polling like isolationtester: the decision comes from
// the lock table, the poll interval only paces the question.
func (t *trial) await(ctx context.Context, s *sessionRun) (bool, error) {
	deadline := time.Now().Add(t.env.StepTimeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-s.busy.done:
			return true, nil
		default:
		}
		if ls, ok := s.sess.(strategy.LockedSession); ok && ls.LockWaiting() {
			// Waiting for a lock outside PostgreSQL is blocked while
			// another holds the lock; a free lock is taken at the next try.
			held, err := t.lockHeld(ctx, s.req.SKU)
			if err != nil {
				return false, err
			}
			if held && ls.LockWaiting() {
				select { // it may have finished between the probe and now
				case <-s.busy.done:
					return true, nil
				default:
					return false, nil
				}
			}
		}
		if len(s.pids) > 0 {
			var blocked bool
			err := t.env.Admin.QueryRow(ctx,
				`SELECT coalesce(bool_or(cardinality(pg_blocking_pids(p)) > 0), false) FROM unnest($1::int4[]) AS p`,
				s.pids).Scan(&blocked)
			if err != nil {
				return false, fmt.Errorf("probe lock waits of %s: %w", s.in.Name, err)
			}
			if blocked {
				select { // it may have finished between the probe and now
				case <-s.busy.done:
					return true, nil
				default:
					return false, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return false, fmt.Errorf("step %s neither finished nor was blocked in PostgreSQL within %v (blocked in the process?)", s.busy.step.Name, t.env.StepTimeout)
		}
		select {
		case <-s.busy.done:
			return true, nil
		case <-tick.C:
		}
	}
}
