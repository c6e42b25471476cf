package strategytest

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/reservebench/reservebench/strategy"
)

// maxAttempts bounds a C28-05 client's retries: far above what a working
// front needs (the seed's clients averaged 8), low enough that a front
// that never admits ends the trial.
const maxAttempts = 500

// runHTTPAdmission is C28-05: admission at the HTTP entry. Requests
// clients arrive at once, each with a key of its own; the gate admits
// in_flight at once with queue waiting up to wait_ms; each admitted request
// does work_ms of extra work before the strategy. A client answered 503
// waits attempt * backoff_ms and sends the same request again, until 201
// or 409. Every client must end with 201 or 409, the units sold must be
// the stock, each client admitted exactly once, never more than in_flight
// in the strategy or queue waiting, and every 503 counted by the gate.
func runHTTPAdmission(ctx context.Context, t *trial) error {
	in := t.in
	f, err := t.startFront(frontOptions{limits: in.limits(), delay: millis(in.WorkMs), clients: in.Requests})
	if err != nil {
		return err
	}
	sku := t.sku(in.Stock[0].SKU)
	n := t.scaled(in.Requests)
	var (
		mu                  sync.Mutex
		final               = map[int]int{} // status -> clients
		all503, first503    atomic.Int64
		noRetryAfter, other []string
	)
	Together(n, func(i int) {
		req := strategy.Request{Key: t.key(fmt.Sprintf("req-%04d", i)), User: t.user(fmt.Sprintf("user-%04d", i)), SKU: sku, TTL: time.Minute}
		proc := fmt.Sprintf("c%d", i)
		for attempt := 1; ; attempt++ {
			op := Op{Process: proc, Req: req, Invoke: t.hist.Begin()}
			a, err := f.reserve(ctx, req)
			if err == nil && a.code == http.StatusServiceUnavailable && attempt < maxAttempts {
				all503.Add(1)
				if attempt == 1 {
					first503.Add(1)
				}
				if a.retryAfter != "1" {
					mu.Lock()
					noRetryAfter = append(noRetryAfter, fmt.Sprintf("%s: Retry-After %q", t.plain(req.Key), a.retryAfter))
					mu.Unlock()
				}
				// The seed's client: back off 20 ms more each time, then
				// the same request again.
				time.Sleep(time.Duration(attempt) * millis(in.BackoffMs))
				continue
			}
			t.hist.End(httpOp(op, a, err))
			mu.Lock()
			final[a.code]++
			if err != nil || (a.code != http.StatusCreated && a.code != http.StatusConflict) {
				other = append(other, fmt.Sprintf("%s after %d attempts: %v %v", t.plain(req.Key), attempt, a, err))
			}
			mu.Unlock()
			return
		}
	})
	st := f.svc.Stats()
	g := st.Gate
	if err := f.close(); err != nil {
		return err
	}
	total := in.Stock[0].Total
	admitted := g.Admitted + g.AdmittedAfterWait
	// The strategy's BUSY (a lock not granted within its wait) is a 503
	// too, given after admission, and its client sends the request again,
	// which reaches the strategy once more: counted apart, so that neither
	// the facts nor the checks below charge it to the gate (redislock's 3 s
	// lock wait ran out under the race detector beside a table run).
	busy := st.Answers[string(strategy.OutcomeBusy)]
	t.vary("503 answers: the strategy's BUSY", int(busy))
	admitted -= busy
	t.fact("final answers", "201 %d, 409 %d%s", final[http.StatusCreated], final[http.StatusConflict], otherCodes(final))
	t.fact("admitted", "%d, for %d clients", admitted, n)
	t.vary("503 answers", int(all503.Load()))
	t.vary("clients answered 503 at their first try", int(first503.Load()))
	t.vary("admitted after waiting", int(g.AdmittedAfterWait))
	t.vary("rejected: queue full", int(g.RejectedQueueFull))
	t.vary("rejected: wait timeout", int(g.RejectedTimeout))
	t.vary("most in the strategy at once", int(f.work.maxInFlight.Load()))
	t.vary("most waiting at once (gate)", int(g.MaxWaiting))

	sort.Strings(other)
	t.check(Base, "every client ends with 201 or 409", len(other) == 0, fmt.Sprintf("%d clients did not: %s", len(other), sample(other)))
	t.check(strategy.NoOversell, "201 answers never exceed the stock", final[http.StatusCreated] <= total,
		fmt.Sprintf("201 x%d for %d units", final[http.StatusCreated], total))
	t.check(strategy.NoPhantomSoldOut, "every unit is sold: 201 answers equal the stock", final[http.StatusCreated] >= min(total, n),
		fmt.Sprintf("201 x%d for %d units and %d clients", final[http.StatusCreated], total, n))
	var twice []string
	var again int64
	for i := 0; i < n; i++ {
		e, _ := f.work.calls(t.key(fmt.Sprintf("req-%04d", i)))
		switch {
		case e == 0:
			twice = append(twice, fmt.Sprintf("req-%04d never reached the strategy", i))
		case e > 1:
			again += int64(e - 1)
			twice = append(twice, fmt.Sprintf("req-%04d reached the strategy %d times", i, e))
		}
	}
	t.check(Base, "each client is admitted exactly once: a 503 never reached the strategy", again == busy && int64(len(twice)) <= busy && admitted == int64(n),
		fmt.Sprintf("the gate admitted %d for %d clients; %s", admitted, n, sample(twice)))
	t.check(Base, "never more in the strategy at once than in_flight (counted by the harness)", f.work.maxInFlight.Load() <= int64(in.InFlight),
		fmt.Sprintf("%d at once, limit %d", f.work.maxInFlight.Load(), in.InFlight))
	t.check(Base, "never more waiting than queue (the gate's count)", g.MaxWaiting <= int64(in.Queue) && g.MaxInFlight <= int64(in.InFlight),
		fmt.Sprintf("gate saw %d waiting (limit %d), %d in flight (limit %d)", g.MaxWaiting, in.Queue, g.MaxInFlight, in.InFlight))
	t.check(Base, "every 503 is a refusal the gate counted, with Retry-After: 1", all503.Load() == g.RejectedQueueFull+g.RejectedTimeout+busy && len(noRetryAfter) == 0,
		fmt.Sprintf("clients saw %d 503s, the gate refused %d (queue full %d, wait timeout %d); %s", all503.Load(),
			g.RejectedQueueFull+g.RejectedTimeout, g.RejectedQueueFull, g.RejectedTimeout, sample(noRetryAfter)))
	return nil
}

func otherCodes(final map[int]int) string {
	var out []string
	for code, n := range final {
		if code != http.StatusCreated && code != http.StatusConflict {
			out = append(out, fmt.Sprintf("%d %d", code, n))
		}
	}
	sort.Strings(out)
	if len(out) == 0 {
		return ""
	}
	return ", " + strings.Join(out, ", ")
}

func millis(n int) time.Duration { return time.Duration(n) * time.Millisecond }
