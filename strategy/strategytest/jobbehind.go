package strategytest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkJobBehindTransition: a due HELD reservation's late payment
// (ConfirmUntilExpired) or release is held in PostgreSQL at its first
// write naming the key, after it has locked the row, and the expiry job
// runs then. When the transition goes on and commits, the job, which
// waited for the row or skipped it, must leave it as the transition made
// it: CONFIRMED or RELEASED, not EXPIRED, and no unit given back for it
// by the job (a release's unit comes back once). A job that picks its due
// rows and then updates them by id alone, without SKIP LOCKED and without
// asking again that the row be HELD, waits for the row and, under READ
// COMMITTED, updates the new version the transition committed: a confirmed
// reservation expired, its unit sold again (outsider round 28's sr3, which
// confirm-vs-expire caught in about 2 runs of 5, when its job happened to
// come in that window).
func checkJobBehindTransition(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dep, sku := openOneSKU(ctx, t, meta, db, rs, "job-behind", 2)
	defer dep.Close()
	node := dep.Node(0)
	ager, ages := dep.(strategy.Ager)
	expirer, expires := node.(strategy.Expirer)
	if !ages || !expires {
		t.Skip("no expiry job with MakeDue (strategy.Expirer, strategy.Ager)")
	}
	type transition struct {
		name, status string
		want         strategy.Status
		active       int
		run          func(key string) (bool, error)
	}
	var moves []transition
	if c, ok := node.(strategy.Confirmer); ok {
		moves = append(moves, transition{"late payment (ConfirmUntilExpired)", "confirmed", strategy.StatusConfirmed, 1,
			func(key string) (bool, error) { return c.Confirm(ctx, key, strategy.ConfirmUntilExpired) }})
	}
	if r, ok := node.(strategy.Releaser); ok {
		moves = append(moves, transition{"release", "released", strategy.StatusReleased, 0,
			func(key string) (bool, error) { n, err := r.Release(ctx, key); return n == 1, err }})
	}
	if len(moves) == 0 {
		t.Skip("neither Confirm nor Release")
	}
	heldAny := false
	for i, m := range moves {
		key := fmt.Sprintf("kit-job-behind-%d-%s", i, sku)
		req := strategy.Request{Key: key, User: fmt.Sprintf("kit-job-behind-%d", i), SKU: sku, TTL: time.Hour}
		if res, err := reserveUnlessBusy(ctx, node, req); err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Fatalf("Reserve %q: %s, %v; want HELD", key, res.Outcome, err)
		}
		if n, err := ager.MakeDue(ctx, []string{key}); err != nil || n != 1 {
			t.Fatalf("MakeDue %q: %d, %v", key, n, err)
		}
		moved, job, held, err := jobBehind(ctx, admin, key, m.run, expirer)
		if err != nil {
			t.Fatalf("the %s of a due reservation, the expiry job behind it: %v", m.name, err)
		}
		heldAny = heldAny || held
		if moved.err != nil {
			continue // unknown: says nothing of what the job may do
		}
		if !moved.ok {
			t.Errorf("the %s of a due HELD reservation that nothing else had moved when it locked its row: not moved; want it %s", m.name, m.status)
			continue
		}
		r, err := node.Lookup(ctx, key)
		if err != nil {
			t.Fatalf("Lookup %q: %v", key, err)
		}
		if r.Status != m.want || job.err == nil && job.n != 0 {
			t.Errorf("a due reservation %s by a %s that held its row while the expiry job ran (the job %s): the reservation is %s and the job gave back %d unit(s), %v; want it %s and 0 (the job must not move a row the %s moved first)",
				m.status, m.name, map[bool]string{true: "waited for the row", false: "did not wait for it"}[held], r.Status, job.n, job.err, m.want, m.name)
		}
		list, err := dep.Audit(ctx)
		if err != nil || len(list) != 1 {
			t.Fatalf("Audit: %+v, %v", list, err)
		}
		if a := list[0]; a.Drift() != 0 {
			t.Errorf("after the %s and the expiry job behind it: total %d - available %d - active %d = drift %d; want 0 (the unit comes back once)", m.name, a.Total, a.Available, a.Active, a.Drift())
		}
	}
	if !heldAny {
		t.Logf("neither transition was seen waiting at a write naming its key: the expiry job ran after each")
	}
}

// moveAnswer is a Confirm's or a Release's answer: moved or not.
type moveAnswer struct {
	ok  bool
	err error
}

// jobAnswer is an expiry job's answer: the units it gave back.
type jobAnswer struct {
	n   int
	err error
}

// jobBehind holds run(key) at its first write naming key and, once it is
// seen waiting there, runs the expiry job until it waits for run's backend
// (or answers, or besideWithin passes), then lets run go. held reports
// whether run was seen waiting at the hold; when it was not, the job runs
// after it.
func jobBehind(ctx context.Context, admin *pgxpool.Pool, key string, run func(string) (bool, error), expirer strategy.Expirer) (moved moveAnswer, job jobAnswer, held bool, err error) {
	hold, err := holdEveryWriteNaming(ctx, admin, key)
	if errors.Is(err, errNoTables) {
		moved.ok, moved.err = run(key)
		job.n, job.err = expirer.ExpireDue(ctx)
		return moved, job, false, nil
	} else if err != nil {
		return moved, job, false, err
	}
	defer func() {
		if rerr := hold.remove(); err == nil {
			err = rerr
		}
	}()
	done := make(chan moveAnswer, 1)
	go func() {
		ok, err := run(key)
		done <- moveAnswer{ok, err}
	}()
	pid, err := awaitWaiter(ctx, hold, done, besideWithin)
	if err != nil {
		return moved, job, false, err
	}
	if pid == 0 {
		hold.release()
		moved = <-done
		job.n, job.err = expirer.ExpireDue(ctx)
		return moved, job, false, nil
	}
	jobDone := make(chan jobAnswer, 1)
	go func() {
		n, err := expirer.ExpireDue(ctx)
		jobDone <- jobAnswer{n, err}
	}()
	waitCtx, waitCancel := context.WithTimeout(ctx, besideWithin)
	_, werr := awaitAnswerOrBlocked(waitCtx, admin, pid, jobDone)
	waitCancel()
	if werr != nil && ctx.Err() != nil {
		hold.release()
		return moved, job, true, werr
	}
	hold.release()
	moved, job = <-done, <-jobDone
	return moved, job, true, nil
}
