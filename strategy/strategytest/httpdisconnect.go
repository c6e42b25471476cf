package strategytest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/reservebench/reservebench/strategy"
)

// stateWait bounds how long the harness waits for a state it reads from
// the front's counters; a working front reaches each in milliseconds.
const stateWait = 20 * time.Second

// runHTTPDisconnect is C28-06: a client sends a whole POST /reserve on a
// raw socket and closes it without reading the answer; the server's work
// takes work_ms. Once admitted, the server must finish the request: a GET
// right after the close finds nothing committed (404 NOT_FOUND), polling
// then finds HELD, the same request again is 200 REPLAY, and one unit is
// taken.
//
// The seed closed the socket after 100 ms and let the 600 ms of work
// order the GET before the commit. The harness makes that order certain:
// it closes once the request is inside the work wrapper, waits until the
// service has seen the client leave, makes its GET, and only then opens
// the latch the work waits on; the work_ms follow.
func runHTTPDisconnect(ctx context.Context, t *trial) error {
	in := t.in
	f, err := t.startFront(frontOptions{limits: in.limits(), delay: millis(in.WorkMs), latched: true})
	if err != nil {
		return err
	}
	defer f.close() //nolint:errcheck // closed below; this is for the error paths
	req := strategy.Request{Key: t.key("req-gone"), User: t.user("user-0042"), SKU: t.sku(in.Stock[0].SKU), TTL: time.Minute}
	before, err := t.audit(ctx)
	if err != nil {
		return err
	}

	conn, err := net.DialTimeout("tcp", f.addr, 5*time.Second)
	if err != nil {
		return err
	}
	op := Op{Process: "gone", Req: req, Invoke: t.hist.Begin()}
	if _, err := conn.Write(rawPost("application/x-www-form-urlencoded", []byte(formBody(req)), -1)); err != nil {
		_ = conn.Close()
		return err
	}
	if err := until(ctx, stateWait, "the request reaches the strategy's wrapper", func() bool { e, _ := f.work.calls(req.Key); return e == 1 }); err != nil {
		_ = conn.Close()
		return err
	}
	_ = conn.Close()
	// The client never reads an answer: its outcome is unknown to it.
	t.hist.End(Op{Process: op.Process, Req: req, Invoke: op.Invoke, Kind: "reserve", Type: OpInfo, Err: "the client closed its connection"})
	if err := until(ctx, stateWait, "the service sees its client leave", func() bool { return f.svc.Stats().ClientLeftRunning == 1 }); err != nil {
		return err
	}
	right, err := f.get(ctx, req.Key)
	if err != nil {
		return fmt.Errorf("GET right after the close: %w", err)
	}
	close(f.work.latch)

	// Poll until the work has returned, then once more: the answer after
	// that is final.
	var polled httpAnswer
	polls := 0
	for {
		_, returned := f.work.calls(req.Key)
		polled, err = f.get(ctx, req.Key)
		polls++
		if err != nil {
			return fmt.Errorf("polling GET: %w", err)
		}
		if polled.Status == string(strategy.StatusHeld) || returned == 1 {
			break
		}
	}
	retryOp := Op{Process: "gone", Req: req, Invoke: t.hist.Begin()}
	retry, err := f.reserve(ctx, req)
	t.hist.End(httpOp(retryOp, retry, err))
	if err != nil {
		return fmt.Errorf("the retry: %w", err)
	}
	st := f.svc.Stats()
	if err := f.close(); err != nil {
		return err
	}
	after, err := t.audit(ctx)
	if err != nil {
		return err
	}
	sku := req.SKU
	taken := before[sku].Available - after[sku].Available

	t.fact("GET right after the close", "%v", right)
	t.fact("polling GET", "%s", polled.Status)
	t.fact("the same request again", "%v", retry)
	t.fact("units taken", "%d", taken)
	t.vary("polls until HELD", polls)
	t.check(Base, "the service counts the client that left while its request ran", st.ClientLeftRunning == 1,
		fmt.Sprintf("client_left_running = %d", st.ClientLeftRunning))
	t.check(Base, "a GET right after the close finds nothing committed yet (404 NOT_FOUND)",
		right.code == http.StatusNotFound && right.Status == string(strategy.StatusNotFound), fmt.Sprintf("got %v", right))
	t.check(Base, "an admitted request runs to its end after its client left: polling finds HELD",
		polled.code == http.StatusOK && polled.Status == string(strategy.StatusHeld), fmt.Sprintf("got %v after the work returned", polled), req.Key)
	t.check(Base, "the same request again is 200 REPLAY of the HELD reservation",
		retry.code == http.StatusOK && retry.Outcome == string(strategy.OutcomeReplay) && retry.Reservation != nil && retry.Reservation.Status == string(strategy.StatusHeld),
		fmt.Sprintf("got %v", retry), req.Key)
	t.check(strategy.IdempotentKey, "one unit is taken", taken == 1, fmt.Sprintf("%d units taken", taken))
	return nil
}
