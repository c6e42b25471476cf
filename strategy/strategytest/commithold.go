package strategytest

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// A sale held at its COMMIT stands in for an attempt held open
// (strategy.Session) in the checks that need a sale whose writes are done
// and not yet visible, for a strategy without sessions (outsider round
// 28b: such checks were skipped for them, and their bugs passed).

// saleAtCommit is a plain Reserve held at its COMMIT (holdCommitNaming):
// its writes are done, its locks held, its rows not yet visible.
type saleAtCommit struct {
	hold *writeHold
	done chan answer
	box  panicBox
}

// holdSaleAtCommit sends req and returns once it is seen waiting at its
// COMMIT. A strategy that writes no row naming the key, or answers
// without waiting there, skips the check.
func holdSaleAtCommit(ctx context.Context, t tester, admin *pgxpool.Pool, node strategy.Strategy, req strategy.Request) *saleAtCommit {
	t.Helper()
	hold, err := holdCommitNaming(ctx, admin, req.Key)
	if errors.Is(err, errNoTables) {
		t.Skip("the strategy keeps no tables in PostgreSQL: no commit to hold")
	} else if err != nil {
		t.Fatalf("%v", err)
	}
	s := &saleAtCommit{hold: hold}
	s.done = reserveAsync(ctx, &s.box, node, req)
	pid, err := awaitWaiter(ctx, hold, s.done, besideWithin)
	if err != nil || pid == 0 {
		s.remove(t)
		if err != nil {
			t.Fatalf("Reserve %q held at its commit: %v", req.Key, err)
		}
		a := <-s.done
		t.Skip(fmt.Sprintf("a request was answered (%s, %v) without being seen at a COMMIT after writing a row naming its key: no sale to hold", a.res.Outcome, a.err))
	}
	return s
}

// commit lets the sale commit and waits for its answer. Its outcome is not
// the check's: a sale that failed is not in the audit, which must balance
// all the same.
func (s *saleAtCommit) commit(context.Context) error {
	s.answer()
	return nil
}

// answer lets the sale go and returns its answer.
func (s *saleAtCommit) answer() answer {
	s.hold.release()
	a := <-s.done
	s.done <- a
	s.box.rethrow()
	return a
}

// remove lets the sale go, if it still waits, and drops the triggers.
func (s *saleAtCommit) remove(t tester) {
	s.hold.removeOrReport(t)
}

// heldAttempt is a sale held before its commit: an attempt held open
// (strategy.Session), or, for a strategy without one, a plain request held
// at its COMMIT (heldAtCommit).
type heldAttempt interface {
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// heldAtCommit is a saleAtCommit as a heldAttempt: Commit lets it go and
// fails unless it was HELD; Rollback only drops the hold (the sale then
// commits, if it has not): a check that needs a rollback needs a session.
type heldAtCommit struct{ *saleAtCommit }

func (h heldAtCommit) Commit(context.Context) error {
	switch a := h.answer(); {
	case a.err != nil:
		return fmt.Errorf("the sale held at its commit: %w", a.err)
	case a.res.Outcome != strategy.OutcomeHeld:
		return fmt.Errorf("the sale held at its commit: %s; want HELD", a.res.Outcome)
	}
	return nil
}

func (h heldAtCommit) Rollback(context.Context) error { return h.hold.remove() }

// holdAttempt holds req before its commit: in a session when opener is not
// nil (holdInSession), else as a plain request to node held at its COMMIT.
// It returns the attempt and the backends a wait behind it is seen on.
func holdAttempt(ctx context.Context, t tester, opener strategy.SessionOpener, node strategy.Strategy, admin *pgxpool.Pool, req strategy.Request, what string) (heldAttempt, []uint32) {
	t.Helper()
	if opener != nil {
		return holdInSession(ctx, t, opener, req, what)
	}
	sale := holdSaleAtCommit(ctx, t, admin, node, req)
	var pid int32
	if err := admin.QueryRow(ctx, sqlHoldWaiter, writeHoldClass, sale.hold.objid).Scan(&pid); err != nil {
		sale.remove(t)
		t.Fatalf("%s: the backend held at its commit: %v", what, err)
	}
	// A request that writes a row naming the key before it meets the
	// attempt's waits for the hold itself: seen blocked by its connection.
	return heldAtCommit{sale}, []uint32{uint32(pid), sale.hold.lock.Conn().PgConn().PID()}
}
