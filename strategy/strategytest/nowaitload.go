package strategytest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// Sizes of checkNoWaitUnderLoad: enough callers that a lock of the
// strategy's own, held by one request, has others queued behind it at
// nearly every probe.
const (
	noWaitLoadCallers  = 16
	noWaitLoadRequests = 240
)

// sqlBlockedInDatabase describes one backend of database $1 that waits for
// a lock another backend holds (pg_blocking_pids) that is not a row's (a
// row lock is a transactionid or a tuple lock while it is waited for) nor
// a file's (extend, page: a table grown by two inserts at once), or no
// row.
const sqlBlockedInDatabase = `
	SELECT a.wait_event_type || '/' || a.wait_event, left(a.query, 120), l.locktype
	FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid AND NOT l.granted
	WHERE a.datname = $1 AND l.locktype NOT IN ('transactionid', 'tuple', 'extend', 'page')
	  AND cardinality(pg_blocking_pids(a.pid)) > 0
	LIMIT 1`

// checkNoWaitUnderLoad: a strategy that claims NoWait answers requests that
// compete only for stock (each a new key and a new user, one SKU with a
// unit for every one) without one waiting for another on a lock that is
// not a row's: 16 callers on two nodes send 240 requests while the kit
// reads pg_blocking_pids of every backend of the database until the last
// answer.
//
// checkNoWaitBehindLockedRows holds the strategy's rows from outside; a
// lock of the strategy's own that is not a row (an advisory lock, a LOCK
// TABLE) is seen only between its own requests (outsider round 50's m37:
// ssicount, which has no attempts held open, with an advisory lock taken
// before its count, passed every check). Row waits are left to that check:
// slotrows' claim, FOR UPDATE SKIP LOCKED, is seen here waiting on another
// claim's transaction about once in 40 probes, a wait PostgreSQL takes
// while it follows a row's update chain, not one slotrows asks for. The
// wait is read from the server, so a queue is told apart from slow answers
// without a timer.
func checkNoWaitUnderLoad(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sku := kitSKU("nowait-load")
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: sku, Total: noWaitLoadRequests}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	database := db.Config().ConnConfig.Database

	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		mu       sync.Mutex
		failures []string
	)
	for c := 0; c < noWaitLoadCallers; c++ {
		wg.Add(1)
		go func(node strategy.Strategy) {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > noWaitLoadRequests {
					return
				}
				req := strategy.Request{Key: fmt.Sprintf("kit-nowait-load-%d-%s", i, sku), User: fmt.Sprintf("kit-nowait-load-%d", i), SKU: sku, TTL: time.Hour}
				if _, err := node.Reserve(ctx, req); err == nil {
					continue // what it answered is other checks' to judge: a node's share may be spent (memquota)
				}
				mu.Lock()
				if len(failures) < 3 {
					failures = append(failures, fmt.Sprintf("Reserve %q (new key and user, a unit left for each): %v", req.Key, err))
				}
				mu.Unlock()
			}
		}(dep.Node(c % 2))
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	probes, waited := 0, ""
	for waited == "" {
		select {
		case <-done:
		default:
			var event, query, locktype string
			err := admin.QueryRow(ctx, sqlBlockedInDatabase, database).Scan(&event, &query, &locktype)
			switch {
			case err == pgx.ErrNoRows:
				probes++
				continue
			case err != nil:
				cancel()
				<-done
				t.Fatalf("read the lock waits: %v", err)
			}
			waited = fmt.Sprintf("a backend waited (%s, on an %s lock) in %q", event, locktype, query)
			continue
		}
		break
	}
	<-done
	for _, f := range failures {
		t.Errorf("%s", f)
	}
	if waited != "" {
		t.Errorf("%d callers, %d requests of new keys and users for one SKU with a unit each: %s after %d probes that saw none; a no-wait strategy's requests that compete only for stock never wait for one another",
			noWaitLoadCallers, noWaitLoadRequests, waited, probes)
	}
}

// checkNoWaitBesideCaseTwin: a strategy that claims NoWait answers a plain
// request for a SKU whose last unit an attempt held open took, without
// waiting for that attempt, when the request's key differs from the
// attempt's only in case (another user's). The two compete only for stock:
// the keys are different keys. A strategy that looks for a twin of the
// request in flight by a fold of its key (a lock or a hint hashed from
// lower(key)) waits for the attempt (outsider round 52's m05, memquota,
// whose node with no unit left probed the key's hint: it waited 3 s, to
// its deadline). The wait is read from pg_blocking_pids, as in
// checkNoWaitBehindLockedRows.
func checkNoWaitBesideCaseTwin(t tester, meta strategy.Meta, db, admin *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dep, opener, sku := openOneSKUForSessions(ctx, t, meta, db, rs, "nowait-twin", 1)
	defer dep.Close()
	held := strategy.Request{Key: "Kit-NoWait-Twin-" + sku, User: "kit-nowait-twin-1", SKU: sku, TTL: time.Hour}
	s, backends := holdInSession(ctx, t, opener, held, "Session.Reserve of the last unit of a SKU of 1")
	defer func() { _ = s.Rollback(context.Background()) }()
	req := strategy.Request{Key: strings.ToLower(held.Key), User: "kit-nowait-twin-2", SKU: sku, TTL: time.Hour}
	var box panicBox
	defer box.rethrow()
	done := reserveAsync(ctx, &box, dep.Node(0), req)
	waited, err := awaitAnswerOrBlockedByAny(ctx, admin, backends, done)
	_ = s.Rollback(ctx)
	a := <-done
	if err != nil {
		t.Fatalf("read the lock waits: %v", err)
	}
	if waited {
		t.Errorf("Reserve %q (another user's) waited for the attempt held open that took the SKU's last unit under key %q, which differs only in case, then answered %s, %v: a no-wait strategy must answer without waiting for another's uncommitted work (the keys are two keys)",
			req.Key, held.Key, a.res.Outcome, a.err)
	}
}
