package bench

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Waits is what the database's client backends were doing during a trial,
// sampled from pg_stat_activity (and pg_locks) on a connection of its own
// to another database.
//
// Each backend is labelled by what it was doing at the sample:
//
//	CPU                  state active, no wait event: running or waiting for a core
//	Lock:transactionid   waiting for another transaction to end (a row it wants is locked)
//	Lock:tuple           queued behind another waiter for the same row
//	Lock:advisory        waiting for an advisory lock
//	IO:WALSync, LWLock:WALWrite, ...   committing: flushing WAL, or queued for the WAL flush
//	idle in transaction  inside a transaction, waiting for its client's next statement
//	idle                 connected, between transactions
type Waits struct {
	Samples int `json:"samples"`
	// Backends is the mean number of backends per sample under each label.
	Backends map[string]float64 `json:"backends"`
	// MaxBackends is the most client backends seen in one sample.
	MaxBackends int `json:"max_backends"`
	// HolderSamples is the number of lock-holder samples (every fourth
	// sample reads pg_locks, which is dearer).
	HolderSamples int `json:"holder_samples"`
	// Holders labels the backends that held a lock another backend of the
	// database was waiting for and were not themselves waiting for a lock:
	// the heads of the lock queues. Values are the mean number per holder
	// sample. On a hot row, "idle in transaction" here means the row lock
	// was held while its transaction waited for its client.
	Holders map[string]float64 `json:"holders"`
}

// Top returns the labels of m sorted by value, largest first.
func Top(m map[string]float64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	return keys
}

const sqlActivity = `
SELECT coalesce(state, ''), coalesce(wait_event_type, ''), coalesce(wait_event, ''), count(*)::int
FROM pg_stat_activity
WHERE datname = $1 AND backend_type = 'client backend'
GROUP BY 1, 2, 3`

// sqlHolders finds the backends holding a lock that another backend waits
// for (the same lock object, granted to one, not to the other), keeping
// those that are not waiting for a lock themselves: the head of each queue.
const sqlHolders = `
WITH heads AS (
    SELECT DISTINCT h.pid
    FROM pg_locks w
    JOIN pg_locks h ON h.granted AND NOT w.granted AND h.pid <> w.pid
        AND h.locktype = w.locktype
        AND h.database IS NOT DISTINCT FROM w.database
        AND h.relation IS NOT DISTINCT FROM w.relation
        AND h.page IS NOT DISTINCT FROM w.page
        AND h.tuple IS NOT DISTINCT FROM w.tuple
        AND h.virtualxid IS NOT DISTINCT FROM w.virtualxid
        AND h.transactionid IS NOT DISTINCT FROM w.transactionid
        AND h.classid IS NOT DISTINCT FROM w.classid
        AND h.objid IS NOT DISTINCT FROM w.objid
        AND h.objsubid IS NOT DISTINCT FROM w.objsubid
)
SELECT coalesce(a.state, ''), coalesce(a.wait_event_type, ''), coalesce(a.wait_event, ''), count(*)::int
FROM pg_stat_activity a JOIN heads USING (pid)
WHERE a.datname = $1 AND a.wait_event_type IS DISTINCT FROM 'Lock'
GROUP BY 1, 2, 3`

func label(state, waitType, event string) string {
	switch {
	case state == "active" && waitType == "":
		return "CPU"
	case state == "active":
		return waitType + ":" + event
	case state == "":
		return "unknown"
	}
	return state
}

// sampler samples pg_stat_activity every interval until stopped.
type sampler struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	w    Waits
}

func startSampler(ctx context.Context, dsn, database string, every time.Duration) (*sampler, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{}),
		w: Waits{Backends: map[string]float64{}, Holders: map[string]float64{}}}
	go func() {
		defer close(s.done)
		defer conn.Close(context.Background())
		t := time.NewTicker(every)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-s.stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			s.sample(ctx, conn, database, i%4 == 0)
		}
	}()
	return s, nil
}

func (s *sampler) sample(ctx context.Context, conn *pgx.Conn, database string, holders bool) {
	rows, err := conn.Query(ctx, sqlActivity, database)
	if err != nil {
		return
	}
	var state, typ, event string
	var n int
	total := 0
	counts := map[string]int{}
	_, err = pgx.ForEachRow(rows, []any{&state, &typ, &event, &n}, func() error {
		counts[label(state, typ, event)] += n
		total += n
		return nil
	})
	if err != nil {
		return
	}
	s.mu.Lock()
	s.w.Samples++
	for k, v := range counts {
		s.w.Backends[k] += float64(v)
	}
	if total > s.w.MaxBackends {
		s.w.MaxBackends = total
	}
	s.mu.Unlock()
	if !holders {
		return
	}
	rows, err = conn.Query(ctx, sqlHolders, database)
	if err != nil {
		return
	}
	counts = map[string]int{}
	_, err = pgx.ForEachRow(rows, []any{&state, &typ, &event, &n}, func() error {
		l := label(state, typ, event)
		if state != "active" && typ != "" && typ != "Client" {
			l += " (" + typ + ":" + event + ")"
		}
		counts[l] += n
		return nil
	})
	if err != nil {
		return
	}
	s.mu.Lock()
	s.w.HolderSamples++
	for k, v := range counts {
		s.w.Holders[k] += float64(v)
	}
	s.mu.Unlock()
}

// finish stops the sampler and returns the means per sample.
func (s *sampler) finish() *Waits {
	close(s.stop)
	<-s.done
	w := s.w
	if w.Samples > 0 {
		for k := range w.Backends {
			w.Backends[k] /= float64(w.Samples)
		}
	}
	if w.HolderSamples > 0 {
		for k := range w.Holders {
			w.Holders[k] /= float64(w.HolderSamples)
		}
	}
	return &w
}
