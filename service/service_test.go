package service_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/admission"
	_ "github.com/reservebench/reservebench/hotrow" // the strategy the tests serve
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/service"
	"github.com/reservebench/reservebench/strategy"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// served is the service over hotrow on a loopback socket, stopped (and
// checked to listen no more) when the test ends.
type served struct {
	base  string
	svc   *service.Service
	admin *pgxpool.Pool
}

func serve(t *testing.T, node func(strategy.Strategy) strategy.Strategy, limits admission.Limits, stock int) *served {
	t.Helper()
	ctx := context.Background()
	db, admin := pgtest.Pools(t)
	meta, ok := strategy.Lookup("hotrow")
	require.True(t, ok)
	dep, err := meta.Open(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: "sku-lab-01", Total: stock}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = dep.Close() })
	n := dep.Node(0)
	if node != nil {
		n = node(n)
	}
	gate, err := admission.New(n, limits)
	require.NoError(t, err)
	svc, err := service.New(service.Config{Strategy: n, Name: "hotrow", Admission: gate})
	require.NoError(t, err)
	return &served{base: listen(t, svc), svc: svc, admin: admin}
}

// listen serves svc on a loopback socket until the test ends, then drains
// it, shuts it down and checks that nothing listens there any more. It
// returns the base URL.
func listen(t *testing.T, svc *service.Service) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := svc.Server(service.DefaultTimeouts)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	addr := ln.Addr().String()
	t.Cleanup(func() {
		svc.Drain()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, srv.Shutdown(ctx))
		require.ErrorIs(t, <-done, http.ErrServerClosed)
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			t.Errorf("something still listens on %s", addr)
		}
	})
	return "http://" + addr
}

type reply struct {
	code       int
	retryAfter string
	allow      string
	body       map[string]any
}

func do(t *testing.T, method, url, contentType, body string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	r := reply{code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), allow: resp.Header.Get("Allow")}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		require.NoError(t, json.Unmarshal(b, &r.body), "%s", b)
	}
	return r
}

func reserve(t *testing.T, s *served, key, user string) reply {
	t.Helper()
	v := url.Values{"request_key": {key}, "user": {user}, "sku": {"sku-lab-01"}, "ttl_ms": {"60000"}}
	return do(t, http.MethodPost, s.base+"/reserve", "application/x-www-form-urlencoded", v.Encode())
}

// TestSeedCodes walks seed 000's API: each outcome with its status code.
func TestSeedCodes(t *testing.T) {
	s := serve(t, nil, admission.Limits{InFlight: 4, Queue: 8, Wait: 400 * time.Millisecond}, 2)
	expect := func(r reply, code int, field, value string) {
		t.Helper()
		require.Equal(t, code, r.code, "%v", r.body)
		require.Equal(t, value, r.body[field], "%v", r.body)
	}
	expect(reserve(t, s, "req-0001", "user-0042"), 201, "outcome", "HELD")
	expect(reserve(t, s, "req-0001", "user-0042"), 200, "outcome", "REPLAY")
	expect(reserve(t, s, "req-0001", "user-0043"), 422, "outcome", "KEY_REUSED")
	expect(reserve(t, s, "req-0002", "user-0042"), 409, "outcome", "USER_LIMIT")
	expect(reserve(t, s, "req-0003", "user-0043"), 201, "outcome", "HELD")
	expect(reserve(t, s, "req-0004", "user-0044"), 409, "outcome", "SOLD_OUT")
	expect(do(t, "POST", s.base+"/reserve", "application/json", `{"request_key":"req-0005","user":"user-0045","sku":"nobody-sells","ttl_ms":60000}`), 400, "field", "sku")
	expect(do(t, "GET", s.base+"/reservations/req-0001", "", ""), 200, "status", "HELD")
	expect(do(t, "GET", s.base+"/reservations/req-none", "", ""), 404, "status", "NOT_FOUND")
	expect(do(t, "POST", s.base+"/reservations/req-0001/confirm", "", ""), 200, "status", "CONFIRMED")
	expect(do(t, "POST", s.base+"/reservations/req-0001/confirm", "", ""), 409, "status", "CONFIRMED")
	expect(do(t, "POST", s.base+"/reservations/req-0003/release", "", ""), 200, "status", "RELEASED")
	expect(do(t, "POST", s.base+"/reservations/req-0003/release", "", ""), 409, "status", "RELEASED")
	expect(do(t, "POST", s.base+"/reservations/req-none/release", "", ""), 404, "status", "NOT_FOUND")
	wrong := do(t, "DELETE", s.base+"/reservations/req-0001", "", "")
	expect(wrong, 405, "outcome", "METHOD_NOT_ALLOWED")
	require.Equal(t, "GET, HEAD", wrong.allow)
	expect(do(t, "GET", s.base+"/reserve", "", ""), 405, "outcome", "METHOD_NOT_ALLOWED")
	expect(do(t, "POST", s.base+"/reservations", "", ""), 404, "outcome", "NO_SUCH_ROUTE")
	st := do(t, "GET", s.base+"/status", "", "")
	require.Equal(t, 200, st.code)
	require.Equal(t, "hotrow", st.body["strategy"])
	require.EqualValues(t, 4, st.body["in_flight_limit"])
}

// onlyCore hides every optional interface of a node.
type onlyCore struct{ strategy.Strategy }

// TestNotSupported: a strategy without Confirmer or Releaser answers those
// endpoints 404 NOT_SUPPORTED, naming what is missing.
func TestNotSupported(t *testing.T) {
	s := serve(t, func(n strategy.Strategy) strategy.Strategy { return onlyCore{n} }, admission.Limits{InFlight: 1}, 1)
	for _, what := range []string{"confirm", "release"} {
		r := do(t, "POST", s.base+"/reservations/req-0001/"+what, "", "")
		require.Equal(t, 404, r.code)
		require.Equal(t, "NOT_SUPPORTED", r.body["outcome"])
		require.Contains(t, r.body["error"], "strategy.")
	}
}

// TestDrain: requests admitted before Drain run to their end; a queued one
// and a new one get 503 REJECTED_SHUTTING_DOWN without touching the
// database. The admitted requests are held by a lock on the stock row, and
// the test waits for them in pg_stat_activity, not on a clock.
func TestDrain(t *testing.T) {
	s := serve(t, nil, admission.Limits{InFlight: 2, Queue: 2, Wait: time.Minute, RetryAfter: time.Second}, 10)
	ctx := context.Background()
	tx, err := s.admin.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `SELECT * FROM sku_stock WHERE sku = 'sku-lab-01' FOR UPDATE`)
	require.NoError(t, err)

	var wg sync.WaitGroup
	replies := make([]reply, 3)
	for i := range replies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i] = reserve(t, s, "req-drain-"+string(rune('a'+i)), "user-drain-"+string(rune('a'+i)))
		}()
	}
	require.Eventually(t, func() bool {
		var n int
		err := s.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n == 2 && s.svc.Stats().Waiting == 1
	}, 20*time.Second, time.Millisecond, "two requests blocked on the row lock, one queued")
	s.svc.Drain()
	late := reserve(t, s, "req-late", "user-late")
	require.Equal(t, 503, late.code)
	require.Equal(t, "REJECTED_SHUTTING_DOWN", late.body["outcome"])
	require.Equal(t, "1", late.retryAfter)
	require.Eventually(t, func() bool { return s.svc.Stats().Waiting == 0 }, 20*time.Second, time.Millisecond)
	require.NoError(t, tx.Rollback(ctx))
	wg.Wait()
	codes := map[int]int{}
	for _, r := range replies {
		codes[r.code]++
	}
	require.Equal(t, map[int]int{201: 2, 503: 1}, codes, "%v", replies)
	var rows int
	require.NoError(t, s.admin.QueryRow(ctx, `SELECT count(*) FROM reservation`).Scan(&rows))
	require.Equal(t, 2, rows)
	require.EqualValues(t, 2, s.svc.Stats().RefusedDraining)
}
