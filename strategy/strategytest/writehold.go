package strategytest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A writeHold stops one request in the middle of its Reserve: the first
// row it writes that names its key (an INSERT of its reservation, or an
// UPDATE that puts the key into a row, as a slot claimed) waits in
// PostgreSQL, before it is written, until the harness lets it go. Whatever
// the request did before that write (a unit taken in Redis or in a node's
// memory, a row lock on the stock, an advisory lock) stays done, and
// nothing else waits: other requests, the expiry job and the audit write
// and read as usual. The crash and restart checks hold a request in flight
// by holding whole tables, which also stops every other write; this holds
// one request alone, without knowing the strategy's schema.
//
// The hold is a namingTrigger that, for a row whose new text names the key
// and whose old text did not, takes a shared advisory lock the harness
// holds exclusively. The wait is read from pg_locks. The triggers are dropped
// when the hold is removed.
type writeHold struct {
	*namingTrigger
	objid int32
	lock  *pgxpool.Conn
	once  sync.Once
}

// A namingTrigger is the BEFORE INSERT OR UPDATE row trigger, on every
// table of the strategy's schema, that acts on the rows whose new text
// names key and whose old text did not: it waits for an advisory lock
// (holdWritesNaming), fails the statement (failWritesNaming, which can
// also fail the updates of rows that named the key already) or leaves the
// row unwritten (skipWritesNaming). Its SQL is sqlNamingFunction.
type namingTrigger struct {
	key    string
	admin  *pgxpool.Pool
	tables []string
	schema string
	// atCommit: the triggers are AFTER ROW constraint triggers deferred to
	// the COMMIT of the transaction that wrote the row (holdCommitNaming).
	atCommit bool
}

// writeHoldClass is the first key of the two-key advisory locks of
// writeHold: a number no strategy uses (two-key advisory locks do not meet
// one-key ones, whatever their values), "kit" in ASCII.
const writeHoldClass = 0x6b6974

// writeHoldSeq numbers the holds of this process, the second key.
var writeHoldSeq atomic.Int32

// errNoTables: the strategy keeps no tables in PostgreSQL, so no write of
// it can be made to wait.
var errNoTables = errors.New("the strategy keeps no tables in PostgreSQL")

// holdWritesNaming installs the hold for key and returns it holding. The
// caller defers remove.
func holdWritesNaming(ctx context.Context, admin *pgxpool.Pool, key string) (*writeHold, error) {
	return installHold(ctx, admin, key, "hold", false)
}

// holdCommitNaming holds the COMMIT of every transaction that wrote a row
// whose text names key (a plain request's, its writes done and its locks
// held, its rows not yet visible), until the hold is released: the
// triggers are deferred to the commit (DEFERRABLE INITIALLY DEFERRED
// constraint triggers), and they wait as holdWritesNaming's do.
func holdCommitNaming(ctx context.Context, admin *pgxpool.Pool, key string) (*writeHold, error) {
	return installHold(ctx, admin, key, "hold-any", true)
}

// holdEveryWriteNaming is holdWritesNaming for every write of a row whose
// new text names key, the updates of a row that named it before included
// (a transition of the key's reservation, held once it has locked the row:
// a BEFORE ROW trigger runs on the row locked for the update).
func holdEveryWriteNaming(ctx context.Context, admin *pgxpool.Pool, key string) (*writeHold, error) {
	return installHold(ctx, admin, key, "hold-any", false)
}

func installHold(ctx context.Context, admin *pgxpool.Pool, key, mode string, atCommit bool) (*writeHold, error) {
	h := &writeHold{objid: writeHoldSeq.Add(1)}
	lock, err := admin.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("hold writes naming %q: %w", key, err)
	}
	if _, err := lock.Exec(ctx, `SELECT pg_advisory_lock($1::int4, $2::int4)`, writeHoldClass, h.objid); err != nil {
		lock.Release()
		return nil, fmt.Errorf("hold writes naming %q: take the lock: %w", key, err)
	}
	h.lock = lock
	h.namingTrigger = &namingTrigger{key: key, admin: admin, atCommit: atCommit}
	err = pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
		return h.namingTrigger.install(tx, []string{mode, fmt.Sprint(writeHoldClass), fmt.Sprint(h.objid)})
	})
	if err != nil {
		h.release() // the transaction that made the triggers rolled back
		return nil, fmt.Errorf("hold writes naming %q: %w", key, err)
	}
	return h, nil
}

// holdWritesOrSkip is holdWritesNaming for a check: a strategy without
// tables skips it, any other error fails it. The caller defers
// removeOrReport.
func holdWritesOrSkip(ctx context.Context, t tester, admin *pgxpool.Pool, key string) *writeHold {
	t.Helper()
	hold, err := holdWritesNaming(ctx, admin, key)
	if errors.Is(err, errNoTables) {
		t.Skip("the strategy keeps no tables in PostgreSQL: no write to hold")
	} else if err != nil {
		t.Fatalf("%v", err)
	}
	return hold
}

// installNamingTrigger puts the trigger on every table, with args after
// the key: "hold", the advisory lock's two keys; or "fail", an SQLSTATE.
func installNamingTrigger(ctx context.Context, admin *pgxpool.Pool, key string, args ...string) (*namingTrigger, error) {
	tr := &namingTrigger{key: key, admin: admin}
	if err := pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error { return tr.install(tx, args) }); err != nil {
		return nil, err
	}
	return tr, nil
}

// sqlHoldTables lists the tables a trigger goes on: every table of the
// strategy's schemas but partitions, whose parent's trigger is theirs.
const sqlHoldTables = `
SELECT n.nspname, format('%I.%I', n.nspname, c.relname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'
ORDER BY 2`

// sqlNamingFunction acts on a row whose new text names TG_ARGV[0] and
// whose old text did not: TG_ARGV[1] 'hold' waits for the advisory lock
// (TG_ARGV[2], TG_ARGV[3]), and 'hold-any' waits so for every row whose new
// text names the key, the updates of a row that named it before too (a
// transition of the key's reservation); 'fail' raises SQLSTATE TG_ARGV[2],
// and 'fail-any' raises it for every row whose new text names the key.
// 'skip' leaves the row unwritten, without an error, as an INSERT ... ON
// CONFLICT DO NOTHING does that meets a row its snapshot cannot see.
// 'fail-once' raises SQLSTATE 40001 for every row naming the key while the
// sequence TG_ARGV[2] has not passed 1 (nextval is not undone by the
// rollback): deferred to the COMMIT (failOnceAtCommit), the first
// transaction that wrote such a row fails there, and the next go through.
const sqlNamingFunction = `
CREATE OR REPLACE FUNCTION %s.kit_writes_naming() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF strpos(row_to_json(NEW)::text, TG_ARGV[0]) > 0
       AND (TG_ARGV[1] IN ('fail-any', 'hold-any', 'fail-once') OR TG_OP = 'INSERT' OR strpos(row_to_json(OLD)::text, TG_ARGV[0]) = 0) THEN
        IF TG_ARGV[1] = 'skip' THEN
            RETURN NULL;
        END IF;
        IF TG_ARGV[1] = 'fail-once' THEN
            IF nextval(TG_ARGV[2]::regclass) = 1 THEN
                RAISE EXCEPTION 'reservebench kit: the first commit of a write naming %% fails with a serialization failure', TG_ARGV[0]
                    USING ERRCODE = '40001';
            END IF;
            RETURN NEW;
        END IF;
        IF TG_ARGV[1] IN ('fail', 'fail-any') THEN
            RAISE EXCEPTION 'reservebench kit: a write naming %% fails with SQLSTATE %%', TG_ARGV[0], TG_ARGV[2]
                USING ERRCODE = TG_ARGV[2];
        END IF;
        PERFORM pg_advisory_xact_lock_shared(TG_ARGV[2]::int4, TG_ARGV[3]::int4);
    END IF;
    RETURN NEW;
END $$`

func (h *namingTrigger) install(tx pgx.Tx, args []string) error {
	ctx := context.Background()
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '10s'`); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, sqlHoldTables)
	if err != nil {
		return fmt.Errorf("list the tables: %w", err)
	}
	var schema, table string
	if _, err := pgx.ForEachRow(rows, []any{&schema, &table}, func() error {
		if h.schema == "" {
			h.schema = schema
		}
		h.tables = append(h.tables, table)
		return nil
	}); err != nil {
		return fmt.Errorf("list the tables: %w", err)
	}
	if len(h.tables) == 0 {
		return errNoTables
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(sqlNamingFunction, pgx.Identifier{h.schema}.Sanitize())); err != nil {
		return fmt.Errorf("create the trigger function: %w", err)
	}
	// The function runs as the role that writes (a strategy's runtime
	// role, under least privilege), whatever default privileges its
	// schema revoked.
	if _, err := tx.Exec(ctx, fmt.Sprintf(`GRANT EXECUTE ON FUNCTION %s.kit_writes_naming() TO PUBLIC`, pgx.Identifier{h.schema}.Sanitize())); err != nil {
		return fmt.Errorf("grant the trigger function: %w", err)
	}
	lits := []string{quoteLiteral(h.key)}
	for _, a := range args {
		lits = append(lits, quoteLiteral(a))
	}
	create := `CREATE TRIGGER kit_writes_naming BEFORE INSERT OR UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION %s.kit_writes_naming(%s)`
	if h.atCommit {
		create = `CREATE CONSTRAINT TRIGGER kit_writes_naming AFTER INSERT OR UPDATE ON %s DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION %s.kit_writes_naming(%s)`
	}
	for _, tb := range h.tables {
		if _, err := tx.Exec(ctx, fmt.Sprintf(create, tb, pgx.Identifier{h.schema}.Sanitize(), strings.Join(lits, ", "))); err != nil {
			return fmt.Errorf("create the trigger on %s: %w", tb, err)
		}
	}
	return nil
}

// quoteLiteral quotes s as an SQL string literal (standard_conforming_strings
// is on: only quotes are doubled).
func quoteLiteral(s string) string {
	out := []byte{'\''}
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}

// sqlHoldWaiter is the backend that waits for the hold, if any.
const sqlHoldWaiter = `
SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2 AND NOT granted
LIMIT 1`

// awaitWaiter waits until a backend waits for the hold, and returns its
// pid, or until done has an answer (left in it: the request wrote no row
// naming its key, or none before it answered), or until within has passed:
// pid is 0 then.
func awaitWaiter[A any](ctx context.Context, h *writeHold, done chan A, within time.Duration) (int32, error) {
	seenCtx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var pid int32
	err := awaitAnswerOr(seenCtx, done, func() (bool, error) {
		err := h.admin.QueryRow(seenCtx, sqlHoldWaiter, writeHoldClass, h.objid).Scan(&pid)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil && ctx.Err() == nil && seenCtx.Err() != nil {
		return 0, nil
	}
	return pid, err
}

// release lets the held write go; it runs once, however often called.
func (h *writeHold) release() {
	h.once.Do(func() {
		if h.lock == nil {
			return
		}
		// Closing the connection ends its session, which releases the lock
		// even when the unlock could not be sent.
		_, _ = h.lock.Exec(context.Background(), `SELECT pg_advisory_unlock($1::int4, $2::int4)`, writeHoldClass, h.objid)
		h.lock.Release()
	})
}

// remove lets the held write go and drops the triggers, so that the checks
// after this one meet the strategy's schema as it made it.
func (h *writeHold) remove() error {
	h.release()
	return h.namingTrigger.remove()
}

// removeOrReport is remove for a defer: an error fails the check.
func (h *writeHold) removeOrReport(t tester) {
	if err := h.remove(); err != nil {
		t.Errorf("%v", err)
	}
}

// removeOrReport is remove for a defer: an error fails the check.
func (h *namingTrigger) removeOrReport(t tester) {
	if err := h.remove(); err != nil {
		t.Errorf("%v", err)
	}
}

// remove drops the triggers.
func (h *namingTrigger) remove() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.dropTriggers(ctx); err != nil {
		return fmt.Errorf("drop the triggers on writes naming %q: %w", h.key, err)
	}
	return nil
}

func (h *namingTrigger) dropTriggers(ctx context.Context) error {
	if len(h.tables) == 0 {
		return nil
	}
	return pgx.BeginFunc(ctx, h.admin, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '30s'`); err != nil {
			return err
		}
		for _, tb := range h.tables {
			if _, err := tx.Exec(ctx, `DROP TRIGGER IF EXISTS kit_writes_naming ON `+tb); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, fmt.Sprintf(`DROP FUNCTION IF EXISTS %s.kit_writes_naming()`, pgx.Identifier{h.schema}.Sanitize()))
		return err
	})
}

// failWritesNaming makes every write that names key fail with SQLSTATE
// code (a namingTrigger) until the trigger is removed: with moves, the
// updates of rows that named it already too.
func failWritesNaming(ctx context.Context, admin *pgxpool.Pool, key, code string, moves bool) (*namingTrigger, error) {
	mode := "fail"
	if moves {
		mode = "fail-any"
	}
	tr, err := installNamingTrigger(ctx, admin, key, mode, code)
	if err != nil {
		return nil, fmt.Errorf("fail writes naming %q: %w", key, err)
	}
	return tr, nil
}

// failOnce is failOnceAtCommit's trigger and its sequence.
type failOnce struct {
	*namingTrigger
	seq string
}

// failOnceSeq numbers the sequences of failOnceAtCommit in this process.
var failOnceSeq atomic.Int32

// failOnceAtCommit makes the COMMIT of the first transaction that writes a
// row naming key (an insert of it, or an update of a row that names it)
// fail with a serialization failure (40001), as SERIALIZABLE's check at
// commit can; the transactions after it commit. The caller defers remove.
func failOnceAtCommit(ctx context.Context, admin *pgxpool.Pool, key string) (*failOnce, error) {
	f := &failOnce{namingTrigger: &namingTrigger{key: key, admin: admin, atCommit: true}}
	err := pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
		var schema string
		if err := tx.QueryRow(ctx, `SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'
			ORDER BY format('%I.%I', n.nspname, c.relname) LIMIT 1`).Scan(&schema); errors.Is(err, pgx.ErrNoRows) {
			return errNoTables
		} else if err != nil {
			return err
		}
		f.seq = pgx.Identifier{schema, fmt.Sprintf("kit_fail_once_%d_%d", time.Now().UnixNano()%1e9, failOnceSeq.Add(1))}.Sanitize()
		if _, err := tx.Exec(ctx, `CREATE SEQUENCE `+f.seq); err != nil {
			return fmt.Errorf("create the sequence: %w", err)
		}
		if _, err := tx.Exec(ctx, `GRANT USAGE, UPDATE ON SEQUENCE `+f.seq+` TO PUBLIC`); err != nil {
			return fmt.Errorf("grant the sequence: %w", err)
		}
		return f.install(tx, []string{"fail-once", f.seq})
	})
	if err != nil {
		return nil, fmt.Errorf("fail the first commit naming %q: %w", key, err)
	}
	return f, nil
}

// remove drops the triggers, then the sequence.
func (f *failOnce) remove() error {
	if err := f.namingTrigger.remove(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := f.admin.Exec(ctx, `DROP SEQUENCE IF EXISTS `+f.seq); err != nil {
		return fmt.Errorf("drop the sequence of the first commit naming %q: %w", f.key, err)
	}
	return nil
}

// skipWritesOrSkip is skipWritesNaming for a check, as holdWritesOrSkip.
func skipWritesOrSkip(ctx context.Context, t tester, admin *pgxpool.Pool, key string) *namingTrigger {
	t.Helper()
	tr, err := skipWritesNaming(ctx, admin, key)
	if errors.Is(err, errNoTables) {
		t.Skip("the strategy keeps no tables in PostgreSQL: no write to skip")
	} else if err != nil {
		t.Fatalf("%v", err)
	}
	return tr
}

// skipWritesNaming makes every write that names key, and whose row did not
// name it before, do nothing (a namingTrigger) until the trigger is
// removed.
func skipWritesNaming(ctx context.Context, admin *pgxpool.Pool, key string) (*namingTrigger, error) {
	tr, err := installNamingTrigger(ctx, admin, key, "skip")
	if err != nil {
		return nil, fmt.Errorf("skip writes naming %q: %w", key, err)
	}
	return tr, nil
}
