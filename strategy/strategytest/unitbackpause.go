package strategytest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// checkUnitBackBetweenStatements: a new request for a SKU whose one unit
// is held, paused in the strategy's own code after its k-th statement
// while the holder releases the unit, for each k in turn, is answered
// HELD or SOLD_OUT: both were true while it ran. A strategy that reads why
// a refused insert was refused in a statement of its own, and answers
// from that later reading, met a unit given back in between in no
// scenario: onetrip answered SOLD_OUT only when the second reading also
// had no unit, and an empty answer otherwise, in 3 runs of 3 (outsider
// round 46's m01). The pause is checkTwinBetweenStatements' tracer.
//
// Where the strategy holds attempts open, the same request is sent again
// inside one (then rolled back), on SKUs of its own: an attempt's refusal
// is explained on a path of its own (after a ROLLBACK TO SAVEPOINT), and
// onetrip's attempt answered an empty Result with no error there (outsider
// round 55's m09) while its plain path passed.
func checkUnitBackBetweenStatements(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// One node: a strategy that splits a SKU between nodes would answer
	// the second node's request from its share of none.
	tr, dep, stock, closeAll := openPaused(ctx, t, meta, db, rs, "unit-back", 1, 1)
	defer closeAll()
	node := dep.Node(0)
	if _, ok := node.(strategy.Releaser); !ok {
		t.Skip("no unit given back by its holder (strategy.Releaser)")
	}
	judged := unitBackRounds(ctx, t, tr, dep, stock, admin, "", func(context.Context) (reserver, func(), error) { return node, func() {}, nil })
	if opener, ok := node.(strategy.SessionOpener); ok {
		tr, dep, stock, closeAll := openPaused(ctx, t, meta, db, rs, "unit-back-s", 1, 1)
		defer closeAll()
		opener = dep.Node(0).(strategy.SessionOpener)
		judged += unitBackRounds(ctx, t, tr, dep, stock, admin, "in an attempt held open, ", func(ctx context.Context) (reserver, func(), error) {
			s, err := opener.OpenSession(ctx)
			if err != nil {
				return nil, nil, err
			}
			return s, func() { _ = s.Rollback(ctx) }, nil
		})
	}
	if judged == 0 {
		t.Skip("no request was paused between its statements and answered")
	}
}

// unitBackRounds runs checkUnitBackBetweenStatements' rounds on dep's
// node 0, one SKU of stock for each pause point, each request sent through
// what open returns (end is called once it has answered: an attempt's
// rollback), and returns how many answers it judged.
func unitBackRounds(ctx context.Context, t tester, tr *pauseTracer, dep strategy.Deployment, stock []strategy.Stock, admin *pgxpool.Pool, where string,
	open func(context.Context) (r reserver, end func(), err error)) int {
	t.Helper()
	node := dep.Node(0)
	rel := node.(strategy.Releaser)
	var wrong []string
	judged := 0
	for k := 1; k <= eachStatementRounds; k++ {
		sku := stock[k-1].SKU
		holder := strategy.Request{Key: "kit-ub-h-" + sku, User: "kit-ub-h-" + sku, SKU: sku, TTL: time.Hour}
		if res, err := reserveUnlessBusy(ctx, node, holder); err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Fatalf("the holder of %s's one unit: %s, %v; want HELD", sku, res.Outcome, err)
		}
		req := strategy.Request{Key: "kit-ub-" + sku, User: "kit-ub-" + sku, SKU: sku, TTL: time.Hour}
		via, end, err := open(ctx)
		if err != nil {
			t.Fatalf("%sthe request for %s: %v", where, sku, err)
		}
		paused := tr.arm(k)
		var box panicBox
		done := reserveAsync(withPauseMark(ctx), &box, via, req)
		stopped := false
		err = awaitAnswerOr(ctx, done, func() (bool, error) {
			select {
			case <-paused:
				stopped = true
				return true, nil
			default:
				return false, nil
			}
		})
		if err != nil {
			tr.release()
			end()
			t.Fatalf("%sthe request for %s, paused after its statement %d: %v", where, sku, k, err)
		}
		if !stopped {
			tr.release()
			<-done
			end()
			box.rethrow()
			break // fewer than k statements: every pause point is done
		}
		// The release may wait for the paused request (a row or a lock it
		// holds): then the request goes on first, and is judged all the same.
		relErr := releaseBeside(ctx, rel, admin, holder.Key, tr.pausedPID())
		tr.release()
		a := <-done
		end() // an attempt's lock may be what the release waits for
		box.rethrow()
		if err := <-relErr; err != nil {
			t.Fatalf("Release of %s's holder while a request was paused: %v", sku, err)
		}
		if a.err != nil || a.res.Outcome == strategy.OutcomeBusy {
			continue
		}
		judged++
		switch a.res.Outcome {
		case strategy.OutcomeHeld:
			if a.res.Reservation.Key != req.Key {
				wrong = append(wrong, fmt.Sprintf("after its statement %d: HELD with reservation %q", k, a.res.Reservation.Key))
			}
		case strategy.OutcomeSoldOut:
		default:
			wrong = append(wrong, fmt.Sprintf("after its statement %d: %q", k, a.res.Outcome))
		}
	}
	if len(wrong) > 0 {
		t.Errorf("%sa request for a SKU whose one unit was held, paused while the holder released it, is HELD or SOLD_OUT; got %s", where, strings.Join(wrong, "; "))
	}
	audit, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	for _, st := range audit {
		if st.Drift() != 0 {
			t.Errorf("%saudit of %s after a unit came back beside a request: total %d, available %d, active %d; want drift 0", where, st.SKU, st.Total, st.Available, st.Active)
		}
	}
	return judged
}

// releaseBeside releases key on s and returns once it has returned, or
// once it waits in PostgreSQL behind pid, or for a lock outside it: its
// error then arrives on the channel when it returns.
func releaseBeside(ctx context.Context, s strategy.Releaser, admin *pgxpool.Pool, key string, pid uint32) <-chan error {
	done := make(chan error, 1)
	w := new(strategy.LockWait)
	go func() {
		_, err := s.Release(strategy.WithLockWait(ctx, w), key)
		done <- err
	}()
	err := awaitAnswerOr(ctx, done, func() (bool, error) {
		if w.Waiting() {
			return true, nil
		}
		var n int
		err := admin.QueryRow(ctx, sqlBlockedByAny, []int32{int32(pid)}).Scan(&n)
		return n > 0, err
	})
	if err != nil {
		out := make(chan error, 1)
		out <- fmt.Errorf("waiting for Release of %s or its wait: %w", key, err)
		return out
	}
	return done
}
