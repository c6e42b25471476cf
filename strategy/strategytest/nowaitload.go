package strategytest

import (
	"context"
	"fmt"
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
