package hotrow

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Backoff between retries: a random pause in [0, min(retryPauseCap,
// retryPauseBase<<attempt)), so transactions that lost the same race do not
// queue on the hot row again in lockstep.
const (
	retryPauseBase = 200 * time.Microsecond
	retryPauseCap  = 20 * time.Millisecond
)

// errRetriesSpent marks a transaction that PostgreSQL rolled back on every
// one of its attempts: nothing was written, so Reserve answers it BUSY (a
// definite refusal the caller may send again) rather than as an unknown
// outcome. CI on a loaded 2-core machine saw 50 concurrent reservations at
// REPEATABLE READ leave one request 40001 on all of its 21 attempts.
var errRetriesSpent = errors.New("every attempt was rolled back")

// inTx runs fn in a transaction at the deployment's isolation level and
// commits it. When the transaction fails with a serialization failure
// (40001), a deadlock (40P01), errInvisibleConflict or the multixact error
// of multixactUpdaters (all of which leave nothing committed), it reruns the whole transaction, at most
// d.maxRetries times. fn must set its results afresh on every call.
func (d *Deployment) inTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	for attempt := 0; ; attempt++ {
		err := d.once(ctx, fn)
		if err == nil || !retryable(err) {
			return err
		}
		if attempt >= d.maxRetries {
			if attempt == 0 {
				return err
			}
			return fmt.Errorf("gave up after %d retries: %w: %w", attempt, errRetriesSpent, err)
		}
		d.retries.Add(1)
		if perr := pause(ctx, attempt); perr != nil {
			return fmt.Errorf("waiting to retry: %w (last error: %w)", perr, err)
		}
	}
}

func (d *Deployment) once(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := d.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: d.iso})
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// retryable reports whether err says the transaction was rolled back for a
// reason a fresh attempt can overcome.
func retryable(err error) bool {
	if errors.Is(err, errInvisibleConflict) {
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return pgErr.Code == codeSerializationFailure || pgErr.Code == codeDeadlockDetected || multixactUpdaters(pgErr)
}

// multixactUpdaters reports PostgreSQL's internal error "new multixact has
// more than one updating member" (XX000). Table 28-1's skew scenario met it
// at SERIALIZABLE on PostgreSQL 15: the decrement of the stock row, whose
// lockers were the foreign-key share locks of concurrent inserts, failed
// with it once in a few hundred runs. It is an ERROR, so the transaction
// is aborted with nothing written, and a fresh attempt succeeds: rerunning
// it like a 40001 turns a server quirk into a retry instead of an unknown
// outcome the caller must resolve.
func multixactUpdaters(pgErr *pgconn.PgError) bool {
	return pgErr.Code == "XX000" && strings.Contains(pgErr.Message, "new multixact has more than one updating member")
}

func pause(ctx context.Context, attempt int) error {
	limit := retryPauseCap
	if attempt < 16 && retryPauseBase<<attempt < limit {
		limit = retryPauseBase << attempt
	}
	t := time.NewTimer(rand.N(limit) + time.Microsecond)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
